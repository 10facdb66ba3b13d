"""The run path: how the check and generation run a stage under a precision plan
(`stage_run.running`: its components placed alone, under the plan's flags, with its watchers)
and what watches it (`watchers`: the timer, the stop, the record a stage leaves)."""

"""The run path: the stages the check and generation run, written once (`stages.Stages`), how
a stage runs under a precision plan (`stage_run.running`: its components placed alone, under
the plan's flags, with its watchers) and what watches it (`watchers`: the timer, the stop, the
record a stage leaves)."""

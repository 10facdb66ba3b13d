"""The run path: the stages the check and generation run, written once (`stages.Stages`), how
a stage runs under a precision plan (`stage_run.running`: its components placed alone, under
the plan's flags, with its watchers), and what watches it: the recorders, lean and full, and
the descent from one to the other (`probe`), the timer, the stop and the record a stage leaves
(`watchers`), the timing of a plan's steps (`timing`) and what it cost (`stage_cost`)."""

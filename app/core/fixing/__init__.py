"""What a failing part is and how it is fixed: the diagnosis engine (plans, candidate fixes,
their ranking), read from the run path's records (`run.probe`), and the fixes remembered per
model and device."""

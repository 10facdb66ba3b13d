"""What a failing part is and how it is fixed: the diagnosis engine (plans, candidate fixes, their ranking), the activation probes, and the fixes remembered per model and device."""

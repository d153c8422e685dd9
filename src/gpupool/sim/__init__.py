"""The trace-driven simulator: fill (the FGD paper's method) and replay experiments."""

"""The clock: read by the live driver only; the core is given times."""

"""Trace replay and fill experiments: jobs from public traces, through the core's policies."""

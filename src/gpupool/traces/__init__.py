"""Readers for public GPU-cluster and LLM-serving traces.

Every reader raises TraceFormatError (file, line, problem) on a malformed row, and counts
rows it cannot use in a ReadReport instead of dropping them silently.
"""

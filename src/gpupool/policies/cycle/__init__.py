"""Cycle policies: once per scheduling cycle, look at the whole queue and return a plan
(`Start`, `Preempt`, `Claim`) that the core validates before applying it.
"""

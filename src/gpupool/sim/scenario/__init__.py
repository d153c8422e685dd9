"""Scenario simulation: a cluster, teams and a workload in YAML, run through the decision
core in a simulated world (`world.py`) that models runtimes, power, heat and checkpoints.
"""

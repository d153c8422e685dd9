"""Scenario simulation: a cluster, teams and a workload in YAML, run through the decision
core in a simulated world that models runtimes, power, heat and checkpoints.

Contract: `load_scenario` (config.py) reads a file into a ScenarioConfig whose scheduling
section is the core's own SchedulerConfig; `run_scenario` (runner.py) builds its workload
(generators/), steps the world (world.py) to the horizon and returns its summary
(summary.py), decision log and, on request, the monthly review's record
(review_source.py). The world only reports what happened to the core and carries out its
commands. To model something new in the world, add its model as a module here and call it
from world.py's step; to report it, read it in summary.py, which never changes the world.
"""

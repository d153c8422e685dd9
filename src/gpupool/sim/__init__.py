"""The simulator: drivers of the decision core that run in simulated time.

Contract: a simulator feeds the core the events the live service would (gpupool.scheduler
events) and carries out its commands in a model of the world; it decides nothing itself,
so a policy measured here is the policy the server runs. Only the simulator and the
command line import it; it imports no server module. Add a simulator as a module here
(eventsim.py: event lists and traces straight into the core) or a package for a family
(replay/: trace replay and fill experiments; scenario/: YAML scenarios in a modelled world).
"""

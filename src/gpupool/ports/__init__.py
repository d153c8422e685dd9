"""The ports below both drivers: what the live server and the simulator's world implement
alike, so the drivers stay siblings.

Each port is a package whose `base.py` states the contract (what a call may block on,
what it returns, how errors come back); real implementations live with the server
(`gpupool.server.executors`, `gpupool.server.telemetry`, `gpupool.server.fleet`),
fakes beside the contract, and the simulator's `SimulatedFleet` implements them over its
world.
"""

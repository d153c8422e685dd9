"""The cloud port: what the live driver needs of the machines beyond its own, to burst.

`base.py` states the contract: `CloudNode` (a node a cloud site can start on demand), the
`NodeProbe` that lists the nodes alive now, and the `CommandRunner` that runs a node's
start and stop commands without waiting for them. The server implements them with
processes and Ray (`gpupool.server.fleet`); the simulator's `SimulatedFleet` implements
them over its world. To add a cloud: give the sites file its start and stop commands, or
implement `CommandRunner` and `NodeProbe` over its API.
"""

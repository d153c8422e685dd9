"""The fleet beyond this machine: sites (`sites.py`: which site each node is in, and the
cloud nodes' start and stop commands) and the command a cloud node runs to join
(`cloud_node.py`). The contract of a cloud is `gpupool.ports.cloud.base` (CloudNode,
NodeProbe, CommandRunner); to add a kind of cloud, implement those there.
"""

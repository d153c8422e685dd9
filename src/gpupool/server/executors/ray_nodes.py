"""The gpupool nodes of a Ray cluster: what a Ray node declares to join gpupool's pool
(`node_resources`: its name, GPU model, site and one resource per GPU index) and how the
server reads them back (`ray_nodes`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NODE_PREFIX = "gpupool_node_"
MODEL_PREFIX = "gpupool_model_"
SITE_PREFIX = "gpupool_site_"
LABEL_PREFIX = "gpupool_label_"
"""`gpupool_label_<key>_<value>`: a node label (keys have no `_`, so the first one splits)."""


def label_resource(key: str, value: str) -> str:
    return f"{LABEL_PREFIX}{key}_{value}"


def labels_of(resources: Mapping[str, float]) -> tuple[tuple[str, str], ...]:
    """A Ray node's labels, read back from its label resources, sorted by key."""
    pairs = (k[len(LABEL_PREFIX) :].partition("_") for k in resources if k.startswith(LABEL_PREFIX))
    return tuple(sorted((key, value) for key, _, value in pairs if key and value))


def gpu_resource(node: str, index: int) -> str:
    """The custom resource that stands for GPU `index` of gpupool node `node`."""
    return f"gpupool_{node}_gpu{index}"


def node_resources(node: str, model: str, gpu_count: int, site: str = "") -> dict[str, float]:
    """What a Ray node must declare (``ray start --resources``) to join gpupool's pool;
    `site` names its cluster when the service places across several."""
    res = {f"{NODE_PREFIX}{node}": 1.0, f"{MODEL_PREFIX}{model}": 1.0}
    if site:
        res[f"{SITE_PREFIX}{site}"] = 1.0
    res.update({gpu_resource(node, i): 1.0 for i in range(gpu_count)})
    return res


@dataclass(frozen=True)
class RayNode:
    """One live Ray node that declared itself a gpupool node."""

    ray_node_id: str
    name: str
    model: str
    gpu_count: int
    site: str = ""
    address: str = ""
    """Ray's NodeManagerAddress: where the node's processes are reached."""
    labels: tuple[tuple[str, str], ...] = ()
    """Where it sits in the network (`gpupool node join --label rack=r1`)."""


def ray_nodes() -> list[RayNode]:
    """The live nodes of the connected Ray cluster that declare ``gpupool_node_<name>``,
    with their GPU model (``gpupool_model_<model>``) and GPU count (``gpupool_<name>_gpu<i>``)."""
    import ray

    ray_api: Any = ray  # ray.nodes() is untyped
    found: list[RayNode] = []
    for entry in ray_api.nodes():
        if not entry.get("Alive"):
            continue
        res: Mapping[str, float] = entry.get("Resources") or {}
        names = [k[len(NODE_PREFIX) :] for k in res if k.startswith(NODE_PREFIX)]
        if len(names) != 1:
            continue
        name = names[0]
        models = sorted(k[len(MODEL_PREFIX) :] for k in res if k.startswith(MODEL_PREFIX))
        prefix = f"gpupool_{name}_gpu"
        count = sum(1 for k in res if k.startswith(prefix) and k[len(prefix) :].isdigit())
        sites = sorted(k[len(SITE_PREFIX) :] for k in res if k.startswith(SITE_PREFIX))
        found.append(
            RayNode(
                str(entry["NodeID"]),
                name,
                models[0] if models else "",
                count,
                sites[0] if sites else "",
                str(entry.get("NodeManagerAddress") or ""),
                labels_of(res),
            )
        )
    return sorted(found, key=lambda n: n.name)


# --------------------------------------------------------------------------- executor

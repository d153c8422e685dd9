"""A sites file for two regions and a cloud site, a fast burst rule, and a runner that
records the cloud start/stop commands: shared by the sites and admission tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FED = {
    "sites": [
        {"name": "east", "region": "us-east"},
        {"name": "west", "region": "us-west"},
        {
            "name": "cloud",
            "region": "us-east",
            "kind": "cloud",
            "price_usd_per_gpu_hour": {"H100": 6.98},
        },
    ],
    "data": [
        {"name": "corpus-east", "region": "us-east"},
        {"name": "corpus-west", "region": "us-west"},
    ],
    "links": [{"a": "us-east", "b": "us-west", "bandwidth_gbps": 1, "latency_ms": 85}],
}
CLOUD = {
    "start": "start-node {node} {model} {gpus} {site}",
    "stop": ["stop-node", "{node}"],
    "nodes": [{"name": "c1", "site": "cloud", "model": "H100", "gpus": 4}],
}
FAST = {
    "util_threshold": 0.9,
    "sustain_s": 10,
    "pending_gpus": 1,
    "pending_sustain_s": 10,
    "reclaim_util": 0.3,
    "reclaim_sustain_s": 20,
    "check_s": 1,
    "join_timeout_s": 60,
}


def sites(**extra: Any) -> dict[str, Any]:
    return {"federation": FED, "nodes": {"e1": "east", "w1": "west"}, **extra}


class Runner:
    def __init__(self, code: int | None = 0) -> None:
        self.calls: list[list[str]] = []
        self.code = code

    def start(self, argv: Sequence[str], log: Path) -> Callable[[], int | None]:
        self.calls.append(list(argv))
        return lambda: self.code

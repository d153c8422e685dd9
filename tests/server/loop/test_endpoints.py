"""Where replicas listen (server/loop/endpoints.py): the --config network: section, the port
choice on the server's own addresses (a real probe on 127.0.0.2) and on another machine's
(the configured range, skipping the ports the server's replicas hold), the executors'
node addresses (Ray's with a fake `ray.nodes()`), and the example replica that binds its
host and exits clearly when its port is taken."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupool.errors import SpecError
from gpupool.examples import chat_replica
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.server.executors.local import LocalExecutor
from gpupool.server.loop.config import LIVE_DEFAULTS
from gpupool.server.loop.endpoints import (
    NetworkConfig,
    ReplicaPorts,
    held_at,
    is_own,
    load_network,
    node_address,
    parse_network,
    probe_port,
)
from gpupool.server.main import load_service_config
from gpupool.server.telemetry.replica_load import Endpoint

OTHER = "192.0.2.10"
"""TEST-NET-1: never an address of this machine."""


def test_network_section_parsed_and_checked(tmp_path: Path) -> None:
    assert parse_network(None, "f") == NetworkConfig("127.0.0.1", (20000, 29999))
    got = parse_network({"node_address": "10.0.0.5", "replica_ports": "31000-31009"}, "f")
    assert got == NetworkConfig("10.0.0.5", (31000, 31009))
    assert parse_network({"node_address": "::1"}, "f").node_address == "::1"
    for bad, match in (
        ({"node_address": "node-a"}, "not an IP address"),
        ({"node_address": "0.0.0.0"}, "not a wildcard"),
        ({"replica_ports": "30000-20000"}, "FIRST-LAST"),
        ({"replica_ports": "80-90"}, "FIRST-LAST"),
        ({"replica_ports": "a-b"}, "FIRST-LAST"),
        ({"port": 1}, "unknown key"),
    ):
        with pytest.raises(SpecError, match=match):
            parse_network(bad, "f")
    path = tmp_path / "service.yaml"
    path.write_text("network: {node_address: 127.0.0.2}\nteams: [{name: web}]\n")
    assert load_network(path).node_address == "127.0.0.2"
    # the scheduling reader lets the section through and still reads the rest
    assert [t.team for t in load_service_config(path, LIVE_DEFAULTS).teams] == ["web"]
    assert load_network(None) == NetworkConfig()


def test_own_addresses_are_probed_for_a_free_port() -> None:
    assert is_own("127.0.0.2") and not is_own(OTHER)
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        taken = held.getsockname()[1]
        ports = ReplicaPorts((20000, 20009))
        for _ in range(20):
            port = ports.choose("127.0.0.2", {taken})
            assert port != taken and not 20000 <= port <= 20009
            with socket.socket() as check:  # free there now
                check.bind(("127.0.0.2", port))
    with pytest.raises(OSError, match="no free port"):
        probe_port("127.0.0.2", set(range(65536)), tries=3)


def test_another_machines_ports_come_from_the_range_in_turn() -> None:
    ports = ReplicaPorts((20000, 20003))
    assert [ports.choose(OTHER, set()) for _ in range(5)] == [20000, 20001, 20002, 20003, 20000]
    # the ports its replicas hold there are skipped; another address has its own turn
    assert ports.choose(OTHER, {20001, 20002}) == 20003
    assert ports.choose("192.0.2.11", set()) == 20000
    with pytest.raises(OSError, match=r"every port of network\.replica_ports 20000-20003"):
        ports.choose(OTHER, {20000, 20001, 20002, 20003})
    held = {"1": Endpoint(OTHER, 20000), "2": Endpoint("192.0.2.11", 20001)}
    assert held_at(OTHER, held) == {20000}


def test_executors_give_their_nodes_addresses() -> None:
    assert node_address(object(), "n", "127.0.0.3") == "127.0.0.3"
    fake = FakeExecutor(addresses={"a": OTHER})
    assert node_address(fake, "a", "x") == OTHER
    assert node_address(fake, "b", "x") == "127.0.0.1"
    local = LocalExecutor(cgroups=None, address="127.0.0.2")
    assert node_address(local, "h/A100-80GB", "127.0.0.1") == "127.0.0.2"


def test_ray_nodes_carry_their_node_manager_address(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    from gpupool.server.executors.ray import RayExecutor
    from gpupool.server.executors.ray_nodes import ray_nodes

    entries: list[dict[str, Any]] = [
        {
            "NodeID": "r1",
            "Alive": True,
            "NodeManagerAddress": "10.0.0.5",
            "Resources": {"gpupool_node_a": 1.0, "gpupool_model_A100-80GB": 1.0},
        },
        {
            "NodeID": "r2",
            "Alive": True,
            "NodeManagerAddress": "10.0.0.6",
            "Resources": {"gpupool_node_b": 1.0},
        },
        {"NodeID": "r0", "Alive": False, "NodeManagerAddress": "10.0.0.9", "Resources": {}},
    ]
    calls = [0]

    def nodes() -> list[dict[str, Any]]:
        calls[0] += 1
        return entries

    monkeypatch.setattr(ray, "nodes", nodes)
    assert [(n.name, n.address) for n in ray_nodes()] == [("a", "10.0.0.5"), ("b", "10.0.0.6")]
    ex = RayExecutor()  # no nodes named: no launcher is started
    assert ex.node_address("a") == "10.0.0.5"
    looked = calls[0]
    assert ex.node_address("a") == "10.0.0.5" and calls[0] == looked  # remembered
    # the node rejoined as another Ray node on another machine: looked up again
    entries[0] = {**entries[0], "NodeID": "r3", "NodeManagerAddress": "10.0.0.7"}
    ex.remember_node("a", "r3")
    assert ex.node_address("a") == "10.0.0.7"
    with pytest.raises(SpecError, match="node c is not in the Ray cluster"):
        ex.node_address("c")


def test_the_example_replica_binds_its_host_and_says_when_its_port_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setenv("PORT", str(port))
        monkeypatch.setenv(chat_replica.HOST_ENV, "127.0.0.2")
        proc = subprocess.run(
            [sys.executable, "-m", "gpupool.examples.chat_replica"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert proc.returncode == 3
    assert f"127.0.0.2:{port} is taken by another process" in proc.stderr

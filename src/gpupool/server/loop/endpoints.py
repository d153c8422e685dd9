"""Where a service's replicas listen: their node's address and a port (docs/services.md).

Each node has an address: the local executor's is the server's own node address (the
--config file's `network: {node_address: ...}`, 127.0.0.1 by default), a Ray node's is
Ray's `NodeManagerAddress` (`Executor.node_address`, see gpupool.ports.executor.base).
A replica is told both: its port in the service's port variable, its address in
`GPUPOOL_REPLICA_HOST`; the scraper and the URLs the services view gives use the same.

The port: where the address is one of this machine's (the server can bind it: the local
executor, or a Ray node on the server's own machine), the server asks the kernel for a free
port there, as before. Elsewhere it cannot probe, so it takes the next port of
`network.replica_ports` (20000-29999 by default: below Linux's ephemeral range, so a
node's outgoing connections do not take them) after the last one it gave on that address,
skipping those its own running replicas hold there. A port something else holds makes
the replica fail at start ("port taken"); it is replaced, on the next port, and the
service's crash-loop backoff caps the retries.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.errors import SpecError
from gpupool.server.telemetry.replica_load import Endpoint
from gpupool.specfile import SpecReader, config_section

SECTION = "network"
KEYS = frozenset({"node_address", "replica_ports"})
HOST_ENV = "GPUPOOL_REPLICA_HOST"
"""The environment variable that tells a replica the address to listen on."""
DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORTS = (20000, 29999)


@dataclass(frozen=True)
class NetworkConfig:
    """The --config file's `network:` section."""

    node_address: str = DEFAULT_ADDRESS
    """The address of the server's own node: where its replicas listen, where they are
    scraped and what their URLs name (the local executor)."""
    replica_ports: tuple[int, int] = DEFAULT_PORTS
    """The ports (first, last) replicas on other machines' nodes listen on."""


def _address(value: Any, path: str) -> str:
    text = str(value).strip()
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise SpecError(
            f"{path}: {SECTION}.node_address {value!r} is not an IP address; give the "
            "address this machine's replicas are reached at, e.g. 10.0.0.5 or 127.0.0.1"
        ) from None
    if ip.is_unspecified or ip.is_multicast:
        raise SpecError(
            f"{path}: {SECTION}.node_address {text} cannot be reached at; give this "
            "machine's own address (e.g. 10.0.0.5), not a wildcard or multicast one"
        )
    return str(ip)


def _ports(value: Any, path: str) -> tuple[int, int]:
    first, sep, last = str(value).partition("-")
    try:
        lo, hi = int(first), int(last if sep else first)
    except ValueError:
        lo, hi = 0, -1
    if not 1024 <= lo <= hi <= 65535:
        raise SpecError(
            f"{path}: {SECTION}.replica_ports {value!r}: give a range FIRST-LAST within "
            "1024-65535, e.g. 20000-29999"
        )
    return lo, hi


def parse_network(raw: Any, path: str) -> NetworkConfig:
    if raw is None:
        return NetworkConfig()
    body = SpecReader(path).mapping(raw, SECTION, KEYS)
    return NetworkConfig(
        node_address=_address(body.get("node_address", DEFAULT_ADDRESS), path),
        replica_ports=_ports(body["replica_ports"], path)
        if "replica_ports" in body
        else DEFAULT_PORTS,
    )


def load_network(path: Path | None) -> NetworkConfig:
    """The `network:` section of the --config file (defaults when absent)."""
    return parse_network(config_section(path, SECTION), str(path))


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def is_own(host: str) -> bool:
    """Whether `host` is an address of this machine (it can be bound here)."""
    try:
        with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
    except OSError:
        return False
    return True


def probe_port(host: str, taken: Set[int], tries: int = 20) -> int:
    """A port nothing listens on now at `host` (one of this machine's addresses), not in
    `taken`."""
    for _ in range(tries):
        with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in taken:
            return port
    raise OSError(f"no free port at {host} outside the {len(taken)} its replicas hold")


@dataclass
class ReplicaPorts:
    """Chooses each new replica's port (see the module's docstring)."""

    ports: tuple[int, int] = DEFAULT_PORTS
    own: Any = is_own
    """Whether an address is this machine's (a test may say otherwise)."""
    last: dict[str, int] = field(default_factory=dict)
    """The last port of the range given on each address."""

    def choose(self, host: str, taken: Set[int]) -> int:
        """A port at `host` for a new replica, none of `taken` (the ports the server's
        running replicas hold there)."""
        if self.own(host):
            return probe_port(host, taken)
        lo, hi = self.ports
        span = hi - lo + 1
        start = self.last.get(host, hi)
        for step in range(1, span + 1):
            port = lo + (start - lo + step) % span
            if port not in taken:
                self.last[host] = port
                return port
        raise OSError(
            f"every port of {SECTION}.replica_ports {lo}-{hi} at {host} is held by a replica"
        )


def node_address(executor: object, node: str, default: str) -> str:
    """The node's address: the executor's `node_address(node)` where it has one (the
    optional capability of gpupool.ports.executor.base), else `default` (the server's)."""
    of = getattr(executor, "node_address", None)
    return str(of(node)) if of is not None else default


def held_at(host: str, endpoints: Mapping[str, Endpoint]) -> set[int]:
    """The ports replicas hold at `host`, from the server's record of their endpoints."""
    return {at.port for at in endpoints.values() if at.host == host}

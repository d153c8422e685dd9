"""The cloud port: which nodes can be started on demand, which nodes are alive, and how a
node's start and stop commands are run.

Below properties are assumed of every implementation:

1. Eventually joined. A started node is not in the pool until the probe lists it; one
   that does not join in time is stopped by the caller (`SitesConfig.join_timeout_s`).
2. Nothing waits. A command is started and then polled; the probe answers from what the
   cluster knows now. Neither waits for a node to come up or go away.
3. Identity changes on restart. The probe gives each live node an id (e.g. its Ray node
   id) that changes when the node restarts, so that a node that rebooted between two
   probes is told apart from one that stayed up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class CloudNode:
    """A node a cloud site can start on demand."""

    name: str
    site: str
    model: str
    gpus: int


class NodeProbe(Protocol):
    """Names the nodes alive now."""

    def __call__(self) -> dict[str, str]:
        """Node name -> an id that changes when the node restarts. The live driver calls
        it at most once a second; a node it no longer lists is lost (its jobs are
        requeued), a cloud node it lists has joined. It may block for one call to the
        cluster (a Ray GCS query); an exception (the cluster unreachable for a while) is
        reported as the loop's error and the nodes stay as they were until the next
        probe."""
        ...


class CommandRunner(Protocol):
    """Runs a node's start or stop command without waiting for it."""

    def start(self, argv: Sequence[str], log: Path) -> Callable[[], int | None]:
        """Launch; the returned call gives the exit code once it has ended, else None.

        `argv` is the operator's command with its `{node}`-style fields already filled in;
        its output goes to `log`.
        It returns as soon as the command is started; a command that cannot be started
        raises (OSError), and one that ends badly is reported by its exit code."""
        ...

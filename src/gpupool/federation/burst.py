"""Cloud burst and reclaim: start cloud nodes when on-prem stays full, stop idle ones.

`BurstController` is a deterministic state machine. The decision core calls `observe` with
what it measures; the controller answers with the events to carry out (start or stop
this many cloud nodes), each with the reason in words. Every condition must hold for a
sustain window first, so a short spike neither buys nodes nor throws them away.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpupool.errors import SpecError

BURST = "burst"
RECLAIM = "reclaim"


@dataclass(frozen=True)
class BurstRules:
    """When to start and stop cloud nodes.

    Burst when on-prem utilisation stays above `util_threshold` for `sustain_s`, or when
    at least `pending_gpu_threshold` GPUs of waiting work that no on-prem node can take
    stay waiting for `pending_sustain_s` (shorter: that work cannot start at all, while a
    busy cluster still serves). Reclaim idle cloud nodes when cloud utilisation stays
    below `reclaim_util` for `reclaim_sustain_s`. `max_cloud_nodes` = 0 never bursts.
    """

    util_threshold: float = 0.9
    sustain_s: float = 900.0
    pending_gpu_threshold: int = 1
    pending_sustain_s: float = 300.0
    reclaim_util: float = 0.3
    reclaim_sustain_s: float = 900.0
    nodes_per_burst: int = 1
    max_cloud_nodes: int = 0

    def __post_init__(self) -> None:
        for name, value in (
            ("util_threshold", self.util_threshold),
            ("reclaim_util", self.reclaim_util),
        ):
            if not 0.0 <= value <= 1.0:
                raise SpecError(f"burst rules: {name} must be in 0..1, got {value}")
        for name, value in (
            ("sustain_s", self.sustain_s),
            ("pending_sustain_s", self.pending_sustain_s),
            ("reclaim_sustain_s", self.reclaim_sustain_s),
        ):
            if not (value >= 0 and math.isfinite(value)):
                raise SpecError(f"burst rules: {name} must be >= 0, got {value}")
        if self.pending_gpu_threshold < 1:
            raise SpecError("burst rules: pending_gpu_threshold must be >= 1")
        if self.nodes_per_burst < 1:
            raise SpecError("burst rules: nodes_per_burst must be >= 1")
        if self.max_cloud_nodes < 0:
            raise SpecError("burst rules: max_cloud_nodes must be >= 0")


@dataclass(frozen=True)
class BurstEvent:
    """Start (`burst`) or stop (`reclaim`) this many cloud nodes at `t_s`, and why."""

    t_s: float
    action: str
    nodes: int
    reason: str


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _mins(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


class BurstController:
    """Decides bursts and reclaims from periodic observations.

    It remembers since when each condition has held (the first observation where it
    did; any observation where it does not resets it). Hysteresis: after a burst it does
    not burst again until the nodes it asked for are up (the first later observation with
    no cloud node starting) and then a whole sustain window has passed, because the new
    nodes need time to take work before utilisation means anything. It never bursts while
    a cloud node stands idle (the capacity is already there) or beyond max_cloud_nodes
    counting nodes up and starting. It reclaims only idle nodes, so running work is never
    evicted, and never while nodes are starting. A reclaim restarts the burst windows and
    a burst restarts the reclaim window, so the two do not chase each other.

    The caller carries out each event before its next `observe`, and should count in
    `pending_gpus` only work a cloud node could take, or the controller will buy nodes
    that stay idle until reclaimed.
    """

    def __init__(self, rules: BurstRules) -> None:
        self.rules = rules
        self._last_s = -math.inf
        self._hot_since: float | None = None
        self._pending_since: float | None = None
        self._cold_since: float | None = None
        self._burst_at_s: float | None = None
        """A burst whose nodes have not been seen up yet."""
        self._events: list[BurstEvent] = []

    @property
    def events(self) -> tuple[BurstEvent, ...]:
        """Every event so far, in order."""
        return tuple(self._events)

    @property
    def spinning_up(self) -> bool:
        """Whether the last burst's nodes are still on their way."""
        return self._burst_at_s is not None

    def observe(
        self,
        now_s: float,
        onprem_util: float,
        pending_gpus: int,
        cloud_nodes_up: int,
        cloud_nodes_starting: int,
        cloud_util: float,
        idle_cloud_nodes: int,
    ) -> list[BurstEvent]:
        """Take one observation; return the events to carry out now (usually none)."""
        self._check(
            now_s,
            onprem_util,
            pending_gpus,
            cloud_nodes_up,
            cloud_nodes_starting,
            cloud_util,
            idle_cloud_nodes,
        )
        self._last_s = now_s
        r = self.rules
        hot = onprem_util > r.util_threshold
        pending = pending_gpus >= r.pending_gpu_threshold
        cold = cloud_nodes_up > 0 and cloud_util < r.reclaim_util
        self._hot_since = _track(self._hot_since, hot, now_s)
        self._pending_since = _track(self._pending_since, pending, now_s)
        self._cold_since = _track(self._cold_since, cold, now_s)

        if self._burst_at_s is not None and now_s > self._burst_at_s and cloud_nodes_starting == 0:
            # The burst's nodes are up: every window starts afresh (hysteresis).
            self._burst_at_s = None
            self._restart_windows(now_s, burst=True, reclaim=True)
        starting = self._burst_at_s is not None or cloud_nodes_starting > 0

        out: list[BurstEvent] = []
        why: list[str] = []
        if self._held(self._hot_since, now_s, r.sustain_s):
            why.append(
                f"on-prem utilisation {_pct(onprem_util)} > {_pct(r.util_threshold)} "
                f"for {_mins(now_s - self._since(self._hot_since))}"
            )
        if self._held(self._pending_since, now_s, r.pending_sustain_s):
            why.append(
                f"{pending_gpus} GPUs pending that no on-prem node can take "
                f"for {_mins(now_s - self._since(self._pending_since))}"
            )
        room = r.max_cloud_nodes - cloud_nodes_up - cloud_nodes_starting
        if why and not starting and idle_cloud_nodes == 0 and room > 0:
            nodes = min(r.nodes_per_burst, room)
            capped = (
                f" (capped at {r.max_cloud_nodes} cloud nodes)" if nodes < r.nodes_per_burst else ""
            )
            out.append(BurstEvent(now_s, BURST, nodes, "; ".join(why) + capped))
            self._burst_at_s = now_s
            self._restart_windows(now_s, burst=False, reclaim=True)
        elif (
            not starting
            and idle_cloud_nodes > 0
            and self._held(self._cold_since, now_s, r.reclaim_sustain_s)
        ):
            out.append(
                BurstEvent(
                    now_s,
                    RECLAIM,
                    idle_cloud_nodes,
                    f"cloud utilisation {_pct(cloud_util)} < {_pct(r.reclaim_util)} "
                    f"for {_mins(now_s - self._since(self._cold_since))}; "
                    f"{idle_cloud_nodes} of {cloud_nodes_up} cloud nodes idle",
                )
            )
            self._restart_windows(now_s, burst=True, reclaim=True)
        self._events.extend(out)
        return out

    # ---- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _held(since: float | None, now_s: float, sustain_s: float) -> bool:
        return since is not None and now_s - since >= sustain_s

    @staticmethod
    def _since(since: float | None) -> float:
        """The start of a window known to be open."""
        assert since is not None
        return since

    def _restart_windows(self, now_s: float, *, burst: bool, reclaim: bool) -> None:
        """Conditions that still hold count again from now."""
        if burst:
            if self._hot_since is not None:
                self._hot_since = now_s
            if self._pending_since is not None:
                self._pending_since = now_s
        if reclaim and self._cold_since is not None:
            self._cold_since = now_s

    def _check(
        self,
        now_s: float,
        onprem_util: float,
        pending_gpus: int,
        cloud_nodes_up: int,
        cloud_nodes_starting: int,
        cloud_util: float,
        idle_cloud_nodes: int,
    ) -> None:
        if not math.isfinite(now_s) or now_s < self._last_s:
            raise SpecError(
                f"burst controller: observation at {now_s} s is before the last one "
                f"({self._last_s} s); time only moves forward"
            )
        for name, u in (("onprem_util", onprem_util), ("cloud_util", cloud_util)):
            if not 0.0 <= u <= 1.0 + 1e-9:
                raise SpecError(f"burst controller: {name} must be in 0..1, got {u}")
        if min(pending_gpus, cloud_nodes_up, cloud_nodes_starting, idle_cloud_nodes) < 0:
            raise SpecError("burst controller: counts must be >= 0")
        if idle_cloud_nodes > cloud_nodes_up:
            raise SpecError(
                f"burst controller: {idle_cloud_nodes} idle cloud nodes but only "
                f"{cloud_nodes_up} up"
            )


def _track(since: float | None, holds: bool, now_s: float) -> float | None:
    if not holds:
        return None
    return now_s if since is None else since

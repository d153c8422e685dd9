"""What the driver measured on shared cards (GpuUsage), kept over the sharing window: a
card whose average SM utilisation there is above `max_sm_util_pct` takes no new sharer,
and each card's last measured free memory bounds what a new share may ask. Not a stage of
the cycle: the core feeds it the GpuUsage events, and the placement reads its effect on
the cluster state."""

from __future__ import annotations

from collections import deque

import numpy as np

from gpupool.domain.state import ClusterState
from gpupool.errors import SpecError
from gpupool.scheduler.config import SharingConfig
from gpupool.scheduler.events import GpuUsage


class UsageWindow:
    """The GPU usage the driver measured (GpuUsage), kept over `util_window_s`: a card
    whose average SM utilisation there is above `max_sm_util_pct` takes no new sharer,
    and each card's last measured free memory bounds what a new share may ask."""

    def __init__(self, config: SharingConfig) -> None:
        self.config = config
        self.samples: deque[tuple[float, np.ndarray]] = deque()

    def observe(self, state: ClusterState, event: GpuUsage) -> bool:
        """Take a reading into the state; whether what the placement sees changed."""
        shape = state.gpu_left.shape
        arrays = (event.sm_util_pct, event.mem_used_mib, event.mem_total_mib)
        if any(np.shape(a) != shape for a in arrays):
            raise SpecError(
                f"GpuUsage arrays must be [node, gpu] of shape {shape}, got "
                f"{[np.shape(a) for a in arrays]}"
            )
        window = self.config.util_window_s
        self.samples.append((event.t_s, np.asarray(event.sm_util_pct, dtype=np.float64)))
        while self.samples and self.samples[0][0] < event.t_s - window - 1e-9:
            self.samples.popleft()
        before = (state.no_new_sharer, state.measured_free_mib, state.card_mem_mib)
        bound = self.config.max_sm_util_pct
        if bound is not None:
            stack = np.stack([u for _, u in self.samples])
            seen = np.isfinite(stack)
            total = np.where(seen, stack, 0.0).sum(axis=0)
            count = seen.sum(axis=0)
            mean = np.divide(total, count, out=np.zeros(shape), where=count > 0)
            state.no_new_sharer = mean > bound
        used = np.asarray(event.mem_used_mib, dtype=np.int64)
        card = np.asarray(event.mem_total_mib, dtype=np.int64)
        state.measured_free_mib = np.where((used >= 0) & (card > 0), card - used, -1)
        state.card_mem_mib = np.maximum(card, 0)
        after = (state.no_new_sharer, state.measured_free_mib, state.card_mem_mib)
        return any(
            (a is None) != (b is None)
            or (a is not None and b is not None and not np.array_equal(a, b))
            for a, b in zip(before, after, strict=True)
        )

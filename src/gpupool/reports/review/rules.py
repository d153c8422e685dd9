"""The review's thresholds (ReviewRules) and the constants every section counts in.

Integer units keep the exact split exact: shares in milli-GPU (MILLI per card), times in
milliseconds (MS_PER_HOUR per hour).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.errors import SpecError

MS_PER_HOUR = 3_600_000
MILLI = 1000
UNKNOWN_TEAM = "(unknown)"
ONLINE_KIND = "online-inference"
"""JobKind.ONLINE's value: the core lets online inference share a card only with online."""
RECOMMENDATION_KINDS = (
    "never-used",
    "reclaimable-card",
    "share-a-card",
    "right-size",
    "latency-drift",
)


@dataclass(frozen=True)
class ReviewRules:
    """The thresholds the recommendations fire at (docs/review.md explains each)."""

    min_sampled_frac: float = 0.5
    """A job's recommendations need usage samples over at least this share of its held time."""
    reclaimable_mean_sm_pct: float = 30.0
    """A card whose mean SM utilisation over its up time is under this is reclaimable."""
    never_used_sm_pct: float = 1.0
    """A job whose attributed SM stayed under this on every sample never used its GPU ..."""
    never_used_mem_frac: float = 0.02
    """... and whose attributed memory stayed under this fraction of the card."""
    share_mem_headroom_frac: float = 0.10
    """Two jobs share a card when their peak memories sum to at most card x (1 - this) ..."""
    share_sm_sum_pct: float = 100.0
    """... and their mean SM percentages sum to at most this ..."""
    share_min_overlap_frac: float = 0.5
    """... and they ran together for at least this fraction of the shorter one's time."""
    right_size_ratio: float = 2.0
    """A job that asked at least this many times its measured peak memory is over-asking."""
    right_size_headroom_frac: float = 0.2
    """The plain suggestion asks for the measured peak plus this much."""
    drift_min_change_frac: float = 0.20
    """A p99 level change of at least this fraction (that stays) is a drift."""
    drift_penalty: float = 3.0
    """Change-point penalty, in noise variance x log(n) (ruptures KernelCPD, l2 cost)."""
    drift_min_points: int = 6
    """Fewer latency buckets than this per side: no drift is claimed."""
    drift_max_points: int = 720
    """Latency series longer than this are averaged into this many buckets for ruptures."""

    def __post_init__(self) -> None:
        if not self.right_size_ratio > 0:
            raise SpecError("right_size_ratio must be > 0")
        if not 0 <= self.share_mem_headroom_frac < 1:
            raise SpecError("share_mem_headroom_frac must be in [0, 1)")
        if self.drift_min_points < 2:
            raise SpecError("drift_min_points must be at least 2")

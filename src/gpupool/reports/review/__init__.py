"""The monthly review: what the pool was given, what it used, what it cost, what to change.

`build_review` is pure: it reads one `ReviewData` (from the live database or a simulation)
and returns a `Review` of frozen rows, one table per section, that the HTML charts and the
CSV writes. Reconciliation is exact: every GPU's period is split into allocated, idle and
down in integer milli-GPU x milliseconds, so allocated + idle + down == capacity and the
teams' allocated sums to the cluster's without rounding. Measured use (SM %, memory) comes
from the per-card usage samples, attributed to the jobs holding the card in proportion to
their share x overlap. Recommendations carry evidence sentences with the numbers in them.

Contract: each section is a module with one function from the period (period.py: the data
checked, indexed and split exactly) and the sections before it to its rows (rows.py);
build.py runs them in order. To add a section: its row type in rows.py and a Table for it
in `Review.tables`, its function in a module of its own, its call in build.py. Modules
inside this package import each other, never this `__init__`.
"""

from gpupool.reports.review.build import build_review
from gpupool.reports.review.catalogue import card_mem_mib
from gpupool.reports.review.period import absolute
from gpupool.reports.review.rows import (
    CostRow,
    EnergyRow,
    GpuRow,
    HourRow,
    JobUsageRow,
    LatencyRow,
    PreemptionRow,
    ReasonRow,
    Recommendation,
    RecommendationRow,
    Reconciliation,
    Review,
    Summary,
    Table,
    TeamRow,
    TypeRow,
    WaitRow,
)
from gpupool.reports.review.rules import (
    MILLI,
    MS_PER_HOUR,
    ONLINE_KIND,
    RECOMMENDATION_KINDS,
    UNKNOWN_TEAM,
    ReviewRules,
)
from gpupool.reports.review.units import iso

__all__ = [
    "MILLI",
    "MS_PER_HOUR",
    "ONLINE_KIND",
    "RECOMMENDATION_KINDS",
    "UNKNOWN_TEAM",
    "CostRow",
    "EnergyRow",
    "GpuRow",
    "HourRow",
    "JobUsageRow",
    "LatencyRow",
    "PreemptionRow",
    "ReasonRow",
    "Recommendation",
    "RecommendationRow",
    "Reconciliation",
    "Review",
    "ReviewRules",
    "Summary",
    "Table",
    "TeamRow",
    "TypeRow",
    "WaitRow",
    "absolute",
    "build_review",
    "card_mem_mib",
    "iso",
]

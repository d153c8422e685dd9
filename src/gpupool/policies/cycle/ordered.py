"""Ordered cycle policies: priority-quota's rules with another order inside each class.

* las       Tiresias' 2D-LAS: least attained GPU service (GPUs x work done) first, in
            discrete queues, first come first served inside a queue; non-clairvoyant.
* gittins   2D-Gittins: the Gittins index of attained service under the GPU-time
            distribution of the jobs that finished.
* learned   predicted GPU-time order mixed with the rule order (learning.rule) by
            preferential round-robin, used only while the guard trusts the model; in
            shadow mode the rule order decides and the learned plan is only recorded.

Every rule of priority-quota holds unchanged: online inference first and never
preempted, the online reserve, guarantees reclaimed, quota maxima, fair-share borrowing,
the preemption rules and EASY backfill. Only the order inside a priority class (after
online-first and the priority number) comes from the core's `LearnedOrdering`, handed
to the plan as `CycleView.rank`; the core puts a job that has waited past
`learning.max_wait_s` first whatever the order says. The order adds no preemption of its
own: a job that runs keeps running as under priority-quota.
"""

from __future__ import annotations

from gpupool.policies.cycle.priority_quota import PriorityQuotaPolicy
from gpupool.policies.registry import register


class OrderedPolicy(PriorityQuotaPolicy):
    """priority-quota with the order inside each priority class taken from `view.rank`."""

    name = "ordered"
    rule: str | None = None
    """The rule order this policy is (las, gittins); None: the configured learning.rule."""
    learned: bool = False
    """Whether a predictor takes part (the learned policy)."""


class LasPolicy(OrderedPolicy):
    name = "las"
    rule = "las"


class GittinsPolicy(OrderedPolicy):
    name = "gittins"
    rule = "gittins"


class LearnedPolicy(OrderedPolicy):
    name = "learned"
    learned = True


register("cycle", "las")(LasPolicy)
register("cycle", "gittins")(GittinsPolicy)
register("cycle", "learned")(LearnedPolicy)

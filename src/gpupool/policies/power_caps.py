"""Power caps: trade a little speed for a lot of energy where nobody waits for it.

The rule (facts.md §3): memory-bound work (offline inference) loses almost nothing to a
lower clock, so it is always capped at its best point; compute-bound training is capped
at its energy sweet spot (about 0.7 TDP, -19% energy for +7% time on the Zeus A40 trace)
only while power is dearer than the site's average and its deadline still holds at the
slower speed. Online inference is never capped for price: its latency is the product;
only its own load lowers its clock (serving_clocks.py), never below what its SLO allows.
A card that runs hot is capped to the power whose steady temperature is just under the
threshold. The plan is a list of SetPowerCap commands; the simulator applies them to its
model and the live service through NVML.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.domain.model import JobKind
from gpupool.energy.power import Load, load_of
from gpupool.energy.powercap import CapPoint, SetPowerCap, best_cap, cap_curve

GpuSlot = tuple[int, int]

DEFAULT_MAX_SM_MHZ = 1980
"""SM clock of the H200 running memory-bound work uncapped (shared/calibration); the live
service reads each card's own maximum from NVML instead."""


@dataclass(frozen=True)
class CapJob:
    job_id: str
    kind: JobKind
    gpus: tuple[GpuSlot, ...]
    tdp_w: float
    deadline_s: float | None
    remaining_s: float
    """Time to finish at full (uncapped, unshared) speed, restart included."""
    draw_w: float = 0.0
    """One of its GPUs' draw uncapped, facility overhead included (W)."""
    value_of_time: float | None = None
    """What an hour of one of its GPUs' delay is worth, in the tariff's currency (None:
    capped while power is dearer than the tariff's mean)."""
    gpu_price: float = 0.0
    """What an hour of one of its GPUs costs, in the tariff's currency: a cap holds the
    GPU longer, and that hour is paid whether or not anybody waits for the result."""
    serving_clock: CapPoint | None = None
    """Online inference whose load allows a lower clock (policies/serving_clocks.py)."""

    def worth_capping(self, point: CapPoint, price_now: float, price_mean: float) -> bool:
        """Whether the energy a cap saves is worth the hours it adds: per GPU-hour of work,
        the kWh saved at today's price against the slowdown, priced at the GPU's own price
        plus the value of time (without a value of time, whenever power is dearer than
        average)."""
        if self.value_of_time is None:
            return price_now > price_mean
        saved = self.draw_w / 1000.0 * (1.0 - point.energy_frac) * price_now
        return saved > (self.value_of_time + self.gpu_price) * point.slowdown


@dataclass(frozen=True)
class CapRules:
    max_slowdown_compute: float = 0.08
    max_slowdown_memory: float = 0.05
    deadline_margin_s: float = 3600.0
    min_limit_frac: float = 200.0 / 700.0
    """The lowest power limit a card accepts, as a fraction of TDP (H200: 200 of 700 W,
    NVML limit constraints in shared/calibration)."""


def plan_power_caps(
    jobs: Sequence[CapJob],
    now_s: float,
    price: Mapping[int, tuple[float, float] | None],
    hot: Mapping[GpuSlot, float],
    price_capping: bool = True,
    rules: CapRules | None = None,
    max_sm_mhz: Mapping[int, int] | None = None,
) -> list[SetPowerCap]:
    """One command per GPU of every running job: a power limit in watts and/or a locked
    SM clock, or neither (reset to the card's defaults).

    price: per node, (price now, the tariff's mean) or None where power has no price.
    hot: GPUs running hot, with the most power that keeps them under the threshold.
    max_sm_mhz: per node, the cards' maximum SM clock (NVML), for clock locks."""
    rules = rules or CapRules()
    out: list[SetPowerCap] = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        load = load_of(job.kind)
        limit: float | None = None
        clock: int | None = None
        reason = "uncapped"
        point = job.serving_clock
        if job.kind is JobKind.ONLINE and point is not None and job.gpus:
            reason = "serving: full clocks, its load nears its SLO"
            if point.locked_sm_frac:
                node = job.gpus[0][0]
                top = (max_sm_mhz or {}).get(node, DEFAULT_MAX_SM_MHZ)
                clock = point.command(node, job.gpus[0][1], job.tdp_w, top, "").locked_sm_mhz
                reason = "serving: its load is well within its SLO at a lower clock"
        if price_capping and job.kind is not JobKind.ONLINE and job.tdp_w > 0:
            if load is Load.MEMORY_BOUND and job.gpus:
                # Decode is insensitive to the SM clock: lock it (facts.md §3.3, clock
                # locking Pareto-dominates power capping for memory-bound work).
                point = best_cap(load, rules.max_slowdown_memory)
                node = job.gpus[0][0]
                top = (max_sm_mhz or {}).get(node, DEFAULT_MAX_SM_MHZ)
                command = point.command(node, job.gpus[0][1], job.tdp_w, top, "")
                limit, clock = command.power_limit_w, command.locked_sm_mhz
                reason = "memory-bound: a lower clock costs it almost no speed"
            elif load is Load.COMPUTE_BOUND and job.gpus:
                rates = price.get(job.gpus[0][0])
                point = best_cap(load, rules.max_slowdown_compute)
                slow_finish = now_s + job.remaining_s / point.speed + rules.deadline_margin_s
                if (
                    rates is not None
                    and job.worth_capping(point, rates[0], rates[1])
                    and (
                        slow_finish <= job.deadline_s
                        if job.deadline_s is not None
                        else job.value_of_time is not None
                    )
                ):
                    limit = point.cap_frac * job.tdp_w
                    reason = (
                        "power dearer than average and the deadline allows it"
                        if job.value_of_time is None
                        else "the energy saved is worth more than the time it adds"
                    )
        for slot in job.gpus:
            cap, why = limit, reason
            if slot in hot and job.kind is not JobKind.ONLINE:
                # no lower than the card allows: a card too hot to cool by capping stays
                # at its floor (and shows up in the thermal report)
                heat_w = max(hot[slot], rules.min_limit_frac * job.tdp_w)
                if cap is None or heat_w < cap:
                    cap, why = heat_w, "running hot" if clock is None else f"{reason}; running hot"
            out.append(SetPowerCap(slot[0], slot[1], cap, clock, why))
    return out


def cap_fraction(
    command: SetPowerCap, load: Load, tdp_w: float, max_sm_mhz: int = DEFAULT_MAX_SM_MHZ
) -> float | None:
    """Where a command puts a card on its load's cap curve (fraction of TDP), so that a
    model can tell the speed and power that follow; None: uncapped."""
    fracs = []
    if command.power_limit_w is not None and tdp_w > 0:
        fracs.append(min(1.0, command.power_limit_w / tdp_w))
    if command.locked_sm_mhz is not None:
        locked = command.locked_sm_mhz / max_sm_mhz
        points = [p for p in cap_curve(load).points if p.locked_sm_frac is not None]
        if points:
            fracs.append(
                min(points, key=lambda p: abs((p.locked_sm_frac or 0.0) - locked)).cap_frac
            )
    return min(fracs) if fracs else None

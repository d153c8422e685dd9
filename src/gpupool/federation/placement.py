"""Which site runs a job: data locality, user latency, deadlines, then completion and cost.

The simulator describes every place the job could run as a `SiteOption` (a site and GPU
type, with the job's run time there, the GPUs it needs, the price, the expected queueing
delay and the free GPUs). `choose_site` applies the federation's rules and explains every
refusal; `blind_choice` is the locality-blind baseline the rules are measured against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.errors import SpecError
from gpupool.federation.topology import Topology

JOB_KINDS = ("training", "offline-inference", "online-inference", "batch")
ONLINE = "online-inference"


@dataclass(frozen=True)
class SiteOption:
    """Running the job at `site` on `gpu_type`, as the simulator sees it now."""

    site: str
    gpu_type: str
    run_s: float
    gpus: int
    price_usd_per_gpu_hour: float
    est_wait_s: float
    """Expected queueing delay there; 0 when the job fits in the free GPUs now."""
    free_gpus: int

    def __post_init__(self) -> None:
        for name, value in (
            ("run_s", self.run_s),
            ("price_usd_per_gpu_hour", self.price_usd_per_gpu_hour),
            ("est_wait_s", self.est_wait_s),
        ):
            if not value >= 0:
                raise SpecError(f"option {self.site}/{self.gpu_type}: {name} must be >= 0")
        if self.gpus < 0 or self.free_gpus < 0:
            raise SpecError(f"option {self.site}/{self.gpu_type}: GPU counts must be >= 0")

    @property
    def cost_usd(self) -> float:
        """What running there costs: GPUs × price × run hours (queueing is not billed)."""
        return self.gpus * self.price_usd_per_gpu_hour * self.run_s / 3600.0


@dataclass(frozen=True)
class FedJob:
    """What placement needs to know about a job. `deadline_s` is absolute sim time."""

    job_id: str
    kind: str
    dataset: str | None
    dataset_gb: float
    home_site: str | None
    user_region: str | None
    latency_bound_ms: float | None
    deadline_s: float | None = None
    submit_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in JOB_KINDS:
            raise SpecError(
                f"job {self.job_id}: kind must be one of {', '.join(JOB_KINDS)}, got {self.kind!r}"
            )
        if not self.dataset_gb >= 0:
            raise SpecError(f"job {self.job_id}: dataset_gb must be >= 0")
        if self.latency_bound_ms is not None:
            if not self.latency_bound_ms >= 0:
                raise SpecError(f"job {self.job_id}: latency_bound_ms must be >= 0")
            if self.user_region is None:
                raise SpecError(
                    f"job {self.job_id}: a latency bound needs user_region (latency from where?)"
                )


@dataclass(frozen=True)
class SiteDecision:
    """Where the job goes (None: nowhere acceptable) and why, with every refusal."""

    option: SiteOption | None
    transfer_s: float
    score_s: float
    """Completion time from now, plus cost converted to delay when asked to."""
    cost_usd: float
    reason: str
    rejected: tuple[tuple[str, str], ...]
    """(site, reason) for every option a rule refused."""

    @property
    def completion_s(self) -> float:
        """Seconds from now until the job finishes at the chosen option (inf: none)."""
        if self.option is None:
            return math.inf
        return self.option.est_wait_s + self.transfer_s + self.option.run_s


def fmt_duration(seconds: float) -> str:
    """3.0 h, 24 min, 30 s: the unit a person reads at a glance."""
    if math.isinf(seconds):
        return "never"
    if seconds >= 3600.0:
        return f"{seconds / 3600.0:.1f} h"
    if seconds >= 60.0:
        return f"{seconds / 60.0:.0f} min"
    return f"{seconds:.0f} s"


def _fmt_ms(ms: float) -> str:
    return "unreachable" if math.isinf(ms) else f"{ms:g} ms"


@dataclass(frozen=True)
class _Candidate:
    option: SiteOption
    transfer_s: float

    @property
    def completion_s(self) -> float:
        return self.option.est_wait_s + self.transfer_s + self.option.run_s

    @property
    def label(self) -> str:
        return f"{self.option.site}/{self.option.gpu_type}"


def _transfer(job: FedJob, option: SiteOption, topo: Topology) -> float:
    if job.dataset is None:
        topo.site(option.site)  # an unknown site is a caller bug, caught here as anywhere
        return 0.0
    return topo.transfer_s(job.dataset, option.site, job.dataset_gb)


def _decision(
    c: _Candidate, score_s: float, reason: str, rejected: list[tuple[str, str]]
) -> SiteDecision:
    return SiteDecision(c.option, c.transfer_s, score_s, c.option.cost_usd, reason, tuple(rejected))


def _refusal(reason: str, rejected: list[tuple[str, str]]) -> SiteDecision:
    return SiteDecision(None, 0.0, math.inf, 0.0, reason, tuple(rejected))


def choose_site(
    job: FedJob,
    options: Sequence[SiteOption],
    topo: Topology,
    now_s: float,
    usd_per_hour_of_delay: float = 0.0,
) -> SiteDecision:
    """Pick the site and GPU type for `job`; completion = est_wait_s + transfer_s + run_s.

    Rules, in order:

    (a) Online inference with a latency bound refuses every site farther than the bound
        from the users' region: a replica that misses its latency budget serves no request
        within the SLO, however idle its site. If every site is refused the job is refused
        (option None): the federation does not make an infeasible latency placement.
    (b) A remote option (the dataset must move, transfer_s > 0) is refused when moving the
        data takes longer than queueing at the best local option (least est_wait_s among
        options in the dataset's region) would. Waiting at home costs nothing but time,
        while a transfer also loads a shared WAN link and the estimate of the remote queue
        is the least reliable number here; so data moves only when the move itself is
        quicker than the local queue. Three hours of transfer for twenty minutes of compute
        is refused unless the local queue is longer than three hours. With no local option
        (no site in the data's region offers the job) remote options are allowed. An option
        with no network path to the dataset is always refused.
    (c) If some options finish by the deadline (`deadline_s`, absolute), those dominate the
        rest: a late finish is worth less than any on-time one. If none can, all stay and
        the earliest finish wins.
    (d) Among the rest, the least completion time plus cost as delay: with
        usd_per_hour_of_delay = X > 0 an hour of delay is worth X USD, so each X USD spent
        counts as an hour. X = 0 (default) ignores cost: pure completion time. Ties go to
        the cheaper option, then the job's home site, then site and GPU type by name, so
        the same inputs always give the same answer.
    """
    if not usd_per_hour_of_delay >= 0:
        raise SpecError(f"usd_per_hour_of_delay must be >= 0, got {usd_per_hour_of_delay}")
    rejected: list[tuple[str, str]] = []
    if not options:
        return _refusal(f"job {job.job_id}: no site offers this job", rejected)

    # (a) latency
    live: list[_Candidate] = []
    bound = job.latency_bound_ms if job.kind == ONLINE else None
    for opt in options:
        transfer = _transfer(job, opt, topo)
        if bound is not None and job.user_region is not None:
            lat = topo.latency_ms(job.user_region, opt.site)
            if lat > bound:
                rejected.append(
                    (
                        opt.site,
                        f"latency {_fmt_ms(lat)} to {job.user_region} exceeds bound {bound:g} ms",
                    )
                )
                continue
        live.append(_Candidate(opt, transfer))
    if not live:
        return _refusal(
            f"job {job.job_id} refused: no site within the {bound:g} ms latency bound "
            f"of {job.user_region}",
            rejected,
        )

    # (b) locality
    local = [c for c in live if c.transfer_s == 0.0]
    local_wait_s = min((c.option.est_wait_s for c in local), default=math.inf)
    kept: list[_Candidate] = []
    for c in live:
        if math.isinf(c.transfer_s):
            rejected.append((c.option.site, f"no path to dataset {job.dataset} ({c.label})"))
        elif c.transfer_s > local_wait_s:
            rejected.append(
                (
                    c.option.site,
                    f"transfer {fmt_duration(c.transfer_s)} exceeds local queueing "
                    f"{fmt_duration(local_wait_s)} ({c.label}, run {fmt_duration(c.option.run_s)})",
                )
            )
        else:
            kept.append(c)
    if not kept:
        return _refusal(f"job {job.job_id}: no site can reach dataset {job.dataset}", rejected)

    # (c) deadline
    note = ""
    if job.deadline_s is not None:
        deadline = job.deadline_s
        on_time = [c for c in kept if now_s + c.completion_s <= deadline]
        if on_time:
            for c in kept:
                if now_s + c.completion_s > deadline:
                    rejected.append(
                        (
                            c.option.site,
                            f"finishes in {fmt_duration(c.completion_s)}, after the deadline "
                            f"in {fmt_duration(max(deadline - now_s, 0.0))} ({c.label})",
                        )
                    )
            kept = on_time
            note = "; meets the deadline"
        else:
            note = "; no site meets the deadline, earliest finish chosen"

    # (d) completion time (+ cost as delay)
    def score(c: _Candidate) -> float:
        if usd_per_hour_of_delay > 0:
            return c.completion_s + 3600.0 * c.option.cost_usd / usd_per_hour_of_delay
        return c.completion_s

    best = min(
        kept,
        key=lambda c: (
            score(c),
            c.option.cost_usd,
            c.option.site != job.home_site,
            c.option.site,
            c.option.gpu_type,
        ),
    )
    reason = (
        f"{best.label}: done in {fmt_duration(best.completion_s)} "
        f"(wait {fmt_duration(best.option.est_wait_s)}, transfer {fmt_duration(best.transfer_s)}, "
        f"run {fmt_duration(best.option.run_s)}), ${best.option.cost_usd:.2f}; "
        f"best of {len(kept)}{note}"
    )
    return _decision(best, score(best), reason, rejected)


def blind_choice(job: FedJob, options: Sequence[SiteOption], topo: Topology) -> SiteDecision:
    """The locality-blind baseline: the option with the most free GPUs (ties by name).

    It ignores data and latency when deciding, as a federation that only balances load
    would; `transfer_s` is still reported so the simulator charges the move. Only an
    option that cannot reach the dataset at all is skipped: the job could not run there.
    """
    rejected: list[tuple[str, str]] = []
    live: list[_Candidate] = []
    for opt in options:
        transfer = _transfer(job, opt, topo)
        if math.isinf(transfer):
            rejected.append((opt.site, f"no path to dataset {job.dataset}"))
        else:
            live.append(_Candidate(opt, transfer))
    if not live:
        return _refusal(f"job {job.job_id}: no site offers this job", rejected)
    best = min(live, key=lambda c: (-c.option.free_gpus, c.option.site, c.option.gpu_type))
    reason = (
        f"{best.label}: most free GPUs ({best.option.free_gpus}); "
        f"locality ignored (transfer {fmt_duration(best.transfer_s)})"
    )
    return _decision(best, best.completion_s, reason, rejected)

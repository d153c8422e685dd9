"""Online service generators: a daily peak (`diurnal-service`) and traffic shaped like
Azure's LLM inference trace (`azure-service`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpupool.domain.model import MILLI_PER_GPU
from gpupool.errors import SpecError
from gpupool.sim.scenario.generators.params import DAY_S, HOUR_S, GenContext, Params
from gpupool.sim.scenario.generators.traces import (
    AZURE_DIR,
    AZURE_FILES,
    azure_minute_shape,
    trace_file,
)
from gpupool.sim.scenario.workload import LoadCurve, ServiceSpec, Workload


def service_spec(p: Params, load: LoadCurve) -> ServiceSpec:
    slo, base = p.pos("slo_p99_ms"), p.pos("base_p99_ms")
    if base > slo:
        raise SpecError(
            f"generator {p.generator!r}: base_p99_ms ({base:g}) must not exceed slo_p99_ms "
            f"({slo:g}): a replica at its rated load must meet the SLO"
        )
    lo = p.int_("min_replicas", lo=0)
    return ServiceSpec(
        name=p.name(),
        team=p.text("team"),
        load=load,
        replica_rps=p.pos("replica_rps"),
        slo_p99_ms=slo,
        base_p99_ms=base,
        replica_gpu_milli=p.int_("replica_gpu_milli", lo=1, hi=MILLI_PER_GPU),
        min_replicas=lo,
        max_replicas=p.int_("max_replicas", lo=lo),
        gpu_models=frozenset(p.texts("gpu_models")),
        priority=p.int_("priority"),
        user_region=p.text("user_region") if p.given("user_region") else None,
        latency_bound_ms=p.pos("latency_bound_ms") if p.given("latency_bound_ms") else None,
    )


def diurnal_service(
    params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext
) -> Workload:
    """An online service at base_rps, ramping linearly over ramp_min up to peak_rps, holding it
    from peak_start_h for peak_hours each day, then ramping back down: the classic daily peak.
    The ramps lie outside the peak window."""
    p = Params(params, "diurnal-service")
    base, peak = p.num("base_rps", lo=0), p.num("peak_rps", lo=0)
    start_h, hours = p.num("peak_start_h", lo=0, hi=24), p.num("peak_hours", lo=0, hi=24)
    ramp_s = p.num("ramp_min", lo=0) * 60.0
    hold_s = hours * HOUR_S
    if hold_s + 2 * ramp_s > DAY_S:
        raise SpecError(
            f"generator 'diurnal-service': peak_hours ({hours:g}) plus two ramps of ramp_min "
            f"({ramp_s / 60:g}) exceed a day; shorten one of them"
        )
    # The curve starts where the ramp up starts; LoadCurve's period wraps the rest of the day.
    t0 = (start_h * HOUR_S - ramp_s) % DAY_S
    load = LoadCurve(
        times_s=(t0, t0 + ramp_s, t0 + ramp_s + hold_s, t0 + 2 * ramp_s + hold_s),
        rps=(base, peak, peak, base),
        period_s=DAY_S,
    )
    return Workload(services=(service_spec(p, load),))


def azure_envelope(
    t_s: np.ndarray, peak_hour: float, day_rps: float, night_rps: float
) -> np.ndarray:
    """Raised cosine: day_rps at peak_hour, night_rps 12 h away."""
    phase = 2.0 * np.pi * (t_s / HOUR_S - peak_hour) / 24.0
    return night_rps + (day_rps - night_rps) * 0.5 * (1.0 + np.cos(phase))


def azure_service(
    params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext
) -> Workload:
    """An online service shaped like Azure LLM inference (2023) traffic.

    Measured: the per-minute arrival rate (60 s windows) of the trace's one recorded hour,
    over the whole minutes in which every chosen file (`file`: both, code or conv) was
    recording, normalised to mean 1; this short-term burstiness is tiled minute by minute
    across the day. Synthesized: the day shape, a raised cosine with day_rps at peak_hour and
    night_rps 12 h away, which multiplies the tiled burstiness. The product is sampled every
    60 s for one day and repeats daily.
    """
    p = Params(params, "azure-service")
    which = p.text("file", ["both", *AZURE_FILES, *AZURE_FILES.values()])
    keys = list(AZURE_FILES) if which == "both" else [which]
    paths = tuple(trace_file(ctx, "azure-service", AZURE_DIR / AZURE_FILES.get(k, k)) for k in keys)
    peak_hour = p.num("peak_hour", lo=0, hi=24)
    day, night = p.num("day_rps", lo=0), p.num("night_rps", lo=0)
    shape = np.array(azure_minute_shape(paths))
    times = np.arange(int(DAY_S // 60)) * 60.0
    burst = shape[np.arange(times.size) % shape.size]
    rps = azure_envelope(times, peak_hour, day, night) * burst
    load = LoadCurve(tuple(times.tolist()), tuple(rps.tolist()), period_s=DAY_S)
    return Workload(services=(service_spec(p, load),))

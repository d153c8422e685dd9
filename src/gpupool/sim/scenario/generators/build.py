"""A scenario's `workload:` entries turned into one Workload: each entry through the
generator it names, with its own seeded random stream and its world keys attached."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from gpupool.errors import SpecError
from gpupool.sim.scenario.generators.jobs import (
    backlog,
    finetune,
    itp,
    mixed,
    model_jobs,
    single_job,
)
from gpupool.sim.scenario.generators.params import GenContext, WorkloadGenerator
from gpupool.sim.scenario.generators.services import azure_service, diurnal_service
from gpupool.sim.scenario.usage import LatencyUpdate, UsageOverride, parse_updates, parse_usage
from gpupool.sim.scenario.workload import Workload

GENERATORS: dict[str, WorkloadGenerator] = {
    "model-jobs": model_jobs,
    "job": single_job,
    "finetune": finetune,
    "diurnal-service": diurnal_service,
    "azure-service": azure_service,
    "mixed": mixed,
    "backlog": backlog,
    "itp": itp,
}


WORLD_KEYS = frozenset({"usage", "update"})
"""Entry keys that describe the simulated world's measurements, not the jobs the scheduler
sees: `usage:` (what the entry's jobs measure on their cards, gpupool.sim.scenario.usage) and, for a
service, `update:` (a model update that moves its base p99 from a time on)."""


def _with_world(part: Workload, entry: Mapping[str, object], where: str) -> Workload:
    """The entry's world keys attached to the jobs and services it made."""
    usage: dict[str, UsageOverride] = {}
    updates: dict[str, tuple[LatencyUpdate, ...]] = {}
    if entry.get("usage") is not None:
        over = parse_usage(entry["usage"], where)
        usage = {j.job_id: over for j in part.jobs} | {s.name: over for s in part.services}
    if entry.get("update") is not None:
        if not part.services:
            raise SpecError(f"{where}: update: moves a service's latency; this entry has none")
        found = parse_updates(entry["update"], where)
        updates = {s.name: found for s in part.services}
    if not usage and not updates:
        return part
    return replace(part, usage={**part.usage, **usage}, updates={**part.updates, **updates})


def build_workload(entries: Sequence[Mapping[str, object]], seed: int, ctx: GenContext) -> Workload:
    """All entries' jobs and services. Entry k draws from default_rng([seed, k])."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise SpecError(f"seed must be a whole number >= 0, got {seed!r}")
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise SpecError("workload must be a list of generator entries")
    total = Workload()
    names: dict[str, int] = {}
    for k, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise SpecError(f"workload entry {k}: expected a mapping with a `generator:` key")
        gen = entry.get("generator")
        if gen is None:
            raise SpecError(
                f"workload entry {k}: missing `generator:`; known: {', '.join(GENERATORS)}"
            )
        if not isinstance(gen, str) or gen not in GENERATORS:
            raise SpecError(
                f"workload entry {k}: unknown generator {gen!r}; known: {', '.join(GENERATORS)}"
            )
        name = entry.get("name")
        if name is None:
            name = f"{gen}{k}"
        if not isinstance(name, str) or not name.strip():
            raise SpecError(f"workload entry {k} ({gen}): name must be a non-empty string")
        if name in names:
            raise SpecError(
                f"workload entry {k} ({gen}): name {name!r} is already used by entry "
                f"{names[name]}; give each entry its own name"
            )
        names[name] = k
        rng = np.random.default_rng([int(seed), k])
        params = {key: v for key, v in entry.items() if key not in WORLD_KEYS}
        try:
            part = GENERATORS[gen]({**params, "name": name}, rng, ctx)
            part = _with_world(part, entry, f"generator {gen!r}")
        except SpecError as err:
            raise SpecError(f"workload entry {k} ({gen}, name {name!r}): {err}") from err
        total = total + part
    ids = [j.job_id for j in total.jobs] + [s.name for s in total.services]
    dups = [i for i, n in Counter(ids).items() if n > 1]
    if dups:
        dup = dups[0]
        raise SpecError(
            f"job/service id {dup!r} occurs twice in the workload; rename the entries so no "
            "entry's name is another's job id prefix"
        )
    return total

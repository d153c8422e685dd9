"""Workload generators: turn a scenario's `workload:` entries into jobs and services.

Each entry names a generator and its parameters. Times are in hours in YAML (suffix `_h`,
or `_min`, `_day`, `_s` where named so) and become seconds in the specs; scenario time 0 is
midnight of day 0, which is what the day/night shapes key on. Entry k draws from its own
child generator `default_rng([seed, k])`, so adding an entry never changes the others, and
prefixes its job ids with its `name` so ids stay unique across the workload.

Contract: a generator is a function (parameters, rng, GenContext) -> Workload that draws
only from the rng it is given and checks its parameters through `Params`, so a bad value
is a SpecError naming the generator and the key. To add one: list its parameters and
defaults in PARAMETERS (params.py), write it beside its family (jobs.py for batch jobs,
services.py for online services) and name it in GENERATORS (build.py). Modules inside
this package import each other, never this `__init__`.
"""

from gpupool.sim.scenario.generators.build import GENERATORS, WORLD_KEYS, build_workload
from gpupool.sim.scenario.generators.params import (
    DAY_S,
    HOUR_S,
    PARAMETERS,
    REQUIRED,
    GenContext,
    Params,
    WorkloadGenerator,
)
from gpupool.sim.scenario.generators.services import azure_envelope
from gpupool.sim.scenario.generators.traces import azure_minute_shape, lognormal_params

__all__ = [
    "DAY_S",
    "GENERATORS",
    "HOUR_S",
    "PARAMETERS",
    "REQUIRED",
    "WORLD_KEYS",
    "GenContext",
    "Params",
    "WorkloadGenerator",
    "azure_envelope",
    "azure_minute_shape",
    "build_workload",
    "lognormal_params",
]

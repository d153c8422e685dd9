"""A job's submit-time fields, written once: the store's NewJob and JobRow, the API's
answers and its JobIn mapping are derived from JobFields.

Adding a field: give it a default here (old rows and old clients lack it), a column in
gpupool.server.store.tables with its migration, and, where the API takes it under another
name or unit, a line in the API's table (gpupool.server.api.schemas);
tests/server/api/test_job_fields.py fails until the store and the API carry it. Imports only
the standard library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobFields:
    """What a user submits; everything the scheduler later learns lives in a JobRow.

    The first six are positional (`NewJob("j", "ml", "training", 0, 1, ("true",))`)."""

    name: str
    team: str
    kind: str
    priority: int
    gpu_count: int
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    gpu_model: str | None = None
    checkpoint_every_s: float | None = None
    grace_s: float = 60.0
    max_retries: int = 0
    duration_s: float | None = None
    owner: str | None = None
    """The name of the token that submitted it (stored as `owner_token`)."""
    dataset: str | None = None
    """A data location of the federation topology the job reads (free text in the store)."""
    dataset_gb: float = 0.0
    deadline_at: float | None = None
    """Absolute Unix time (s) by which the job should finish."""
    user_region: str | None = None
    latency_bound_ms: float | None = None
    """Only meaningful for online-inference; needs user_region."""
    state_gib_per_gpu: float = 0.0
    """Checkpoint size: GiB of state per GPU the job writes when preempted (and reads back
    when resumed); 0: it vacates its GPUs at once."""
    sizing: Mapping[str, Any] | None = None
    """A job given by its model: the planner's PlanRequest as a mapping
    (gpupool.sizing.request_json); the core then sizes it per GPU type.
    gpupool.sizing.request_json.plan_request_of(job) makes it a PlanRequest again."""
    time_limit_s: float | None = None
    """Wall time one run may take (since its start or resume); None: no limit."""
    gpu_milli: int = 1000
    """The share of its one GPU a job asks for (`--gpus 0.25`: 250); 1000: whole GPUs."""
    gpu_mem_mib: int | None = None
    """GPU memory a sharing job asks for (`--gpu-mem 20GiB`); the core sizes its share
    per GPU type (memory over the card's). None: `gpu_milli` as given."""
    service: str | None = None
    """The service this job is a replica of (the core made it); None: a job of its own."""
    gpu_count_min: int | None = None
    """An elastic job (`--gpus 2..4`): it runs on this many GPUs up to gpu_count, lending
    the rest to online work at its peak. None: exactly gpu_count."""
    user: str | None = None
    """Who submitted it inside its team (`--user`; stored as `user_name`): fair share
    orders a team's queue by its users' use. None: the submitting token's name."""
    topology: str | None = None
    """A gang runs inside one domain of this topology level (`--topology rack`) or waits."""
    topology_preferred: str | None = None
    """A gang runs inside one domain of this level when one has room (`--topology-preferred`)."""

    def __post_init__(self) -> None:
        # a list or a caller's dict would make two equal specs compare unequal or change later
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", dict(self.env))
        if self.sizing is not None:
            # as JSON reads it back (lists, not tuples), so a stored spec equals its NewJob
            object.__setattr__(self, "sizing", as_json(self.sizing))


JOB_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(JobFields))
"""The names of the submit-time fields, in their order."""


def as_json(value: Any) -> Any:
    """A copy of a JSON-like value in the types a JSON column reads back as."""
    if isinstance(value, Mapping):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value

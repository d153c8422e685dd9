"""A fake fleet: GPUs named on the command line (`--fake-gpus 4xA100-80GB`) whose readings
follow from the load the service says it runs, calibrated on the H200. For tests, demos and
the nodes of a Ray cluster without a GPU."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpupool.energy.power import PowerModel
from gpupool.energy.powercap import SetPowerCap
from gpupool.energy.thermal import ThermalModel
from gpupool.errors import NotFoundError, SpecError
from gpupool.ports.telemetry.base import (
    ApplyResult,
    GpuInfo,
    GpuSample,
    Telemetry,
    ecc_problem,
    lost_sample,
    xid_problem,
)
from gpupool.sizing.catalog import Catalog, load_catalog

# What a fake GPU reports for its clocks: the H200's maxima (h200-colocation.json static).
FAKE_MAX_SM_MHZ: Final = 1980
FAKE_MEM_MHZ: Final = 3201
#: A fake fleet larger than this is a typo, not a test.
MAX_FAKE_GPUS: Final = 1024

_FLEET_PART: Final = re.compile(
    r"^(?:(\d+)\s*[x×*]\s*)?(?:(\d+)\s*[x×*]\s*)?([^@]*?)\s*((?:@[^@]*)*)$", re.IGNORECASE
)
_FLEET_EXAMPLE: Final = (
    "write it like 4xA100-80GB or 2xH100,2xRTX-4090, or as nodes with labels: "
    "2x8xA100-80GB@rack=r1,2x8xA100-80GB@rack=r2"
)


@dataclass(frozen=True)
class FakeNode:
    """A node of a fake fleet given as nodes (`2x8xA100-80GB@rack=r1`: two such nodes)."""

    name: str
    model: str
    gpu_count: int
    labels: tuple[tuple[str, str], ...]


def _parts(spec: str) -> list[tuple[int, int, str, tuple[tuple[str, str], ...], bool]]:
    """Each part's (nodes, GPUs per node, model, labels, given as nodes)."""
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in parts):
        raise SpecError(f"fake fleet {spec!r}: empty part; {_FLEET_EXAMPLE}")
    out = []
    for part in parts:
        match = _FLEET_PART.match(part)
        if match is None or not match.group(3):
            raise SpecError(f"fake fleet {spec!r}: cannot read {part!r}; {_FLEET_EXAMPLE}")
        first, second, name, tail = match.groups()
        labels: dict[str, str] = {}
        for word in tail.split("@")[1:]:
            key, eq, value = word.partition("=")
            if not (eq and key and value) or not all(c.isalnum() or c == "-" for c in key):
                raise SpecError(
                    f"fake fleet {spec!r}: label {word!r}: write @KEY=VALUE (a key of letters, "
                    f"digits and -); {_FLEET_EXAMPLE}"
                )
            labels[key] = value
        if second is not None:
            nodes, count = int(first), int(second)
        else:
            nodes, count = 1, 1 if first is None else int(first)
        as_nodes = second is not None or bool(labels)
        out.append((nodes, count, name.strip(), tuple(sorted(labels.items())), as_nodes))
    return out


def fake_nodes(spec: str) -> tuple[FakeNode, ...]:
    """The nodes of a fake fleet given as nodes or with labels (`node1`, `node2`, ... in
    order); () for the plain form (`4xA100-80GB`: one node per model, as on one machine)."""
    parts = _parts(spec)
    if not any(as_nodes for *_, as_nodes in parts):
        return ()
    out: list[FakeNode] = []
    for nodes, count, name, labels, _ in parts:
        model = parse_fleet(f"1x{name}")[0].model
        for _ in range(nodes):
            out.append(FakeNode(f"node{len(out) + 1}", model, count, labels))
    return tuple(out)


def parse_fleet(spec: str, catalog: Catalog | None = None) -> list[GpuInfo]:
    """GPUs of a fake fleet: 'COUNTxMODEL' parts separated by commas, in order.

    Memory and the power limit (the TDP) come from the catalogue; clocks are the H200's.
    """
    cat = catalog if catalog is not None else load_catalog()
    out: list[GpuInfo] = []
    for nodes, per_node, name, _, _ in _parts(spec):
        count = nodes * per_node
        if count < 1:
            raise SpecError(f"fake fleet {spec!r}: {name!r} has no GPUs; {_FLEET_EXAMPLE}")
        if name not in cat:
            raise SpecError(
                f"fake fleet {spec!r}: unknown GPU {name!r}; known GPUs: "
                f"{', '.join(cat.names())} ({_FLEET_EXAMPLE})"
            )
        gpu = cat[name]
        if len(out) + count > MAX_FAKE_GPUS:
            raise SpecError(
                f"fake fleet {spec!r}: more than {MAX_FAKE_GPUS} GPUs; use a smaller fleet"
            )
        for _ in range(count):
            index = len(out)
            out.append(
                GpuInfo(
                    index=index,
                    uuid=f"FAKE-GPU-{index}",
                    model=gpu.name,
                    mem_total_mib=round(gpu.memory_gib * 1024),
                    power_limit_w=gpu.tdp_w,
                    max_sm_mhz=FAKE_MAX_SM_MHZ,
                    nvml_name=gpu.label,
                    min_power_limit_w=None,
                    max_power_limit_w=gpu.tdp_w,
                )
            )
    return out


@dataclass
class _FakeGpu:
    """Mutable state of one fake GPU (private; samples are the frozen view)."""

    info: GpuInfo
    util_pct: float = 0.0
    mem_util_pct: float = 0.0
    mem_used_mib: int = 0
    pids: tuple[int, ...] = ()
    limit_w: float | None = None
    locked_sm_mhz: int | None = None
    fault: str = ""
    ecc: int = 0
    xid: int | None = None
    """The critical XID the GPU reported, if any (it stays until `repair`)."""
    inlet_c: float | None = None
    """The air it breathes; None: the thermal model's ambient (30 C)."""


FAULTS: Final = ("lost", "ecc", "xid", "repair")
"""The faults `FakeTelemetry.inject` makes (repair clears them all)."""

FAKE_USE_ENV: Final = "GPUPOOL_FAKE_USE"
"""A job's declared use of each of its whole cards on a fake fleet, `SM_PCT,MEM_MIB`
(e.g. `0,0` for a job that holds a card and never touches it); without it a job on a
fake card reads as 100 % busy with 1 GiB used."""


def declared_use(env: Mapping[str, str]) -> tuple[float, int] | None:
    """(SM %, memory MiB) a job's environment declares for the fake fleet; None when it
    declares nothing or not in that form (the default load then)."""
    text = env.get(FAKE_USE_ENV)
    if text is None:
        return None
    try:
        sm, mem = text.split(",")
        return min(100.0, max(0.0, float(sm))), max(0, int(mem))
    except ValueError:
        return None


class FakeTelemetry(Telemetry):
    """A fleet that exists only in the service: readings follow from the load it is told.

    It is the fake implementation of NVML, for tests and demos: no process touches a GPU,
    the service tells it what runs where (`set_load`), and a job may declare what it uses
    of each card in its environment (`GPUPOOL_FAKE_USE=SM_PCT,MEM_MIB`), so a test can
    plant a job that never uses its card or one that uses a quarter of it.

    Power is linear in utilisation between the H200's measured idle draw (103 of 700 W)
    and its compute-bound draw (620 of 700 W, middle of 607-633 W), as fractions of each
    card's TDP (shared/calibration/README.md, gpupool.energy.power.PowerModel.calibrated),
    capped by the power limit. Temperature is the thermal model's steady state,
    30 C + power × 50/700 C/W (gpupool.energy.thermal, assumed until thermal.py has run).
    Clocks are fixed at the H200's maxima unless a command locks the SM clock lower.
    """

    def __init__(
        self,
        spec: str,
        catalog: Catalog | None = None,
        inlet_c: Mapping[int, float] | None = None,
    ) -> None:
        """inlet_c: the air some GPUs breathe (a hot aisle), by index; others 30 C."""
        self._gpus = [_FakeGpu(info) for info in parse_fleet(spec, catalog)]
        for index, c in (inlet_c or {}).items():
            self._gpu(index).inlet_c = float(c)
        power = PowerModel.calibrated()
        self._idle_frac = power.idle_frac
        self._busy_frac = power.compute_bound_frac
        self._thermal = ThermalModel.calibrated()
        self._applied: list[SetPowerCap] = []
        self._lock = threading.Lock()

    def _gpu(self, index: int) -> _FakeGpu:
        if not 0 <= index < len(self._gpus):
            raise NotFoundError(
                f"fake fleet has no GPU {index}; its GPUs are 0-{len(self._gpus) - 1}"
            )
        return self._gpus[index]

    def inventory(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    def set_load(
        self,
        index: int,
        util_pct: float,
        mem_used_mib: int,
        pids: tuple[int, ...] = (),
        mem_util_pct: float | None = None,
    ) -> None:
        """What runs on GPU `index` now; memory is split evenly over `pids`.

        mem_util_pct defaults to util_pct (the fake has no model of memory traffic).
        """
        gpu = self._gpu(index)
        mem_util = util_pct if mem_util_pct is None else mem_util_pct
        for name, pct in (("util_pct", util_pct), ("mem_util_pct", mem_util)):
            if not 0.0 <= pct <= 100.0:
                raise SpecError(f"fake GPU {index}: {name} must lie in [0, 100], got {pct}")
        if not 0 <= mem_used_mib <= gpu.info.mem_total_mib:
            raise SpecError(
                f"fake GPU {index}: mem_used_mib must lie in [0, {gpu.info.mem_total_mib}] "
                f"({gpu.info.model}), got {mem_used_mib}"
            )
        with self._lock:
            gpu.util_pct = float(util_pct)
            gpu.mem_util_pct = float(mem_util)
            gpu.mem_used_mib = int(mem_used_mib)
            gpu.pids = tuple(pids)

    def set_inlet(self, index: int, inlet_c: float | None) -> None:
        """The air GPU `index` breathes from now on (None: ambient): its temperature follows."""
        gpu = self._gpu(index)
        with self._lock:
            gpu.inlet_c = inlet_c

    def fail_gpu(self, index: int, problem: str = "fell off the bus (injected fault)") -> None:
        """From now on the GPU reads as lost, with `problem` as its problem sentence."""
        gpu = self._gpu(index)
        with self._lock:
            gpu.fault = problem or "fell off the bus (injected fault)"

    def ecc_error(self, index: int, count: int = 1) -> None:
        """Add `count` uncorrected ECC errors to the GPU's volatile counter."""
        if count < 1:
            raise SpecError(f"fake GPU {index}: ECC error count must be >= 1, got {count}")
        gpu = self._gpu(index)
        with self._lock:
            gpu.ecc += count

    def xid_error(self, index: int, xid: int) -> None:
        """The GPU reports critical XID `xid` (as NVML's event would): it reads unhealthy
        with the XID's problem sentence until `repair`."""
        if xid < 1:
            raise SpecError(f"fake GPU {index}: an XID is a positive number, got {xid}")
        gpu = self._gpu(index)
        with self._lock:
            gpu.xid = xid

    def repair(self, index: int) -> None:
        """Clear injected faults, XIDs and ECC errors (a reset GPU)."""
        gpu = self._gpu(index)
        with self._lock:
            gpu.fault = ""
            gpu.ecc = 0
            gpu.xid = None

    def inject(
        self, index: int, fault: str, *, xid: int | None = None, count: int = 1, problem: str = ""
    ) -> str:
        """One of `FAULTS` on GPU `index` (the admin's POST /v1/admin/fake-faults): lost
        (`fail_gpu`, with `problem`), ecc (`count` errors), xid (`xid`), repair. Says what
        it did, in a few words."""
        if fault == "lost":
            self.fail_gpu(index, problem or "fell off the bus (injected fault)")
            return f"lost: {problem or 'fell off the bus (injected fault)'}"
        if fault == "ecc":
            self.ecc_error(index, count)
            return f"{count} uncorrected ECC error(s)"
        if fault == "xid":
            if xid is None:
                raise SpecError("an xid fault needs the XID, e.g. 79 (fell off the bus)")
            self.xid_error(index, xid)
            return f"XID {xid}"
        if fault == "repair":
            self.repair(index)
            return "repaired"
        raise SpecError(f"unknown fake fault {fault!r}; choose one of {', '.join(FAULTS)}")

    @property
    def applied(self) -> list[SetPowerCap]:
        """Every command apply() accepted, oldest first."""
        with self._lock:
            return list(self._applied)

    def power_w(self, index: int) -> float:
        """The draw a GPU shows now (the same formula sample() uses)."""
        with self._lock:
            return self._power_w(self._gpu(index))

    def _power_w(self, gpu: _FakeGpu) -> float:
        tdp = gpu.info.power_limit_w or 0.0
        frac = self._idle_frac + (self._busy_frac - self._idle_frac) * gpu.util_pct / 100.0
        draw = frac * tdp
        limit = gpu.limit_w if gpu.limit_w is not None else tdp
        return min(draw, limit)

    def sample(self, now_s: float) -> list[GpuSample]:
        with self._lock:
            return [self._sample_one(g, now_s) for g in self._gpus]

    def _sample_one(self, gpu: _FakeGpu, now_s: float) -> GpuSample:
        info = gpu.info
        if gpu.fault:
            return lost_sample(info, gpu.fault, now_s, gpu.ecc)
        power = self._power_w(gpu)
        limit = gpu.limit_w if gpu.limit_w is not None else info.power_limit_w
        sm = (
            FAKE_MAX_SM_MHZ
            if gpu.locked_sm_mhz is None
            else min(gpu.locked_sm_mhz, FAKE_MAX_SM_MHZ)
        )
        procs: tuple[tuple[int, int], ...] = ()
        if gpu.pids:
            share, rest = divmod(gpu.mem_used_mib, len(gpu.pids))
            procs = tuple((pid, share + (rest if i == 0 else 0)) for i, pid in enumerate(gpu.pids))
        healthy = gpu.ecc == 0 and gpu.xid is None
        problem = ""
        if gpu.xid is not None:
            problem = xid_problem(info.index, info.uuid, gpu.xid)
        elif gpu.ecc:
            problem = ecc_problem(info.index, info.uuid, gpu.ecc)
        return GpuSample(
            index=info.index,
            uuid=info.uuid,
            mem_total_mib=info.mem_total_mib,
            mem_used_mib=gpu.mem_used_mib,
            util_pct=gpu.util_pct,
            mem_util_pct=gpu.mem_util_pct,
            temp_c=self._thermal.steady_c(power, gpu.inlet_c),
            power_w=power,
            power_limit_w=limit,
            sm_clock_mhz=sm,
            mem_clock_mhz=FAKE_MEM_MHZ,
            ecc_uncorrected=gpu.ecc,
            processes=procs,
            healthy=healthy,
            problem=problem,
            at_s=now_s,
        )

    def apply(self, command: SetPowerCap) -> ApplyResult:
        """Record the command; its limit (None: back to TDP) shows in later samples."""
        if not 0 <= command.gpu < len(self._gpus):
            return ApplyResult(
                False, f"fake fleet has no GPU {command.gpu} (it has {len(self._gpus)})"
            )
        with self._lock:
            gpu = self._gpus[command.gpu]
            gpu.limit_w = command.power_limit_w
            gpu.locked_sm_mhz = command.locked_sm_mhz
            self._applied.append(command)
        return ApplyResult(True, "fake fleet: recorded")

    def close(self) -> None:
        """Nothing to release."""


def parse_inlet(text: str | None) -> dict[int, float]:
    """--fake-inlet 0=45,1=45 -> {0: 45.0, 1: 45.0}: the inlet air of some fake GPUs (a hot
    aisle), for `gpupool serve --fake-gpus` and `gpupool node join --fake-gpus`."""
    out: dict[int, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        gpu, sep, temp = part.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(gpu)] = float(temp)
        except ValueError:
            raise SpecError(
                f"--fake-inlet {text!r}: write GPU=CELSIUS pairs, e.g. 0=45,1=45"
            ) from None
    return out

"""What the live service knows about its GPUs: inventory, samples, power commands, signals.

Two sources behind one `Telemetry` protocol:

* `NvmlTelemetry` reads real GPUs through NVML (nvidia-ml-py, facts.md §2). Every NVML
  call goes through `_Nvml`, one small typed adapter, so the rest of the module never
  touches the untyped binding and tests can hand it a fake module.
* `FakeTelemetry` is a fleet named on the command line (`--fake-gpus 4xA100-80GB`) whose
  readings follow from the load the service says it runs, calibrated on the H200
  (shared/calibration/README.md, via gpupool.energy).

`MonitorRule` turns samples into the seed practice's periodic signals (idle GPUs to
reclaim, a busy fleet to grow) and `dcgm_name` gives the DCGM exporter name of each
sample field so /metrics reads like the dashboards operators already have.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

from gpupool.energy.power import PowerModel
from gpupool.energy.powercap import SetPowerCap
from gpupool.energy.thermal import ThermalModel
from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError
from gpupool.sizing.catalog import Catalog, load_catalog, normalise

FAKE_HINT: Final = "start with --fake-gpus 4xA100-80GB to run jobs as processes on a fake fleet"
MIB: Final = 1024 * 1024

# NVML constants (facts.md §2.2, §2.3; nvidia-ml-py 13.615.71). Kept here so a fake module
# need not define them; the tests check them against the real pynvml.
NVML_TEMPERATURE_GPU: Final = 0
NVML_CLOCK_SM: Final = 1
NVML_CLOCK_MEM: Final = 2
NVML_MEMORY_ERROR_TYPE_UNCORRECTED: Final = 1
NVML_VOLATILE_ECC: Final = 0
ERR_NOT_SUPPORTED: Final = 3
ERR_NO_PERMISSION: Final = 4
ERR_GPU_IS_LOST: Final = 15
ERR_UNKNOWN: Final = 999

# What a fake GPU reports for its clocks: the H200's maxima (h200-colocation.json static).
FAKE_MAX_SM_MHZ: Final = 1980
FAKE_MEM_MHZ: Final = 3201
#: A fake fleet larger than this is a typo, not a test.
MAX_FAKE_GPUS: Final = 1024


class NoGpuError(GpupoolError):
    """NVML cannot reach any GPU; the service can still run on a fake fleet."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"no NVIDIA GPU found ({reason}); {FAKE_HINT}")


@dataclass(frozen=True)
class GpuInfo:
    """What does not change while the service runs: identity, size, limits."""

    index: int
    uuid: str
    model: str
    """Catalogue name when the NVML name is recognised (sizing and pricing need it)."""
    mem_total_mib: int
    power_limit_w: float | None
    """The card's default limit (its TDP for the planner); None where NVML cannot say."""
    max_sm_mhz: int | None
    nvml_name: str = ""
    min_power_limit_w: float | None = None
    """Lowest settable limit (NVML constraints); CapPoint.command takes it as min_limit_w."""
    max_power_limit_w: float | None = None


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. Fields NVML could not read hold 0 and are named in `missing`."""

    index: int
    uuid: str
    mem_total_mib: int
    mem_used_mib: int
    util_pct: float
    mem_util_pct: float
    temp_c: float
    power_w: float
    power_limit_w: float | None
    sm_clock_mhz: int
    mem_clock_mhz: int
    ecc_uncorrected: int
    processes: tuple[tuple[int, int], ...]
    """(pid, used MiB) of each compute process."""
    healthy: bool
    problem: str
    """Empty when healthy; else a sentence saying what is wrong and what to do."""
    at_s: float
    missing: tuple[str, ...] = ()

    @property
    def mem_free_mib(self) -> int:
        return max(0, self.mem_total_mib - self.mem_used_mib)


@dataclass(frozen=True)
class ApplyResult:
    """Whether a power command took effect; the caller logs a failure and carries on."""

    ok: bool
    message: str


@runtime_checkable
class Telemetry(Protocol):
    """The service's view of its GPUs, real or fake."""

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self, now_s: float) -> list[GpuSample]: ...

    def apply(self, command: SetPowerCap) -> ApplyResult: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------
# Model names


_VENDOR_WORDS: Final = frozenset({"nvidia", "tesla", "geforce", "quadro"})
_MEMORY_WORDS: Final = frozenset({"hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7"})


def model_from_nvml_name(nvml_name: str, catalog: Catalog | None = None) -> str:
    """The catalogue name of a GPU NVML names ('NVIDIA H100 80GB HBM3' -> 'H100'), else the
    NVML name itself. Only whole-name matches count, so an A10 never passes for an A100."""
    cat = catalog if catalog is not None else load_catalog()
    words = normalise(nvml_name).split("-")
    while words and words[0] in _VENDOR_WORDS:
        words = words[1:]
    bare = [w for w in words if w not in _MEMORY_WORDS]
    for candidate in (nvml_name, "-".join(words), "-".join(bare)):
        if candidate and candidate in cat:
            return cat.resolve(candidate)
    return nvml_name


# ---------------------------------------------------------------------------------------
# NVML


T = TypeVar("T")


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _text(raw: object) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


class _Nvml:
    """The only code that calls the untyped binding: explicit types in, plain values out.

    Errors are the module's own NVMLError subclasses, unchanged.
    """

    def __init__(self, module: Any) -> None:
        self._m = module
        self.error: type[Exception] = module.NVMLError

    def init(self) -> None:
        self._m.nvmlInit()

    def shutdown(self) -> None:
        self._m.nvmlShutdown()

    def count(self) -> int:
        return int(self._m.nvmlDeviceGetCount())

    def handle(self, index: int) -> object:
        handle: object = self._m.nvmlDeviceGetHandleByIndex(index)
        return handle

    def name(self, h: object) -> str:
        return _text(self._m.nvmlDeviceGetName(h))

    def uuid(self, h: object) -> str:
        return _text(self._m.nvmlDeviceGetUUID(h))

    def memory_bytes(self, h: object) -> tuple[int, int]:
        """(total, used) from the v1 struct."""
        mem = self._m.nvmlDeviceGetMemoryInfo(h)
        return int(mem.total), int(mem.used)

    def utilization_pct(self, h: object) -> tuple[float, float]:
        """(kernel time %, memory read/write time %)."""
        rates = self._m.nvmlDeviceGetUtilizationRates(h)
        return float(rates.gpu), float(rates.memory)

    def temperature_c(self, h: object) -> float:
        return float(self._m.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU))

    def power_mw(self, h: object) -> int:
        return int(self._m.nvmlDeviceGetPowerUsage(h))

    def limit_mw(self, h: object) -> int:
        """The management limit now set (what nvidia-smi -pl sets)."""
        return int(self._m.nvmlDeviceGetPowerManagementLimit(h))

    def enforced_limit_mw(self, h: object) -> int:
        return int(self._m.nvmlDeviceGetEnforcedPowerLimit(h))

    def default_limit_mw(self, h: object) -> int:
        return int(self._m.nvmlDeviceGetPowerManagementDefaultLimit(h))

    def limit_constraints_mw(self, h: object) -> tuple[int, int]:
        low, high = self._m.nvmlDeviceGetPowerManagementLimitConstraints(h)
        return int(low), int(high)

    def clock_mhz(self, h: object, clock: int) -> int:
        return int(self._m.nvmlDeviceGetClockInfo(h, clock))

    def max_clock_mhz(self, h: object, clock: int) -> int:
        return int(self._m.nvmlDeviceGetMaxClockInfo(h, clock))

    def ecc_uncorrected(self, h: object) -> int:
        """Uncorrected errors since the driver loaded (volatile counter)."""
        return int(
            self._m.nvmlDeviceGetTotalEccErrors(
                h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
            )
        )

    def processes(self, h: object) -> list[tuple[int, int | None]]:
        """(pid, used bytes or None where the driver does not say)."""
        out: list[tuple[int, int | None]] = []
        for p in self._m.nvmlDeviceGetComputeRunningProcesses(h):
            used = p.usedGpuMemory
            out.append((int(p.pid), None if used is None else int(used)))
        return out

    def set_limit_mw(self, h: object, mw: int) -> None:
        self._m.nvmlDeviceSetPowerManagementLimit(h, mw)

    def lock_sm_clock(self, h: object, mhz: int) -> None:
        self._m.nvmlDeviceSetGpuLockedClocks(h, mhz, mhz)

    def reset_sm_clock(self, h: object) -> None:
        self._m.nvmlDeviceResetGpuLockedClocks(h)


class _GpuLost(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _lost_problem(index: int, uuid: str, cause: BaseException) -> str:
    return (
        f"GPU {index} ({uuid}) fell off the bus (NVML: {cause}); drain it, look for Xid 79 "
        "in dmesg, then reset the GPU (nvidia-smi -r) or reboot the node"
    )


def _ecc_problem(index: int, uuid: str, count: int) -> str:
    return (
        f"GPU {index} ({uuid}) has {count} uncorrected ECC error(s) since the driver loaded; "
        f"drain it, then reset it (nvidia-smi -r -i {index}) and replace it if they recur"
    )


def _lost_sample(info: GpuInfo, problem: str, now_s: float, ecc: int = 0) -> GpuSample:
    """A GPU NVML cannot read: nothing but its identity and what is wrong."""
    return GpuSample(
        index=info.index,
        uuid=info.uuid,
        mem_total_mib=info.mem_total_mib,
        mem_used_mib=0,
        util_pct=0.0,
        mem_util_pct=0.0,
        temp_c=0.0,
        power_w=0.0,
        power_limit_w=None,
        sm_clock_mhz=0,
        mem_clock_mhz=0,
        ecc_uncorrected=ecc,
        processes=(),
        healthy=False,
        problem=problem,
        at_s=now_s,
    )


def _w(mw: int) -> float:
    return mw / 1000.0


class NvmlTelemetry(Telemetry):
    """Real GPUs of this node through NVML. Commands need root; without it they fail softly.

    `nvml` is the pynvml module (imported when None); tests pass a fake one.
    SetPowerCap.node is not checked: the service gives each node its own telemetry.
    """

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            try:
                import pynvml  # type: ignore[import-untyped]
            except ImportError:
                raise NoGpuError(
                    "nvidia-ml-py is not installed: pip install nvidia-ml-py"
                ) from None
            nvml = pynvml
        self._api = _Nvml(nvml)
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._api.init()
        except self._api.error as exc:
            raise NoGpuError(f"NVML: {exc}") from None
        try:
            count = self._api.count()
            if count <= 0:
                raise NoGpuError("NVML sees 0 devices")
            self._inventory = [self._info(i) for i in range(count)]
        except self._api.error as exc:
            self._shutdown()
            raise NoGpuError(f"NVML: {exc}") from None
        except NoGpuError:
            self._shutdown()
            raise

    def _shutdown(self) -> None:
        with contextlib.suppress(self._api.error):
            self._api.shutdown()

    def _optional(self, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except self._api.error:
            return None

    def _info(self, index: int) -> GpuInfo:
        """Static facts of one GPU. A GPU already lost keeps its index so others keep theirs."""
        api = self._api
        try:
            h = api.handle(index)
            name = api.name(h)
            uuid = api.uuid(h)
        except api.error as exc:
            if _code(exc) not in (ERR_GPU_IS_LOST, ERR_UNKNOWN):
                raise
            return GpuInfo(index, f"GPU-LOST-{index}", f"unknown (NVML: {exc})", 0, None, None)
        mem = self._optional(lambda: api.memory_bytes(h))
        limit = self._optional(lambda: api.default_limit_mw(h))
        if limit is None:
            limit = self._optional(lambda: api.enforced_limit_mw(h))
        bounds = self._optional(lambda: api.limit_constraints_mw(h))
        return GpuInfo(
            index=index,
            uuid=uuid,
            model=model_from_nvml_name(name),
            mem_total_mib=0 if mem is None else mem[0] // MIB,
            power_limit_w=None if limit is None else _w(limit),
            max_sm_mhz=self._optional(lambda: api.max_clock_mhz(h, NVML_CLOCK_SM)),
            nvml_name=name,
            min_power_limit_w=None if bounds is None else _w(bounds[0]),
            max_power_limit_w=None if bounds is None else _w(bounds[1]),
        )

    def inventory(self) -> list[GpuInfo]:
        return list(self._inventory)

    def sample(self, now_s: float) -> list[GpuSample]:
        """One reading of every GPU; a field NVML refuses is 0 and named in `missing`."""
        with self._lock:
            if self._closed:
                raise ConflictError("telemetry is closed; start a new NvmlTelemetry to read GPUs")
            return [self._sample_one(info, now_s) for info in self._inventory]

    def _sample_one(self, info: GpuInfo, now_s: float) -> GpuSample:
        api = self._api
        missing: list[str] = []

        def read(field: str, fn: Callable[[], T], default: T, quiet: int | None = None) -> T:
            try:
                return fn()
            except api.error as exc:
                code = _code(exc)
                if code == ERR_GPU_IS_LOST:
                    raise _GpuLost(exc) from None
                if code != quiet:
                    missing.append(field)
                return default

        try:
            try:
                h = api.handle(info.index)
            except api.error as exc:
                if _code(exc) in (ERR_GPU_IS_LOST, ERR_UNKNOWN):
                    raise _GpuLost(exc) from None
                raise
            total_b, used_b = read("mem_used_mib", lambda: api.memory_bytes(h), (-1, 0))
            util, mem_util = read("util_pct", lambda: api.utilization_pct(h), (0.0, 0.0))
            temp = read("temp_c", lambda: api.temperature_c(h), 0.0)
            power = read("power_w", lambda: api.power_mw(h), 0)
            limit = read("power_limit_w", lambda: api.enforced_limit_mw(h), None)
            sm = read("sm_clock_mhz", lambda: api.clock_mhz(h, NVML_CLOCK_SM), 0)
            mem_clk = read("mem_clock_mhz", lambda: api.clock_mhz(h, NVML_CLOCK_MEM), 0)
            ecc = read("ecc_uncorrected", lambda: api.ecc_uncorrected(h), 0, ERR_NOT_SUPPORTED)
            no_procs: list[tuple[int, int | None]] = []
            procs = read("processes", lambda: api.processes(h), no_procs)
        except _GpuLost as lost:
            return _lost_sample(info, _lost_problem(info.index, info.uuid, lost.cause), now_s)
        except api.error as exc:
            problem = (
                f"GPU {info.index} ({info.uuid}): NVML cannot open it ({exc}); "
                "drain it and check the driver with nvidia-smi"
            )
            return _lost_sample(info, problem, now_s)
        healthy = ecc <= 0
        return GpuSample(
            index=info.index,
            uuid=info.uuid,
            mem_total_mib=info.mem_total_mib if total_b < 0 else total_b // MIB,
            mem_used_mib=used_b // MIB,
            util_pct=util,
            mem_util_pct=mem_util,
            temp_c=temp,
            power_w=_w(power),
            power_limit_w=None if limit is None else _w(limit),
            sm_clock_mhz=sm,
            mem_clock_mhz=mem_clk,
            ecc_uncorrected=ecc,
            processes=tuple((pid, 0 if b is None else b // MIB) for pid, b in procs),
            healthy=healthy,
            problem="" if healthy else _ecc_problem(info.index, info.uuid, ecc),
            at_s=now_s,
            missing=tuple(missing),
        )

    def apply(self, command: SetPowerCap) -> ApplyResult:
        """Set (or reset) the power limit, then lock (or unlock) the SM clock.

        A limit outside the card's range is clamped into it and the message says so.
        """
        return self._command(command.gpu, command.power_limit_w, command.locked_sm_mhz, True)

    def set_power_limit(self, index: int, power_limit_w: float | None) -> ApplyResult:
        """Only the power-limit half of apply() (None: the default), clocks left alone."""
        return self._command(index, power_limit_w, None, False)

    def current_limit_w(self, index: int) -> float | None:
        """The management limit set now (samples show the enforced one, which may be lower)."""
        with self._lock:
            if self._closed or not 0 <= index < len(self._inventory):
                return None
            api = self._api
            mw = self._optional(lambda: api.limit_mw(api.handle(index)))
        return None if mw is None else _w(mw)

    def _command(
        self, index: int, limit_w: float | None, mhz: int | None, clocks: bool
    ) -> ApplyResult:
        with self._lock:
            if self._closed:
                return ApplyResult(False, "telemetry is closed; nothing applied")
            if not 0 <= index < len(self._inventory):
                return ApplyResult(
                    False, f"no GPU {index} on this node (it has {len(self._inventory)})"
                )
            try:
                h = self._api.handle(index)
            except self._api.error as exc:
                return ApplyResult(False, f"GPU {index}: NVML cannot open it ({exc})")
            ok, msg = self._apply_limit(h, index, limit_w)
            if clocks:
                clock_ok, clock_msg = self._apply_clock(h, index, mhz)
                ok, msg = ok and clock_ok, f"{msg}; {clock_msg}"
        return ApplyResult(ok, f"GPU {index}: {msg}")

    def _apply_limit(self, h: object, index: int, limit_w: float | None) -> tuple[bool, str]:
        api = self._api
        note = ""
        target: int | None = None
        try:
            if limit_w is None:
                target = api.default_limit_mw(h)
                note = " (the default)"
            else:
                target = round(limit_w * 1000)  # as SetPowerCap.power_limit_mw
                bounds = self._optional(lambda: api.limit_constraints_mw(h))
                if bounds is not None:
                    low, high = bounds
                    clamped = min(max(target, low), high)
                    if clamped != target:
                        note = (
                            f" (clamped from {_w(target):g} W into the card's "
                            f"{_w(low):g}-{_w(high):g} W)"
                        )
                    target = clamped
            api.set_limit_mw(h, target)
        except api.error as exc:
            if _code(exc) == ERR_NO_PERMISSION:
                watts = "<default W>" if target is None else f"{_w(target):g}"
                return False, f"needs root: nvidia-smi -i {index} -pl {watts}"
            return False, f"power limit not set (NVML: {exc})"
        return True, f"power limit {_w(target):g} W{note}"

    def _apply_clock(self, h: object, index: int, mhz: int | None) -> tuple[bool, str]:
        api = self._api
        try:
            if mhz is None:
                api.reset_sm_clock(h)
            else:
                api.lock_sm_clock(h, mhz)
        except api.error as exc:
            code = _code(exc)
            if mhz is None and code == ERR_NOT_SUPPORTED:
                return True, "no SM clock lock to reset (not supported on this GPU)"
            if code == ERR_NO_PERMISSION:
                flag = "-rgc" if mhz is None else f"-lgc {mhz},{mhz}"
                return False, f"needs root: nvidia-smi -i {index} {flag}"
            what = "SM clock lock not reset" if mhz is None else "SM clock not locked"
            return False, f"{what} (NVML: {exc})"
        return True, "SM clock unlocked" if mhz is None else f"SM clock locked at {mhz} MHz"

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._shutdown()

    def __enter__(self) -> NvmlTelemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# Fake fleet

_FLEET_PART: Final = re.compile(r"^(?:(\d+)\s*[x×*]\s*)?(\S.*)$", re.IGNORECASE)
_FLEET_EXAMPLE: Final = "write it like 4xA100-80GB or 2xH100,2xRTX-4090"


def parse_fleet(spec: str, catalog: Catalog | None = None) -> list[GpuInfo]:
    """GPUs of a fake fleet: 'COUNTxMODEL' parts separated by commas, in order.

    Memory and the power limit (the TDP) come from the catalogue; clocks are the H200's.
    """
    cat = catalog if catalog is not None else load_catalog()
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in parts):
        raise SpecError(f"fake fleet {spec!r}: empty part; {_FLEET_EXAMPLE}")
    out: list[GpuInfo] = []
    for part in parts:
        match = _FLEET_PART.match(part)
        if match is None:  # pragma: no cover - the pattern accepts any non-blank part
            raise SpecError(f"fake fleet {spec!r}: cannot read {part!r}; {_FLEET_EXAMPLE}")
        count = 1 if match.group(1) is None else int(match.group(1))
        name = match.group(2).strip()
        if count < 1:
            raise SpecError(f"fake fleet {spec!r}: {part!r} has no GPUs; {_FLEET_EXAMPLE}")
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
    inlet_c: float | None = None
    """The air it breathes; None: the thermal model's ambient (30 C)."""


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

    def repair(self, index: int) -> None:
        """Clear injected faults and ECC errors (a reset GPU)."""
        gpu = self._gpu(index)
        with self._lock:
            gpu.fault = ""
            gpu.ecc = 0

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
            return _lost_sample(info, gpu.fault, now_s, gpu.ecc)
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
        healthy = gpu.ecc == 0
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
            problem="" if healthy else _ecc_problem(info.index, info.uuid, gpu.ecc),
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


# ---------------------------------------------------------------------------------------
# Monitoring rule


@dataclass(frozen=True)
class Signals:
    """What one monitoring window says: GPUs idle enough to take back, a fleet to grow."""

    reclaimable: tuple[int, ...]
    scale_out: bool
    mean_util_pct: float
    window_s: float


class MonitorRule:
    """The seed practice's rule: every `every_s` (5 minutes), GPUs averaging under
    `low_pct` utilisation are reclaimable, and a fleet averaging over `high_pct` should
    grow. Lost or faulty GPUs read 0% but are broken, not idle, so their samples are left
    out; the fleet mean is the mean of per-GPU means, so a GPU sampled more often does not
    weigh more.
    """

    def __init__(self, every_s: float = 300.0, low_pct: float = 30.0, high_pct: float = 90.0):
        if not every_s > 0:
            raise SpecError(f"monitor rule: every_s must be > 0, got {every_s}")
        if not 0.0 <= low_pct <= high_pct <= 100.0:
            raise SpecError(
                f"monitor rule: need 0 <= low_pct <= high_pct <= 100, got {low_pct}, {high_pct}"
            )
        self.every_s = float(every_s)
        self.low_pct = float(low_pct)
        self.high_pct = float(high_pct)
        self._start_s: float | None = None
        self._sums: dict[int, float] = {}
        self._counts: dict[int, int] = {}

    def observe(self, samples: list[GpuSample]) -> None:
        """Add samples to the window; the first ones start it if no evaluation has."""
        for s in samples:
            if self._start_s is None:
                self._start_s = s.at_s
            if not s.healthy:
                continue
            self._sums[s.index] = self._sums.get(s.index, 0.0) + s.util_pct
            self._counts[s.index] = self._counts.get(s.index, 0) + 1

    def due(self, now_s: float) -> bool:
        """True once a whole window has passed since it started."""
        return self._start_s is not None and now_s - self._start_s >= self.every_s

    def evaluate(self, now_s: float) -> Signals:
        """The window's signals; the next window starts at now_s."""
        means = {i: self._sums[i] / n for i, n in self._counts.items() if n > 0}
        window_s = 0.0 if self._start_s is None else max(0.0, now_s - self._start_s)
        fleet = sum(means.values()) / len(means) if means else 0.0
        signals = Signals(
            reclaimable=tuple(sorted(i for i, m in means.items() if m < self.low_pct)),
            scale_out=bool(means) and fleet > self.high_pct,
            mean_util_pct=fleet,
            window_s=window_s,
        )
        self._start_s = now_s
        self._sums.clear()
        self._counts.clear()
        return signals


# ---------------------------------------------------------------------------------------
# DCGM names

DCGM_NAMES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "mem_used_mib": "DCGM_FI_DEV_FB_USED",
        "mem_free_mib": "DCGM_FI_DEV_FB_FREE",
        "util_pct": "DCGM_FI_DEV_GPU_UTIL",
        "mem_util_pct": "DCGM_FI_DEV_MEM_COPY_UTIL",
        "temp_c": "DCGM_FI_DEV_GPU_TEMP",
        "power_w": "DCGM_FI_DEV_POWER_USAGE",
        "power_limit_w": "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "sm_clock_mhz": "DCGM_FI_DEV_SM_CLOCK",
        "mem_clock_mhz": "DCGM_FI_DEV_MEM_CLOCK",
        "ecc_uncorrected": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    }
)
"""Sample field -> DCGM exporter metric (facts.md §2.6), in the exporter's units."""

_DCGM_ALIASES: Final = {"free": "mem_free_mib", "mem_free": "mem_free_mib"}


def dcgm_name(field: str) -> str:
    """The DCGM exporter name of a sample field, so /metrics matches existing dashboards."""
    key = _DCGM_ALIASES.get(field, field)
    try:
        return DCGM_NAMES[key]
    except KeyError:
        raise NotFoundError(
            f"no DCGM metric for field {field!r}; fields with one: {', '.join(DCGM_NAMES)}"
        ) from None

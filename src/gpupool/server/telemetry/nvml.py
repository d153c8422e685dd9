"""The GPUs of this node through NVML (nvidia-ml-py, facts.md §2): `NvmlTelemetry`, the real
implementation of the telemetry port (`gpupool.ports.telemetry.base.Telemetry`).

Every NVML call goes through `_Nvml`, one small typed adapter, so the rest of the module
never touches the untyped binding and tests can hand it a fake module. Without a GPU,
`NoGpuError` says how to start on a fake fleet instead (`gpupool.ports.telemetry.fake`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

from gpupool.energy.powercap import SetPowerCap
from gpupool.errors import ConflictError, GpupoolError
from gpupool.ports.telemetry.base import (
    XID_PROBLEMS,
    ApplyResult,
    GpuInfo,
    GpuSample,
    Telemetry,
    ecc_problem,
    lost_sample,
    xid_problem,
)
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
ERR_TIMEOUT: Final = 10
NVML_EVENT_XID_CRITICAL: Final = 0x8
"""nvmlEventTypeXidCriticalError: the event whose data is the XID number."""
ERR_UNKNOWN: Final = 999


class NoGpuError(GpupoolError):
    """NVML cannot reach any GPU; the service can still run on a fake fleet."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"no NVIDIA GPU found ({reason}); {FAKE_HINT}")


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

    def event_set(self) -> object:
        created: object = self._m.nvmlEventSetCreate()
        return created

    def register_xids(self, h: object, events: object) -> None:
        self._m.nvmlDeviceRegisterEvents(h, NVML_EVENT_XID_CRITICAL, events)

    def next_xid(self, events: object) -> tuple[int, int] | None:
        """(device index, XID) of the next critical XID event, None when there is none now."""
        try:
            data = self._m.nvmlEventSetWait_v2(events, 0)
        except self.error as exc:
            if _code(exc) == ERR_TIMEOUT:
                return None
            raise
        if int(data.eventType) != NVML_EVENT_XID_CRITICAL:
            return None
        return int(self._m.nvmlDeviceGetIndex(data.device)), int(data.eventData)

    def free_events(self, events: object) -> None:
        self._m.nvmlEventSetFree(events)


class _GpuLost(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _lost_problem(index: int, uuid: str, cause: BaseException) -> str:
    return (
        f"GPU {index} ({uuid}) fell off the bus (NVML: {cause}); drain it, look for Xid 79 "
        "in dmesg, then reset the GPU (nvidia-smi -r) or reboot the node"
    )


DRAINING_XIDS: Final = frozenset(XID_PROBLEMS)
"""Critical XIDs that take a GPU out of the pool. Others (13, 31, 43, 45, 68: faults of the
application that ran, or its cleanup) are the job's, not the GPU's, and drain nothing."""
MAX_XIDS_PER_SAMPLE: Final = 256
"""Events read per sample at most, so a storm of them cannot stall the loop."""


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
        self._xids: dict[int, int] = {}
        """GPUs that reported a critical XID: the XID, for the life of the source."""
        self._events = self._xid_events()

    def _xid_events(self) -> object | None:
        """An NVML event set with every readable GPU's critical XIDs; None where the driver
        does not support events (they are then not read, and nothing is said)."""
        api = self._api
        try:
            events = api.event_set()
        except api.error as exc:
            if _code(exc) == ERR_NOT_SUPPORTED:
                return None
            raise
        registered = 0
        for info in self._inventory:
            try:
                api.register_xids(api.handle(info.index), events)
                registered += 1
            except api.error as exc:
                if _code(exc) not in (ERR_NOT_SUPPORTED, ERR_GPU_IS_LOST, ERR_UNKNOWN):
                    raise
        if registered == 0:
            with contextlib.suppress(api.error):
                api.free_events(events)
            return None
        return events

    def _read_xids(self) -> None:
        """The critical XIDs reported since the last sample (never waits)."""
        if self._events is None:
            return
        for _ in range(MAX_XIDS_PER_SAMPLE):
            try:
                got = self._api.next_xid(self._events)
            except self._api.error:
                return  # an event set that cannot be read now: try again next sample
            if got is None:
                return
            index, xid = got
            if xid in DRAINING_XIDS and 0 <= index < len(self._inventory):
                self._xids.setdefault(index, xid)

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
            self._read_xids()
            return [self._with_xid(self._sample_one(info, now_s)) for info in self._inventory]

    def _with_xid(self, sample: GpuSample) -> GpuSample:
        """The sample of a GPU that reported a critical XID reads unhealthy with it."""
        xid = self._xids.get(sample.index)
        if xid is None:
            return sample
        problem = xid_problem(sample.index, sample.uuid, xid)
        if not sample.healthy:
            problem = f"{sample.problem}; {problem}"
        return dataclasses.replace(sample, healthy=False, problem=problem)

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
            return lost_sample(info, _lost_problem(info.index, info.uuid, lost.cause), now_s)
        except api.error as exc:
            problem = (
                f"GPU {info.index} ({info.uuid}): NVML cannot open it ({exc}); "
                "drain it and check the driver with nvidia-smi"
            )
            return lost_sample(info, problem, now_s)
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
            problem="" if healthy else ecc_problem(info.index, info.uuid, ecc),
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
                if self._events is not None:
                    with contextlib.suppress(self._api.error):
                        self._api.free_events(self._events)
                self._shutdown()

    def __enter__(self) -> NvmlTelemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Telemetry of the live service: NVML parsing and errors (through a fake pynvml module that
raises pynvml's real exception classes), the fake fleet, the monitoring rule, DCGM names."""

# ruff: noqa: N802  (the fake module keeps pynvml's camelCase function names)
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from gpupool.energy.powercap import SetPowerCap
from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError
from gpupool.ports.telemetry.base import ApplyResult, GpuSample, Telemetry
from gpupool.ports.telemetry.fake import FakeTelemetry, parse_fleet
from gpupool.server.telemetry import nvml as tm
from gpupool.server.telemetry.monitor import MonitorRule, Signals
from gpupool.server.telemetry.nvml import NoGpuError, NvmlTelemetry, model_from_nvml_name
from gpupool.server.telemetry.prometheus import dcgm_name

MIB = 1024 * 1024

# ---------------------------------------------------------------------------------------
# A fake pynvml: the handful of calls telemetry makes, with per-call errors.


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-aaaa"
    total_b: int = 143771 * MIB
    used_b: int = 615 * MIB + 12345
    util: int = 87
    mem_util: int = 41
    temp: int = 55
    power_mw: int = 612345
    enforced_mw: int = 700000
    limit_mw: int = 700000
    default_mw: int = 700000
    bounds_mw: tuple[int, int] = (200000, 700000)
    sm_mhz: int = 1755
    mem_mhz: int = 3201
    max_sm_mhz: int = 1980
    ecc: int = 0
    procs: list[tuple[int, int | None]] = field(default_factory=lambda: [(4242, 2048 * MIB)])
    fail: dict[str, type[Exception]] = field(default_factory=dict)
    """pynvml function name -> the pynvml exception class it raises."""


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """Stands in for the pynvml module; checks the constants it is called with."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu],
        init_error: type[Exception] | None = None,
        count_error: type[Exception] | None = None,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.count_error = count_error
        self.calls: list[tuple[Any, ...]] = []
        self.shutdowns = 0

    def _gpu(self, fn: str, h: Handle) -> FakeGpu:
        gpu = self.gpus[h.index]
        if fn in gpu.fail:
            raise gpu.fail[fn]()
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error is not None:
            raise self.count_error()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        h = Handle(index)
        self._gpu("nvmlDeviceGetHandleByIndex", h)
        return h

    def nvmlDeviceGetName(self, h: Handle) -> str:
        return self._gpu("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUUID(self, h: Handle) -> bytes:
        return self._gpu("nvmlDeviceGetUUID", h).uuid.encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Any:
        g = self._gpu("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=g.total_b, used=g.used_b, free=g.total_b - g.used_b)

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        g = self._gpu("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util, memory=g.mem_util)

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu("nvmlDeviceGetTemperature", h).temp

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetPowerManagementLimit(self, h: Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementLimit", h).limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", h).enforced_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementDefaultLimit", h).default_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Handle) -> list[int]:
        return list(self._gpu("nvmlDeviceGetPowerManagementLimitConstraints", h).bounds_mw)

    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> int:
        g = self._gpu("nvmlDeviceGetClockInfo", h)
        assert clock in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM)
        return g.sm_mhz if clock == pynvml.NVML_CLOCK_SM else g.mem_mhz

    def nvmlDeviceGetMaxClockInfo(self, h: Handle, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._gpu("nvmlDeviceGetMaxClockInfo", h).max_sm_mhz

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, error_type: int, counter: int) -> int:
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter == pynvml.NVML_VOLATILE_ECC
        return self._gpu("nvmlDeviceGetTotalEccErrors", h).ecc

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in g.procs]

    def nvmlDeviceSetPowerManagementLimit(self, h: Handle, mw: int) -> None:
        self._gpu("nvmlDeviceSetPowerManagementLimit", h)
        self.calls.append(("limit", h.index, mw))

    def nvmlDeviceSetGpuLockedClocks(self, h: Handle, low: int, high: int) -> None:
        self._gpu("nvmlDeviceSetGpuLockedClocks", h)
        self.calls.append(("lock", h.index, low, high))

    def nvmlDeviceResetGpuLockedClocks(self, h: Handle) -> None:
        self._gpu("nvmlDeviceResetGpuLockedClocks", h)
        self.calls.append(("reset", h.index))

    # events: `xids` is the queue of (GPU index, XID) a wait returns, oldest first
    events_error: type[Exception] | None = None
    xids: list[tuple[int, int]]
    registered: list[tuple[int, int]]

    def nvmlEventSetCreate(self) -> str:
        if self.events_error is not None:
            raise self.events_error()
        self.xids, self.registered = [], []
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, events: str) -> None:
        assert events == "event-set"
        self._gpu("nvmlDeviceRegisterEvents", h)
        self.registered.append((h.index, types))

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        assert events == "event-set" and timeout_ms == 0  # a sample never waits
        if not self.xids:
            raise pynvml.NVMLError_Timeout()
        index, xid = self.xids.pop(0)
        return SimpleNamespace(
            device=Handle(index), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
        )

    def nvmlDeviceGetIndex(self, h: Handle) -> int:
        return h.index

    def nvmlEventSetFree(self, events: str) -> None:
        self.calls.append(("free", events))


def nvml(*gpus: FakeGpu, **kw: Any) -> tuple[NvmlTelemetry, FakeNvml]:
    fake = FakeNvml(list(gpus) or [FakeGpu()], **kw)
    return NvmlTelemetry(nvml=fake), fake


def test_the_fake_only_implements_real_pynvml_calls() -> None:
    names = [n for n in vars(FakeNvml) if n.startswith("nvml")]
    assert len(names) == 26
    assert [n for n in names if not callable(getattr(pynvml, n, None))] == []


def test_module_constants_are_pynvml_constants() -> None:
    assert tm.NVML_TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU
    assert tm.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM
    assert tm.NVML_CLOCK_MEM == pynvml.NVML_CLOCK_MEM
    assert tm.NVML_MEMORY_ERROR_TYPE_UNCORRECTED == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert tm.NVML_VOLATILE_ECC == pynvml.NVML_VOLATILE_ECC
    assert tm.ERR_NOT_SUPPORTED == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert tm.ERR_NO_PERMISSION == pynvml.NVML_ERROR_NO_PERMISSION
    assert tm.ERR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert tm.ERR_UNKNOWN == pynvml.NVML_ERROR_UNKNOWN
    assert tm.ERR_TIMEOUT == pynvml.NVML_ERROR_TIMEOUT
    assert pynvml.nvmlEventTypeXidCriticalError == tm.NVML_EVENT_XID_CRITICAL


# ---------------------------------------------------------------------------------------
# NVML: no GPU


def test_real_nvml_on_a_machine_without_gpu_raises_no_gpu_error() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NoGpuError) as info:
        NvmlTelemetry()
    msg = str(info.value)
    assert isinstance(info.value, GpupoolError)
    assert msg.startswith("no NVIDIA GPU found (NVML: NVML Shared Library Not Found)")
    assert "--fake-gpus 4xA100-80GB" in msg


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (pynvml.NVMLError_LibraryNotFound, "NVML Shared Library Not Found"),
        (pynvml.NVMLError_DriverNotLoaded, "Driver Not Loaded"),
        (pynvml.NVMLError_NoPermission, "Insufficient Permissions"),
        (pynvml.NVMLError_Unknown, "Unknown Error"),
    ],
)
def test_init_errors_become_no_gpu_error(error: type[Exception], text: str) -> None:
    with pytest.raises(NoGpuError, match=f"NVML: {text}.*--fake-gpus"):
        nvml(init_error=error)


def test_zero_devices_is_no_gpu_error_and_nvml_is_shut_down() -> None:
    fake = FakeNvml([])
    with pytest.raises(NoGpuError, match="0 devices"):
        NvmlTelemetry(nvml=fake)
    assert fake.shutdowns == 1


def test_count_error_is_no_gpu_error() -> None:
    fake = FakeNvml([FakeGpu()], count_error=pynvml.NVMLError_Uninitialized)
    with pytest.raises(NoGpuError, match="Uninitialized"):
        NvmlTelemetry(nvml=fake)
    assert fake.shutdowns == 1


# ---------------------------------------------------------------------------------------
# NVML: inventory and samples


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB"),
    ],
)
def test_model_from_nvml_name(nvml_name: str, model: str) -> None:
    assert model_from_nvml_name(nvml_name) == model


def test_inventory_reads_identity_size_and_limits() -> None:
    tel, _ = nvml(
        FakeGpu(),
        FakeGpu(
            name="NVIDIA A100-SXM4-80GB",
            uuid="GPU-bbbb",
            total_b=81920 * MIB,
            default_mw=400000,
            bounds_mw=(100000, 400000),
            max_sm_mhz=1410,
        ),
    )
    h200, a100 = tel.inventory()
    assert (h200.index, h200.uuid, h200.model, h200.mem_total_mib) == (
        0,
        "GPU-aaaa",
        "H200",
        143771,
    )
    assert (h200.power_limit_w, h200.max_sm_mhz) == (700.0, 1980)
    assert (h200.min_power_limit_w, h200.max_power_limit_w) == (200.0, 700.0)
    assert (a100.index, a100.model, a100.mem_total_mib, a100.power_limit_w) == (
        1,
        "A100-80GB",
        81920,
        400.0,
    )
    assert a100.nvml_name == "NVIDIA A100-SXM4-80GB"


def test_inventory_falls_back_to_enforced_limit_and_keeps_a_lost_gpus_index() -> None:
    tel, _ = nvml(
        FakeGpu(fail={"nvmlDeviceGetHandleByIndex": pynvml.NVMLError_GpuIsLost}),
        FakeGpu(
            enforced_mw=450000,
            fail={
                "nvmlDeviceGetPowerManagementDefaultLimit": pynvml.NVMLError_NotSupported,
                "nvmlDeviceGetMaxClockInfo": pynvml.NVMLError_NotSupported,
            },
        ),
    )
    lost, second = tel.inventory()
    assert lost.index == 0 and lost.uuid == "GPU-LOST-0" and "GPU is lost" in lost.model
    assert second.index == 1 and second.power_limit_w == 450.0 and second.max_sm_mhz is None


def test_sample_converts_units() -> None:
    tel, _ = nvml(FakeGpu(procs=[(4242, 2048 * MIB + 5), (77, None)]))
    (s,) = tel.sample(1234.5)
    assert s == GpuSample(
        index=0,
        uuid="GPU-aaaa",
        mem_total_mib=143771,
        mem_used_mib=615,
        util_pct=87.0,
        mem_util_pct=41.0,
        temp_c=55.0,
        power_w=612.345,
        power_limit_w=700.0,
        sm_clock_mhz=1755,
        mem_clock_mhz=3201,
        ecc_uncorrected=0,
        processes=((4242, 2048), (77, 0)),
        healthy=True,
        problem="",
        at_s=1234.5,
        missing=(),
    )
    assert s.mem_free_mib == 143771 - 615


def test_one_unsupported_field_does_not_lose_the_sample() -> None:
    tel, _ = nvml(
        FakeGpu(
            fail={
                "nvmlDeviceGetTemperature": pynvml.NVMLError_NotSupported,
                "nvmlDeviceGetEnforcedPowerLimit": pynvml.NVMLError_NoPermission,
                "nvmlDeviceGetComputeRunningProcesses": pynvml.NVMLError_NotSupported,
            }
        )
    )
    (s,) = tel.sample(0.0)
    assert s.healthy and s.problem == ""
    assert (s.temp_c, s.power_limit_w, s.processes) == (0.0, None, ())
    assert s.missing == ("temp_c", "power_limit_w", "processes")
    assert (s.util_pct, s.power_w, s.sm_clock_mhz) == (87.0, 612.345, 1755)


def test_ecc_not_supported_reads_zero_and_is_not_missing() -> None:
    tel, _ = nvml(FakeGpu(fail={"nvmlDeviceGetTotalEccErrors": pynvml.NVMLError_NotSupported}))
    (s,) = tel.sample(0.0)
    assert s.ecc_uncorrected == 0 and s.healthy and s.missing == ()


def test_uncorrected_ecc_errors_make_a_gpu_unhealthy() -> None:
    tel, _ = nvml(FakeGpu(), FakeGpu(uuid="GPU-bbbb", ecc=2))
    ok, bad = tel.sample(0.0)
    assert ok.healthy
    assert not bad.healthy and bad.ecc_uncorrected == 2
    assert "GPU 1 (GPU-bbbb) has 2 uncorrected ECC" in bad.problem and "drain" in bad.problem


@pytest.mark.parametrize("error", [pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_Unknown])
def test_gpu_lost_on_the_handle_is_unhealthy_and_the_others_still_read(
    error: type[Exception],
) -> None:
    tel, fake = nvml(FakeGpu(), FakeGpu(uuid="GPU-bbbb"))
    fake.gpus[1].fail["nvmlDeviceGetHandleByIndex"] = error
    ok, lost = tel.sample(5.0)
    assert ok.healthy and ok.util_pct == 87.0
    assert not lost.healthy and lost.uuid == "GPU-bbbb" and lost.at_s == 5.0
    assert "GPU 1 (GPU-bbbb) fell off the bus" in lost.problem
    assert (lost.util_pct, lost.power_w, lost.mem_total_mib) == (0.0, 0.0, 143771)


def test_gpu_lost_in_the_middle_of_a_sample_is_unhealthy() -> None:
    tel, fake = nvml(FakeGpu())
    fake.gpus[0].fail["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_GpuIsLost
    (s,) = tel.sample(0.0)
    assert not s.healthy and "fell off the bus (NVML: GPU is lost)" in s.problem


def test_other_handle_error_is_unhealthy_with_its_own_sentence() -> None:
    tel, fake = nvml(FakeGpu())
    fake.gpus[0].fail["nvmlDeviceGetHandleByIndex"] = pynvml.NVMLError_InsufficientPower
    (s,) = tel.sample(0.0)
    assert not s.healthy and "NVML cannot open it" in s.problem


@pytest.mark.parametrize(
    ("xid", "words"),
    [
        (48, "double-bit ECC"),
        (79, "fell off the bus"),
        (94, "contained ECC"),
        (95, "uncontained ECC"),
        (63, "row remapping"),
        (64, "row remapping failed"),
    ],
)
def test_a_critical_xid_makes_its_gpu_unhealthy_until_the_source_is_reopened(
    xid: int, words: str
) -> None:
    tel, fake = nvml(FakeGpu(), FakeGpu(uuid="GPU-bbbb"))
    assert fake.registered == [(0, 8), (1, 8)]  # every GPU, critical XIDs
    assert all(s.healthy for s in tel.sample(0.0))
    fake.xids.append((1, xid))
    ok, bad = tel.sample(1.0)
    assert ok.healthy and not bad.healthy
    assert f"GPU 1 (GPU-bbbb) reported XID {xid}: " in bad.problem and words in bad.problem
    assert "nvidia-smi -r -i 1" in bad.problem
    assert bad.util_pct == 87.0  # still read: the XID says it is not to be trusted
    assert not tel.sample(2.0)[1].healthy  # the event came once; the drain stays
    tel.close()
    assert ("free", "event-set") in fake.calls


def test_application_xids_drain_nothing_and_a_storm_is_read_in_one_sample() -> None:
    tel, fake = nvml(FakeGpu(), FakeGpu(uuid="GPU-bbbb"))
    fake.xids.extend([(0, 13), (0, 43), (1, 45)] * 10 + [(0, 79)])
    ok, other = tel.sample(0.0)
    assert fake.xids == []
    assert not ok.healthy and "XID 79" in ok.problem and other.healthy


def test_a_lost_gpu_with_an_xid_names_both() -> None:
    tel, fake = nvml(FakeGpu())
    fake.xids.append((0, 79))
    fake.gpus[0].fail["nvmlDeviceGetHandleByIndex"] = pynvml.NVMLError_GpuIsLost
    (s,) = tel.sample(0.0)
    assert not s.healthy and "fell off the bus (NVML" in s.problem and "XID 79" in s.problem


def test_events_not_supported_say_nothing() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-bbbb")])
    fake.events_error = pynvml.NVMLError_NotSupported
    tel = NvmlTelemetry(nvml=fake)
    assert all(s.healthy and s.missing == () for s in tel.sample(0.0))
    tel, fake = nvml(FakeGpu(fail={"nvmlDeviceRegisterEvents": pynvml.NVMLError_NotSupported}))
    assert fake.registered == []
    (s,) = tel.sample(0.0)
    assert s.healthy and s.problem == ""
    assert ("free", "event-set") in fake.calls  # nothing registered: the set is freed at once


# ---------------------------------------------------------------------------------------
# NVML: commands


def cap(gpu: int = 0, watts: float | None = 350.0, mhz: int | None = None) -> SetPowerCap:
    return SetPowerCap(0, gpu, watts, mhz, "test")


def test_apply_sets_the_limit_in_milliwatts_and_resets_clocks() -> None:
    tel, fake = nvml(FakeGpu())
    result = tel.apply(cap(watts=350.5))
    assert result == ApplyResult(True, "GPU 0: power limit 350.5 W; SM clock unlocked")
    assert fake.calls == [("limit", 0, 350500), ("reset", 0)]


def test_apply_clamps_into_the_cards_range() -> None:
    tel, fake = nvml(FakeGpu())
    result = tel.apply(cap(watts=100.0))
    assert result.ok and "clamped from 100 W into the card's 200-700 W" in result.message
    assert fake.calls[0] == ("limit", 0, 200000)
    tel.apply(cap(watts=900.0))
    assert fake.calls[2] == ("limit", 0, 700000)


def test_apply_locks_clocks_and_reset_restores_the_default_limit() -> None:
    tel, fake = nvml(FakeGpu(default_mw=650000))
    assert tel.apply(cap(watts=None, mhz=1400)).ok
    assert fake.calls == [("limit", 0, 650000), ("lock", 0, 1400, 1400)]
    assert cap(watts=None).is_reset
    result = tel.apply(cap(watts=None))
    assert result.ok and fake.calls[-1] == ("reset", 0)


def test_apply_without_root_says_what_to_run() -> None:
    no = pynvml.NVMLError_NoPermission
    tel, fake = nvml(
        FakeGpu(),
        FakeGpu(
            fail={
                "nvmlDeviceSetPowerManagementLimit": no,
                "nvmlDeviceSetGpuLockedClocks": no,
            }
        ),
    )
    result = tel.apply(cap(gpu=1, watts=350.0, mhz=1200))
    assert not result.ok
    assert "needs root: nvidia-smi -i 1 -pl 350" in result.message
    assert "needs root: nvidia-smi -i 1 -lgc 1200,1200" in result.message
    assert fake.calls == []


def test_reset_without_root_names_the_default_limit() -> None:
    tel, _ = nvml(
        FakeGpu(
            default_mw=650000,
            fail={"nvmlDeviceSetPowerManagementLimit": pynvml.NVMLError_NoPermission},
        )
    )
    result = tel.apply(cap(watts=None))
    assert not result.ok and "needs root: nvidia-smi -i 0 -pl 650;" in result.message
    assert result.message.endswith("SM clock unlocked")


def test_set_power_limit_leaves_clocks_alone() -> None:
    tel, fake = nvml(FakeGpu(limit_mw=500000, enforced_mw=450000))
    assert tel.current_limit_w(0) == 500.0
    assert tel.current_limit_w(7) is None
    assert tel.set_power_limit(0, 500.0) == ApplyResult(True, "GPU 0: power limit 500 W")
    assert fake.calls == [("limit", 0, 500000)]


def test_apply_reports_other_nvml_errors_and_tolerates_no_clock_locking() -> None:
    tel, _ = nvml(
        FakeGpu(
            fail={
                "nvmlDeviceSetPowerManagementLimit": pynvml.NVMLError_InvalidArgument,
                "nvmlDeviceResetGpuLockedClocks": pynvml.NVMLError_NotSupported,
            }
        )
    )
    result = tel.apply(cap())
    assert not result.ok
    assert "power limit not set (NVML: Invalid Argument)" in result.message
    assert "no SM clock lock to reset" in result.message


def test_apply_to_a_gpu_that_is_not_there() -> None:
    tel, fake = nvml(FakeGpu())
    result = tel.apply(cap(gpu=3))
    assert not result.ok and "no GPU 3" in result.message and fake.calls == []


def test_close_shuts_nvml_down_once_and_stops_sampling() -> None:
    tel, fake = nvml(FakeGpu())
    tel.close()
    tel.close()
    assert fake.shutdowns == 1
    with pytest.raises(ConflictError, match="closed"):
        tel.sample(0.0)
    assert not tel.apply(cap()).ok


# ---------------------------------------------------------------------------------------
# Fake fleet


def test_parse_fleet_counts_models_and_sizes() -> None:
    fleet = parse_fleet("4xA100-80GB")
    assert [g.uuid for g in fleet] == [f"FAKE-GPU-{i}" for i in range(4)]
    assert {(g.model, g.mem_total_mib, g.power_limit_w) for g in fleet} == {
        ("A100-80GB", round(78.80 * 1024), 400.0)
    }
    mixed = parse_fleet("2xH100, 2X4090")
    assert [(g.index, g.model) for g in mixed] == [
        (0, "H100"),
        (1, "H100"),
        (2, "RTX-4090"),
        (3, "RTX-4090"),
    ]
    assert [(g.model, g.index) for g in parse_fleet("A100-80GB")] == [("A100-80GB", 0)]


def test_parse_fleet_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"unknown GPU 'Z100'.*A100-80GB.*H200"):
        parse_fleet("2xZ100")


@pytest.mark.parametrize("spec", ["", "  ", "4xH100,", ",H100", "0xH100"])
def test_parse_fleet_bad_syntax_gives_an_example(spec: str) -> None:
    with pytest.raises(SpecError, match="4xA100-80GB"):
        parse_fleet(spec)


def test_parse_fleet_refuses_a_huge_fleet() -> None:
    with pytest.raises(SpecError, match="more than 1024"):
        parse_fleet("1000xH100,25xH200")


def test_fake_power_and_temperature_follow_the_load() -> None:
    fake = FakeTelemetry("1xH200,1xA100-80GB")
    assert isinstance(fake, Telemetry)
    idle = fake.sample(0.0)
    assert idle[0].power_w == pytest.approx(103.0)
    assert idle[1].power_w == pytest.approx(103.0 / 700 * 400)
    fake.set_load(0, 100.0, 2048, pids=(11, 12, 13))
    fake.set_load(1, 50.0, 0)
    busy, half = fake.sample(10.0)
    assert busy.power_w == pytest.approx(620.0)
    assert busy.temp_c == pytest.approx(30.0 + 50.0 * 620.0 / 700.0)
    assert half.power_w == pytest.approx((103.0 + 620.0) / 2 / 700 * 400)
    assert half.temp_c == pytest.approx(30.0 + 50.0 * half.power_w / 700.0)
    assert (busy.util_pct, busy.mem_used_mib, busy.at_s) == (100.0, 2048, 10.0)
    assert busy.processes == ((11, 684), (12, 682), (13, 682))
    assert (busy.sm_clock_mhz, busy.mem_clock_mhz, busy.healthy) == (1980, 3201, True)


def test_fake_set_load_checks_its_inputs() -> None:
    fake = FakeTelemetry("1xRTX-4090")
    with pytest.raises(SpecError, match="util_pct"):
        fake.set_load(0, 101.0, 0)
    with pytest.raises(SpecError, match="mem_used_mib"):
        fake.set_load(0, 10.0, 10**6)
    with pytest.raises(NotFoundError, match="no GPU 1"):
        fake.set_load(1, 10.0, 0)


def test_fake_apply_records_and_the_limit_shows_in_samples() -> None:
    fake = FakeTelemetry("2xH200")
    fake.set_load(0, 100.0, 0)
    command = SetPowerCap(0, 0, 400.0, None, "cap decode")
    assert fake.apply(command) == ApplyResult(True, "fake fleet: recorded")
    capped, other = fake.sample(1.0)
    assert (capped.power_limit_w, capped.power_w) == (400.0, 400.0)
    assert other.power_limit_w == 700.0
    fake.apply(SetPowerCap(0, 0, None, 1200, "lock"))
    locked = fake.sample(2.0)[0]
    assert (locked.power_limit_w, locked.power_w, locked.sm_clock_mhz) == (700.0, 620.0, 1200)
    assert fake.applied == [command, SetPowerCap(0, 0, None, 1200, "lock")]
    assert not fake.apply(SetPowerCap(0, 5, 300.0, None, "x")).ok


def test_fake_faults_make_gpus_unhealthy() -> None:
    fake = FakeTelemetry("3xH100")
    fake.set_load(0, 80.0, 100)
    fake.fail_gpu(0, "fell off the bus")
    fake.ecc_error(2, 3)
    lost, fine, ecc = fake.sample(0.0)
    assert not lost.healthy and lost.problem == "fell off the bus" and lost.util_pct == 0.0
    assert fine.healthy and fine.problem == ""
    assert not ecc.healthy and ecc.ecc_uncorrected == 3 and "uncorrected ECC" in ecc.problem
    fake.repair(0)
    fake.repair(2)
    assert all(s.healthy for s in fake.sample(1.0))
    fake.fail_gpu(1)
    assert "fell off the bus" in fake.sample(2.0)[1].problem
    fake.xid_error(2, 48)
    xid = fake.sample(3.0)[2]
    assert not xid.healthy and "XID 48: a double-bit ECC error" in xid.problem
    assert xid.util_pct == 0.0 and xid.power_w > 0  # still read, not trusted
    fake.repair(2)
    assert fake.sample(4.0)[2].healthy
    with pytest.raises(SpecError):
        fake.xid_error(2, 0)


# ---------------------------------------------------------------------------------------
# Monitoring rule


def sample(index: int, util: float, at_s: float, healthy: bool = True) -> GpuSample:
    return GpuSample(
        index, f"G{index}", 1000, 0, util, 0.0, 40.0, 100.0, 700.0, 1980, 3201, 0, (), healthy,
        "" if healthy else "broken", at_s,
    )  # fmt: skip


def test_monitor_rule_is_due_once_a_window_has_passed() -> None:
    rule = MonitorRule()
    assert not rule.due(1e9)
    rule.observe([sample(0, 50.0, 100.0)])
    assert not rule.due(399.999)
    assert rule.due(400.0)
    rule.evaluate(400.0)
    assert not rule.due(699.0) and rule.due(700.0)
    quick = MonitorRule(every_s=60.0)
    quick.observe([sample(0, 50.0, 0.0)])
    assert quick.due(60.0)


def test_monitor_rule_thresholds_are_strict_at_the_boundaries() -> None:
    rule = MonitorRule(low_pct=30.0, high_pct=90.0)
    rule.observe([sample(0, 20.0, 0.0), sample(1, 29.9, 0.0), sample(2, 100.0, 0.0)])
    rule.observe([sample(0, 40.0, 1.0), sample(1, 29.9, 1.0), sample(2, 100.0, 1.0)])
    s = rule.evaluate(300.0)
    assert s.reclaimable == (1,)  # GPU 0 averages exactly 30: not below
    assert s.mean_util_pct == pytest.approx((30.0 + 29.9 + 100.0) / 3)
    assert not s.scale_out and s.window_s == 300.0

    rule.observe([sample(0, 90.0, 300.0), sample(1, 90.0, 300.0)])
    assert rule.evaluate(600.0) == Signals((), False, 90.0, 300.0)  # exactly 90: no
    rule.observe([sample(0, 90.0, 600.0), sample(1, 90.5, 600.0)])
    assert rule.evaluate(900.0).scale_out


def test_monitor_rule_resets_its_window_and_skips_broken_gpus() -> None:
    rule = MonitorRule()
    rule.observe([sample(0, 0.0, 0.0), sample(1, 0.0, 0.0)])
    assert rule.evaluate(300.0).reclaimable == (0, 1)
    rule.observe([sample(0, 95.0, 301.0), sample(1, 0.0, 301.0, healthy=False)])
    s = rule.evaluate(600.0)
    assert s == Signals((), True, 95.0, 300.0)
    assert rule.evaluate(900.0) == Signals((), False, 0.0, 300.0)


def test_monitor_rule_weighs_gpus_not_samples() -> None:
    rule = MonitorRule(high_pct=60.0)
    rule.observe([sample(0, 100.0, float(t)) for t in range(9)])
    rule.observe([sample(1, 0.0, 0.0)])
    s = rule.evaluate(300.0)
    assert s.mean_util_pct == 50.0 and not s.scale_out and s.reclaimable == (1,)


@pytest.mark.parametrize(
    "kw", [{"every_s": 0.0}, {"low_pct": 50.0, "high_pct": 40.0}, {"high_pct": 101.0}]
)
def test_monitor_rule_checks_its_settings(kw: dict[str, float]) -> None:
    with pytest.raises(SpecError, match="monitor rule"):
        MonitorRule(**kw)


# ---------------------------------------------------------------------------------------
# DCGM names


@pytest.mark.parametrize(
    ("field_name", "metric"),
    [
        ("mem_used_mib", "DCGM_FI_DEV_FB_USED"),
        ("mem_free_mib", "DCGM_FI_DEV_FB_FREE"),
        ("free", "DCGM_FI_DEV_FB_FREE"),
        ("util_pct", "DCGM_FI_DEV_GPU_UTIL"),
        ("mem_util_pct", "DCGM_FI_DEV_MEM_COPY_UTIL"),
        ("temp_c", "DCGM_FI_DEV_GPU_TEMP"),
        ("power_w", "DCGM_FI_DEV_POWER_USAGE"),
        ("power_limit_w", "DCGM_FI_DEV_POWER_MGMT_LIMIT"),
        ("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK"),
        ("mem_clock_mhz", "DCGM_FI_DEV_MEM_CLOCK"),
        ("ecc_uncorrected", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    ],
)
def test_dcgm_name(field_name: str, metric: str) -> None:
    assert dcgm_name(field_name) == metric


def test_dcgm_name_of_an_unknown_field() -> None:
    with pytest.raises(NotFoundError, match="util_pct"):
        dcgm_name("processes")

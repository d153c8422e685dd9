"""The telemetry port: what the live driver knows about its GPUs and how it commands them.

The contract is `Telemetry`; the values that cross it are `GpuInfo` (what does not change),
`GpuSample` (one reading) and `ApplyResult` (whether a power command took effect). The
problem sentences of a GPU that cannot be read or has failed memory are here too, so every
implementation words them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from gpupool.energy.powercap import SetPowerCap


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
    """The service's view of its GPUs, real (NVML, one node or every node of a Ray
    cluster), fake (a fleet named on the command line) or simulated.

    Below properties are assumed of every implementation:

    1. A fixed inventory. `inventory()` is read once the source is open and does not
       change while it runs: the GPUs, numbered 0.. in the fleet's order, each with its
       identity and limits. A GPU lost before the start keeps its index (with what is
       known of it) so that the others keep theirs.
    2. Problems are readings. `sample` returns one `GpuSample` per GPU of the inventory,
       in its order, every time: a GPU that cannot be read (fallen off the bus, a node
       whose reader does not answer) is a sample with `healthy=False` and a `problem`
       sentence that says what to do (`lost_sample`); a field that cannot be read is 0
       and named in `missing`. It raises only once the source is closed (ConflictError).
    3. Commands fail softly. `apply` returns an `ApplyResult`: ok, or a message saying why
       not (no root, not supported, no such GPU); the caller logs it and carries on.
    4. Short calls. `sample` and `apply` block only for the reading or the command itself
       (milliseconds through NVML; at most a per-round timeout on Ray, after which the
       node's GPUs read as unhealthy); `inventory` does not block.
    5. Several threads. The loop samples and commands while the API thread may read;
       implementations guard their state with their own lock.
    6. `close` releases what the source holds (NVML, Ray actors); calling it twice is
       harmless.
    """

    def inventory(self) -> list[GpuInfo]:
        """The GPUs, by telemetry index (fixed for the life of the source)."""
        ...

    def sample(self, now_s: float) -> list[GpuSample]:
        """One reading of every GPU, stamped `now_s`; unreadable GPUs as unhealthy samples."""
        ...

    def apply(self, command: SetPowerCap) -> ApplyResult:
        """Set (or reset, with None) GPU `command.gpu`'s power limit and SM clock lock."""
        ...

    def close(self) -> None:
        """Release the source; sampling afterwards is an error."""
        ...


def ecc_problem(index: int, uuid: str, count: int) -> str:
    """The problem of a GPU whose memory has uncorrected errors, with what to do."""
    return (
        f"GPU {index} ({uuid}) has {count} uncorrected ECC error(s) since the driver loaded; "
        f"drain it, then reset it (nvidia-smi -r -i {index}) and replace it if they recur"
    )


XID_PROBLEMS: Final[dict[int, str]] = {
    48: "a double-bit ECC error (uncorrectable memory error)",
    63: "an ECC page retirement or row remapping was recorded (a reset applies it)",
    64: "an ECC page retirement or row remapping failed",
    74: "an NVLink error",
    79: "it fell off the bus",
    92: "a high single-bit ECC error rate",
    94: "a contained ECC error (the application that hit it was stopped)",
    95: "an uncontained ECC error (every application on the GPU is affected)",
    119: "a GSP firmware timeout",
    120: "a GSP firmware error",
}
"""What each critical XID that takes a GPU out of the pool says (NVIDIA's XID catalogue)."""


def xid_problem(index: int, uuid: str, xid: int) -> str:
    """The problem of a GPU that reported a critical XID, with what to do."""
    what = XID_PROBLEMS.get(xid, "a critical error")
    return (
        f"GPU {index} ({uuid}) reported XID {xid}: {what}; it stays drained: look for the "
        f"XID in dmesg, reset the GPU (nvidia-smi -r -i {index}) or reboot the node, replace "
        "it if it recurs, then restart gpupool on the node to take it back"
    )


def lost_sample(info: GpuInfo, problem: str, now_s: float, ecc: int = 0) -> GpuSample:
    """A GPU that cannot be read: nothing but its identity and what is wrong."""
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

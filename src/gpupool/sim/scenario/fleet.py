"""A scenario's simulated world behind the live service's interfaces.

`SimulatedFleet` implements the ports (`gpupool.ports`): an executor (launch, preempt,
poll), a telemetry source (GPU temperatures from the world's heat model; power caps set
on the simulated cards), a node probe (cloud nodes list themselves once their spin-up is
over) and a cloud command runner, all over one `ScenarioSim` world. A `LiveService` on
top of it decides with its own core, through its database, exactly as it would on real
machines; the world only moves. Driving the service's clock to each cycle boundary and
to each event the world reports gives the simulator's decisions (tests/parity/test_parity_all.py,
leg B).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.domain.lifecycle import JobState
from gpupool.errors import ConflictError
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.cloud.base import CloudNode, CommandRunner, NodeProbe
from gpupool.ports.executor.base import Executor, Exit, Handle, LaunchSpec
from gpupool.ports.telemetry.base import ApplyResult, GpuInfo, GpuSample, Telemetry
from gpupool.scheduler import JobProgress, Scheduler, SetPowerCap
from gpupool.sim.scenario.world import DOWN, FINISH, STARTING, UP, VACATE, ScenarioSim

CANCEL = 2


class SimulatedFleet:
    runs_gangs = True
    """The world runs a job the core placed over several nodes whole, as Ray's gangs do."""
    can_resize = False
    """The world does not move a running job to other GPUs: elastic jobs run at full size."""

    def __init__(self, world: ScenarioSim, clock: ManualClock) -> None:
        self.world = world
        self.clock = clock
        self.cycle_s = world.cfg.scheduling.cycle_s
        nodes = world.cluster.nodes
        self.slots = sorted((k, g) for k, n in enumerate(nodes) for g in range(n.gpu_count))
        """Telemetry index -> (node, GPU): the live service's fleet order."""
        self.stepped_s = 0.0
        """The world has run its jobs up to here (a cycle boundary)."""
        self.metered_s = 0.0
        self.pending: list[tuple[float, int, str]] = []
        """Vacates and finishes the world produced that the service has not polled yet."""
        self.running: dict[str, Handle] = {}
        self.capped = False

    def attach(self, core: Scheduler) -> None:
        """The live service's core is the one this world's jobs belong to."""
        self.world.attach(core)

    # ---- what the live service is configured with ---------------------------------------------
    def onprem_nodes(self) -> tuple[tuple[str, str, int], ...]:
        cloud = set(self.world.cloud_nodes)
        return tuple(
            (n.name, n.gpu_model, n.gpu_count)
            for k, n in enumerate(self.world.cluster.nodes)
            if k not in cloud
        )

    def node_labels(self) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
        """Each labelled node's labels (where it sits in the network)."""
        return tuple((n.name, n.labels) for n in self.world.cluster.nodes if n.labels)

    def cloud_nodes(self) -> tuple[CloudNode, ...]:
        nodes = self.world.cluster.nodes
        return tuple(
            CloudNode(nodes[k].name, nodes[k].cluster, nodes[k].gpu_model, nodes[k].gpu_count)
            for k in self.world.cloud_nodes
        )

    # ---- time ---------------------------------------------------------------------------------
    def _advance_to(self, now: float) -> None:
        """Run the world through every cycle that has begun before `now` (the service has
        carried out that cycle's commands by then)."""
        world = self.world
        while self.stepped_s < now and self.stepped_s < world.cfg.horizon_s:
            start = self.stepped_s
            end = min(start + self.cycle_s, world.cfg.horizon_s)
            world.cycle_end = end
            if self.capped or world.caps:
                world.apply_caps()
                self.capped = False
            for r in world.running.values():
                if r.state is JobState.RUNNING and r.spec.gpu_milli < 1000:
                    r.speed = world.core.speed_of(r.rec, r.cap_speed)
            self.pending += world.timed_events(start, end)
            self.stepped_s = end

    def events_before(self, t_s: float) -> list[float]:
        """When the world has something to report before `t_s` (runs the current cycle)."""
        self._advance_to(self.clock.now() + 1e-9)
        return sorted({at for at, _, _ in self.pending if at < t_s})

    # ---- executor -----------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        world = self.world
        run = world.job(spec.job_id)
        world.start(run, spec.resume)
        if world.caps:
            world.apply_caps()
        if now_s < self.stepped_s:  # started when its victims left, inside a cycle
            world.advance(run, now_s, self.stepped_s)
        handle = Handle(spec.job_id, spec.attempt, 0, 0, int(now_s))
        self.running[spec.job_id] = handle
        return handle

    def preempt(self, job_id: str, grace_s: float, now_s: float) -> None:
        self.world.preempt(self.world.job(job_id), now_s)

    def resize(self, job_id: str, grace_s: float, now_s: float) -> None:
        raise ConflictError(f"job {job_id}: the simulated fleet cannot resize an elastic job")

    def cancel(self, job_id: str, grace_s: float, now_s: float) -> None:
        if job_id in self.running:
            self.world.running.pop(job_id, None)
            self.pending.append((now_s, CANCEL, job_id))

    def poll(self, now_s: float) -> list[Exit]:
        self._advance_to(now_s)
        out: list[Exit] = []
        due = sorted(e for e in self.pending if e[0] <= now_s)
        self.pending = [e for e in self.pending if e[0] > now_s]
        for at, kind, job_id in due:
            run = self.world.job(job_id)
            handle = self.running.get(job_id)
            if handle is None:
                continue
            if kind == VACATE and run.state is JobState.PREEMPTING:
                self.world.running.pop(job_id, None)
                run.vacate_at = None
                outcome, reason = "preempted", "checkpointed and left"
            elif kind == FINISH and run.state is JobState.RUNNING:
                self.world.running.pop(job_id, None)
                outcome, reason = "succeeded", "completed"
            elif kind == CANCEL:
                outcome, reason = "cancelled", "cancelled"
            else:
                continue
            del self.running[job_id]
            out.append(Exit(job_id, handle.attempt, outcome, 0, None, reason, at))
        return out

    def adopt(self, handle: Handle, run_dir: Path) -> bool:
        return False

    def handles(self) -> dict[str, Handle]:
        return dict(self.running)

    def shutdown(self) -> None:
        pass

    def progress(self, now_s: float) -> dict[str, JobProgress]:
        """Measured work of the jobs running in the world (as the simulator reports it)."""
        return {
            job_id: JobProgress(r.done_s, r.saved_s, r.speed, r.overhead_s, r.cap_speed)
            for job_id, r in self.world.running.items()
            if r.state is JobState.RUNNING
        }

    # ---- telemetry ----------------------------------------------------------------------------
    def inventory(self) -> list[GpuInfo]:
        world = self.world
        out = []
        for i, (k, _) in enumerate(self.slots):
            node = world.cluster.nodes[k]
            tdp = float(world.meter.tdp_w[k]) or None
            out.append(
                GpuInfo(
                    index=i,
                    uuid=f"SIM-GPU-{i}",
                    model=node.gpu_model,
                    mem_total_mib=81_920,
                    power_limit_w=tdp,
                    max_sm_mhz=1980,
                    nvml_name=node.gpu_model,
                    min_power_limit_w=None,
                    max_power_limit_w=tdp,
                )
            )
        return out

    def sample(self, now_s: float) -> list[GpuSample]:
        world = self.world
        if now_s >= self.stepped_s > self.metered_s:  # the cycle's events are all in
            world.meter_tick(self.metered_s, self.stepped_s - self.metered_s)
            self.metered_s = self.stepped_s
        temps = world.heat.temps_c if world.heat is not None else None
        out = []
        for i, (k, g) in enumerate(self.slots):
            temp = float(temps[k, g]) if temps is not None else 30.0
            out.append(
                GpuSample(
                    index=i,
                    uuid=f"SIM-GPU-{i}",
                    mem_total_mib=81_920,
                    mem_used_mib=0,
                    util_pct=0.0,
                    mem_util_pct=0.0,
                    temp_c=temp,
                    power_w=0.0,
                    power_limit_w=None,
                    sm_clock_mhz=1980,
                    mem_clock_mhz=1593,
                    ecc_uncorrected=0,
                    processes=(),
                    healthy=True,
                    problem="",
                    at_s=now_s,
                )
            )
        return out

    def apply(self, command: SetPowerCap) -> ApplyResult:
        key = self.slots[command.gpu]
        if command.is_reset:
            self.world.caps.pop(key, None)
        else:
            self.world.caps[key] = SetPowerCap(
                key[0], key[1], command.power_limit_w, command.locked_sm_mhz, command.reason
            )
        self.world.cap_commands += 1
        self.capped = True
        return ApplyResult(True, "simulated card")

    def close(self) -> None:
        pass

    # ---- the node probe and the cloud commands ------------------------------------------------
    def probe(self) -> dict[str, str]:
        world = self.world
        now = self.clock.now()
        alive = {}
        for k, node in enumerate(world.cluster.nodes):
            status = world.cloud_status.get(k)
            if status == STARTING and world.cloud_ready_at[k] <= now:
                world.cloud_status[k] = status = UP
            if status is None or status == UP:
                alive[node.name] = f"sim-{node.name}"
        return alive

    def start(self, argv: Sequence[str], log: Path) -> Callable[[], int | None]:
        """A cloud start or stop command: `start NODE` or `stop NODE`."""
        verb, name = argv[0], argv[1]
        world = self.world
        k = world.core.fleet.node_index[name]
        now = self.clock.now()
        if verb == "start":
            world.cloud_status[k] = STARTING
            world.cloud_ready_at[k] = now + world.spinup_s
        else:
            world.cloud_status[k] = DOWN
        return lambda: 0


if TYPE_CHECKING:  # mypy proves the world implements the ports the live driver uses

    def _ports(fleet: SimulatedFleet) -> tuple[Executor, Telemetry, CommandRunner, NodeProbe]:
        return fleet, fleet, fleet, fleet.probe

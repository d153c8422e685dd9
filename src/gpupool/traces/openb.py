"""Alibaba GPU-sharing trace 2023 ("openb", the FGD paper's workload).

Node lists: sn,cpu_milli,memory_mib,gpu,model. Pod lists: name,cpu_milli,memory_mib,
num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time];
the multigpu lists carry only the first five columns.
"""

from __future__ import annotations

from pathlib import Path

from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobKind, JobSpec, Node
from gpupool.errors import TraceFormatError
from gpupool.traces.common import ReadReport, int_field, open_rows

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def read_nodes(path: str | Path, name: str = "openb") -> tuple[Cluster, ReadReport]:
    report = ReadReport(str(path))
    nodes: list[Node] = []
    seen: set[str] = set()
    for line, row in open_rows(path, NODE_COLUMNS):
        report.rows += 1
        sn = row["sn"].strip()
        if not sn:
            raise TraceFormatError(path, line, "empty node name (sn)")
        if sn in seen:
            raise TraceFormatError(path, line, f"node {sn} appears twice")
        seen.add(sn)
        cpu = int_field(row, "cpu_milli", path, line)
        mem = int_field(row, "memory_mib", path, line)
        gpus = int_field(row, "gpu", path, line)
        if min(cpu, mem, gpus) < 0:
            raise TraceFormatError(path, line, "cpu_milli, memory_mib and gpu must be >= 0")
        if gpus == 0:
            report.skip("nodes without GPUs")
            continue
        nodes.append(Node(sn, row["model"].strip(), gpus, cpu, mem, cluster=name))
        report.used += 1
    if not nodes:
        raise TraceFormatError(path, 1, "no GPU node in the file")
    return Cluster(name, tuple(nodes)), report


def read_pods(path: str | Path) -> tuple[list[JobSpec], ReadReport]:
    report = ReadReport(str(path))
    jobs: list[JobSpec] = []
    for line, row in open_rows(path, POD_COLUMNS):
        report.rows += 1
        name = row["name"].strip()
        if not name:
            raise TraceFormatError(path, line, "empty pod name")
        cpu = int_field(row, "cpu_milli", path, line)
        mem = int_field(row, "memory_mib", path, line)
        count = int_field(row, "num_gpu", path, line)
        milli = int_field(row, "gpu_milli", path, line)
        if cpu < 0 or mem < 0 or count < 0 or milli < 0:
            report.skip("negative requests")
            continue
        if count > 0 and not 0 < milli <= MILLI_PER_GPU:
            report.skip("gpu_milli outside 1..1000")
            continue
        if count > 1 and milli != MILLI_PER_GPU:
            report.skip("multi-GPU pods sharing GPUs")
            continue
        spec = row.get("gpu_spec", "").strip()
        models = frozenset(m for m in spec.split("|") if m) if count else frozenset()
        submit = 0.0
        duration: float | None = None
        created, deleted = (
            row.get("creation_time", "").strip(),
            row.get("deletion_time", "").strip(),
        )
        if created:
            submit = float(int_field(row, "creation_time", path, line))
            if deleted:
                duration = max(0.0, float(int_field(row, "deletion_time", path, line)) - submit)
        jobs.append(
            JobSpec(
                job_id=name,
                gpu_count=count,
                gpu_milli=milli if count else MILLI_PER_GPU,
                cpu_milli=cpu,
                mem_mib=mem,
                gpu_models=models,
                kind=JobKind.ONLINE if row.get("qos", "").strip() == "LS" else JobKind.BATCH,
                submit_s=submit,
                duration_s=duration,
            )
        )
        report.used += 1
    return jobs, report

"""The scenario figures recorded under bench/results are the ones the code computes now.

bench/bench_scenarios.py writes bench/results/scenarios.json and bench/bench_resources.py
writes bench/results/resources.json; docs/scenarios.md, docs/elastic.md and other docs
quote those figures. The simulation is deterministic, so a scenario rerun exactly as the
bench runs it (same file, same policy override, same trace inputs) must reproduce every
figure the JSON records, floats included, bit for bit. Only wall_s (a timing) is left
out. Keys the summary has gained since the run was recorded are not checked; a recorded
key that is gone is a failure.

Covered: the aware/blind pairs of bench_resources.py (hetero, energy, energy-caiso,
multicluster; no trace files needed), one ITP row of bench_scenarios.py under a policy
override and the ITP row without guarantees, where online inference preempts training
of any team (both skipped without the ITP trace), the two day/night rows, whose
finished jobs, mean JCT and per-width figures docs/scenarios.md quotes next to training
GPU-hours, and the serving-borrow pair (elastic resizing on and off; these four skipped
without the Azure LLM trace; 4-12 s each). The islands rows take minutes each and are
left to `make bench`. About 85 s in all on 2 cores.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.runner import run_scenario
from gpupool.traces.location import find_traces_dir
from scenario_runs import scenario_run

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "scenarios"
RESULTS = ROOT / "bench" / "results"
MACHINE_DEPENDENT = frozenset({"wall_s"})
"""Top-level summary keys that depend on the machine, not on the decisions."""


AZURE_TRACES = (
    "azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv",
    "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv",
)


@dataclass(frozen=True)
class Recorded:
    """One recorded run: which results file holds it, and how its bench script ran it."""

    results: str
    """scenarios.json (bench_scenarios.py) or resources.json (bench_resources.py)."""
    scenario: str
    """The scenario file's stem under scenarios/."""
    policy: str | None = None
    """bench_scenarios.py's policy override (the row is then named scenario/policy)."""
    traces: tuple[str, ...] = ()
    """Trace files (relative to the traces folder) its workload reads."""

    @property
    def row(self) -> str:
        return self.scenario if self.policy is None else f"{self.scenario}/{self.policy}"


CASES = [
    *(
        Recorded("resources.json", f"{pair}-{mode}")
        for pair in ("hetero", "energy", "energy-caiso", "multicluster")
        for mode in ("blind", "aware")
    ),
    Recorded(
        "scenarios.json",
        "itp-cluster02",
        "priority-quota",
        traces=("microsoft-itp-2021/raw-traces/cluster02.csv",),
    ),
    Recorded(
        "scenarios.json",
        "itp-cluster02-open",
        traces=("microsoft-itp-2021/raw-traces/cluster02.csv",),
    ),
    *(
        Recorded("scenarios.json", name, traces=AZURE_TRACES)
        for name in ("daynight-off", "daynight-on", "serving-borrow", "serving-borrow-off")
    ),
]


@cache
def recorded_rows(results: str) -> dict[str, dict[str, Any]]:
    """The recorded summaries of one results file, by row name."""
    payload = json.loads((RESULTS / results).read_text(encoding="utf-8"))
    if results == "resources.json":
        return dict(payload["runs"])
    return {row["scenario"]: row for row in payload["scenarios"]}


def rerun(case: Recorded) -> dict[str, Any]:
    """The summary as the case's bench script builds it, through a JSON round trip (as it
    is written to the results file)."""
    cfg = load_scenario(SCENARIOS / f"{case.scenario}.yaml")
    if case.policy is not None:  # bench_scenarios.one
        scheduling = replace(cfg.scheduling, policy=case.policy)
        cfg = replace(cfg, scheduling=scheduling, name=f"{cfg.name}/{case.policy}")
    # a case without a policy is a run test_resource_scenarios.py reads too: made once
    result = run_scenario(cfg) if case.policy is not None else scenario_run(case.scenario)
    out = dict(result.summary)
    if case.results == "resources.json" and case.scenario.startswith("multicluster"):
        out["far_data"] = next(r for r in result.jobs if r["job_id"] == "far-data")
    return json.loads(json.dumps(out))


def differences(recorded: Any, computed: Any, path: str = "") -> list[str]:
    """Where `computed` departs from `recorded`, one line per figure: every key the
    recorded mappings hold (extra computed keys are ignored), lists element by element,
    numbers exactly."""
    where = path or "summary"
    if isinstance(recorded, dict):
        if not isinstance(computed, dict):
            return [f"{where}: recorded a mapping, computed {computed!r}"]
        out = []
        for key, value in recorded.items():
            if key not in computed:
                out.append(f"{path}.{key}: recorded {value!r}, no longer computed")
            else:
                out += differences(value, computed[key], f"{path}.{key}")
        return out
    if isinstance(recorded, list):
        if not isinstance(computed, list) or len(computed) != len(recorded):
            return [f"{where}: recorded {recorded!r}, computed {computed!r}"]
        out = []
        for i, (a, b) in enumerate(zip(recorded, computed, strict=True)):
            out += differences(a, b, f"{path}[{i}]")
        return out
    same = _kind(recorded) == _kind(computed) and (
        recorded == computed or (_is_nan(recorded) and _is_nan(computed))
    )
    return [] if same else [f"{where}: recorded {recorded!r}, computed {computed!r}"]


def _kind(x: Any) -> str:
    """Numbers compare across int and float (JSON writes 2.0 as 2.0, an int as 2); a
    number never equals a string, a bool or None."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return "number"
    return type(x).__name__


def _is_nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def figure_differences(recorded: dict[str, Any], computed: dict[str, Any]) -> list[str]:
    kept = {k: v for k, v in recorded.items() if k not in MACHINE_DEPENDENT}
    return differences(kept, computed)


@pytest.mark.parametrize("case", CASES, ids=[c.row for c in CASES])
def test_recorded_scenario_figures_are_reproduced(case: Recorded) -> None:
    recorded = recorded_rows(case.results).get(case.row)
    assert recorded is not None, f"bench/results/{case.results} has no row {case.row!r}"
    if case.traces:
        folder = find_traces_dir(SCENARIOS)
        missing = [t for t in case.traces if folder is None or not (folder / t).is_file()]
        if missing:
            pytest.skip(
                f"{case.row} reads trace file(s) {', '.join(missing)}, not found "
                "(set GPUPOOL_TRACES or put shared/traces above the repository)"
            )
    diffs = figure_differences(recorded, rerun(case))
    assert not diffs, (
        f"{case.row}: {len(diffs)} figure(s) differ from bench/results/{case.results} "
        f"(rerun the bench on purpose if the change is intended):\n  " + "\n  ".join(diffs[:25])
    )


def test_figure_comparison_catches_a_changed_or_missing_figure() -> None:
    """The comparison itself: a last-digit change anywhere, a lost key or list entry, a
    number turned into a string, all reported with their path; timings are not."""
    recorded = recorded_rows("resources.json")["multicluster-aware"]
    same = json.loads(json.dumps(recorded))
    assert figure_differences(recorded, same) == []

    same["wall_s"] = recorded["wall_s"] + 100.0
    same["new_key_since"] = 1
    assert figure_differences(recorded, same) == []

    changed = json.loads(json.dumps(recorded))
    changed["cost_usd"] = recorded["cost_usd"] + 0.01
    changed["teams"]["ml"]["avg_jct_h"] = str(recorded["teams"]["ml"]["avg_jct_h"])
    changed["burst_log"] = recorded["burst_log"][:-1]
    del changed["far_data"]["transfer_s"]
    found = sorted(d.split(":")[0] for d in figure_differences(recorded, changed))
    assert found == [".burst_log", ".cost_usd", ".far_data.transfer_s", ".teams.ml.avg_jct_h"]

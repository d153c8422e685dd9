"""What a command loads: `gpupool --version` and `--help` load none of the commands'
libraries, a FIFO replay loads neither the learning stack nor the service's, and nothing
outside `serve --ray` needs Ray (an optional extra). Speed itself is measured by
bench/bench_startup.py, not here."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import pytest

from gpupool.cli.main import build_parser
from gpupool.cli.verbs import GROUPS, HELP

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT.parent / "shared" / "traces" / "philly" / "elasticflow_philly_103959.csv"

HEAVY = ("numpy", "sqlalchemy", "ray", "lightgbm", "scipy", "matplotlib", "fastapi", "httpx")

# Runs gpupool's main in a fresh interpreter where `import ray` fails, as on a machine
# without the [ray] extra, and prints which heavy libraries the command loaded.
PROBE = """
import importlib.abc, json, sys

class NoRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, NoRay())
from gpupool.cli.main import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
heavy = [m for m in json.loads(sys.argv[2]) if m in sys.modules]
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


def probe(*argv: str) -> tuple[dict[str, object], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(argv)), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    last = done.stderr.strip().splitlines()[-1]
    return json.loads(last), done.stdout + done.stderr


def test_version_and_help_load_no_command_library() -> None:
    for argv in (["--version"], ["--help"]):
        got, out = probe(*argv)
        assert got == {"code": 0, "heavy": []}, out


def test_a_client_command_does_not_load_the_service_or_the_simulator() -> None:
    got, out = probe("plan", "--help")
    assert got == {"code": 0, "heavy": []}, out
    got, out = probe("ls", "--help")
    assert got["code"] == 0, out
    assert not {"sqlalchemy", "ray", "lightgbm", "fastapi", "matplotlib"} & set(got["heavy"])


@pytest.mark.skipif(not PHILLY.is_file(), reason="shared/traces/philly not present")
def test_a_fifo_replay_loads_neither_the_learning_stack_nor_the_service(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    got, out = probe(
        "simulate", "replay", "--trace", str(PHILLY), "--format", "elasticflow",
        "--queue", "fifo", "--json", str(out_json),
    )  # fmt: skip
    assert got == {"code": 0, "heavy": ["numpy"]}, out
    assert json.loads(out_json.read_text())["jobs"] == 876


def test_serve_without_ray_runs_locally_and_asks_for_the_extra_only_for_ray(
    tmp_path: Path,
) -> None:
    got, out = probe("serve", "--help")
    assert got["code"] == 0 and "ray" not in got["heavy"], out
    got, out = probe(
        "serve", "--ray", "127.0.0.1:1", "--state-dir", str(tmp_path), "--auth", "none",
        "--port", "0",
    )  # fmt: skip
    assert got["code"] == 2, out
    assert "pip install 'gpupool[ray]'" in out
    assert "ray" not in got["heavy"]


def test_ray_is_an_optional_extra() -> None:
    needs = requires("gpupool") or []
    ray = [r for r in needs if r.startswith("ray")]
    assert ray, needs
    assert all('extra == "ray"' in r for r in ray), ray


def test_the_lazy_parser_lists_every_command_as_the_full_one_does() -> None:
    lazy = build_parser([]).format_help()
    full = build_parser().format_help()
    assert lazy == full
    for name, text in HELP.items():
        assert name in full and text.split(",")[0] in " ".join(full.split())


def test_each_command_is_built_by_the_module_the_table_names() -> None:
    full = build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    built = set(sub.choices)  # type: ignore[arg-type]
    assert built == {name for g in GROUPS for name, _ in g.helps}
    for group in GROUPS:
        for name, _ in group.helps:
            lazy = build_parser([name])
            action = next(a for a in lazy._actions if a.dest == "command")
            parser = action.choices[name]  # type: ignore[index]
            assert parser.add_help, f"{name} should be the real parser when asked for"

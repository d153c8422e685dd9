"""Acceptance, fast: through the real `gpupool serve` process whose node address is
127.0.0.2 (`network: {node_address: 127.0.0.2}`, as another machine's address would be),
the example replica listens on 127.0.0.2 only, the server's scraper reads it there (its rate
reaches the services view), `gpupool service show` prints http://127.0.0.2:PORT, and
`gpupool loadgen --service` sends to that URL."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

import pytest

from gpupool.traces.location import find_traces_dir
from service_proc import HTTP, cli, configured_server, wait_for

CONFIG = """\
teams:
  - {name: web}
network: {node_address: 127.0.0.2}
"""


def test_a_replica_serves_and_is_scraped_at_the_nodes_address(tmp_path: Path) -> None:
    server = configured_server(tmp_path, CONFIG, extra=("--scrape", "0.5")).start()
    try:
        url = server.url
        made = cli(
            url,
            "service",
            "create",
            "chat",
            "--team",
            "web",
            "--replicas",
            "1..1",
            "--",
            sys.executable,
            "-m",
            "gpupool.examples.chat_replica",
            "--min-ms",
            "1",
            "--max-ms",
            "5",
        )
        assert made.returncode == 0, made.stderr

        def replica() -> dict[str, object]:
            reps = HTTP.get(f"{url}/v1/services/chat", timeout=5).json()["replicas"]
            assert len(reps) <= 1
            return dict(reps[0]) if reps else {}

        wait_for(lambda: replica().get("ready") is True, 30, "the replica to answer a scrape")
        rep = replica()
        port = rep["port"]
        assert isinstance(port, int)
        assert rep["address"] == "127.0.0.2" and rep["url"] == f"http://127.0.0.2:{port}"
        # it listens on the node's address, not on 127.0.0.1
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        for _ in range(10):
            assert HTTP.get(f"{rep['url']}/generate?tokens=4", timeout=5).status_code == 200
        wait_for(lambda: (replica().get("rps") or 0) > 0, 15, "the scraped rate of the replica")

        shown = cli(url, "service", "show", "chat")
        assert shown.returncode == 0, shown.stderr
        assert re.search(rf"\bhttp://127\.0\.0\.2:{port}\b", shown.stdout), shown.stdout

        if find_traces_dir() is not None:  # the load generator replays the Azure LLM trace
            log = tmp_path / "requests.jsonl"
            sent = cli(
                url,
                *("loadgen", "--service", "chat", "--rps", "10", "--duration-s", "2"),
                *("--requests", str(log)),
            )
            assert sent.returncode == 0, sent.stderr
            records = [json.loads(line) for line in log.read_text().splitlines()]
            assert len(records) >= 10
            assert {r["target"] for r in records} == {f"http://127.0.0.2:{port}"}
            assert {r["outcome"] for r in records} == {"ok"}
    finally:
        server.stop()

"""POST /v1/admin/fake-faults: an admin fails (and repairs) a GPU of the fake fleet through
the API; the loop drains it as a real fault. Real GPUs are refused."""

from __future__ import annotations

import pytest

from api_harness import NODE, Api, team_token
from gpupool.ports.telemetry.base import GpuInfo, GpuSample, Telemetry

PATH = "/v1/admin/fake-faults"


@pytest.fixture
def db() -> str:
    return "sqlite"  # the route touches no SQL of its own: one database is enough


def test_an_xid_drains_the_card_and_a_repair_brings_it_back(api: Api) -> None:
    job = api.submitted()
    api.step()
    device = api.job(job["id"])["gpus"][0]["index"]
    r = api.client.post(PATH, json={"gpu": device, "fault": "xid", "xid": 79})
    assert r.status_code == 200, r.text
    assert r.json() == {"node": NODE, "gpu": device, "fault": "xid", "done": "XID 79"}
    api.step()  # sampled: the card is out, its job told to leave
    node = api.client.get("/v1/cluster").json()["nodes"][0]
    assert [o["gpu"] for o in node["gpus_out"]] == [device]
    assert "XID 79" in node["gpus_out"][0]["reason"]
    events = api.client.get("/v1/events").json()["events"]
    fake = [e for e in events if e["kind"] == "fake-fault"]
    assert len(fake) == 1 and fake[0]["message"].endswith(": XID 79")
    assert any(e["kind"] == "gpu-unhealthy" and "XID 79" in e["message"] for e in events)

    r = api.client.post(PATH, json={"gpu": device, "fault": "repair"})
    assert r.status_code == 200 and r.json()["done"] == "repaired"
    api.step()
    assert api.client.get("/v1/cluster").json()["nodes"][0]["gpus_out"] == []


@pytest.mark.parametrize(
    ("body", "done"),
    [
        ({"fault": "ecc", "count": 2}, "2 uncorrected ECC error(s)"),
        ({"fault": "lost", "problem": "fell off the bus (test)"}, "lost: fell off the bus (test)"),
    ],
)
def test_ecc_and_lost_faults(api: Api, body: dict[str, object], done: str) -> None:
    r = api.client.post(PATH, json={"gpu": 1, **body})
    assert r.status_code == 200 and r.json()["done"] == done, r.text
    api.step()
    sample = next(s for s in api.telemetry.sample(0.0) if s.index == 1)
    assert not sample.healthy
    assert [o["gpu"] for o in api.client.get("/v1/cluster").json()["nodes"][0]["gpus_out"]] == [1]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"gpu": 0, "fault": "xid"}, 422, "fault xid needs it"),
        ({"gpu": 0, "fault": "ecc", "xid": 79}, 422, "xid goes with fault xid"),
        ({"gpu": 0, "fault": "melt"}, 422, "fault"),
        ({"gpu": 7, "fault": "repair"}, 404, "GPU 7 is not in this fleet"),
        ({"gpu": 0, "node": "elsewhere", "fault": "repair"}, 404, "of node elsewhere"),
    ],
)
def test_bad_requests_say_what_is_wrong(
    api: Api, body: dict[str, object], status: int, words: str
) -> None:
    r = api.client.post(PATH, json=body)
    assert r.status_code == status and words in r.text, r.text


def test_only_an_admin_injects_faults(secured: Api) -> None:
    r = secured.client.post(
        PATH, json={"gpu": 0, "fault": "xid", "xid": 79}, headers=team_token(secured, "nlp")
    )
    assert r.status_code == 403 and "only an admin token injects faults" in r.text
    assert secured.client.post(PATH, json={"gpu": 0, "fault": "repair"}).status_code == 401
    r = secured.client.post(PATH, json={"gpu": 0, "fault": "repair"}, headers=secured.headers)
    assert r.status_code == 200


class RealGpus(Telemetry):
    """Not the fake fleet: what NVML would be."""

    def __init__(self, inner: Telemetry) -> None:
        self.inner = inner

    def inventory(self) -> list[GpuInfo]:
        return self.inner.inventory()

    def sample(self, now_s: float) -> list[GpuSample]:
        return self.inner.sample(now_s)

    def close(self) -> None:
        self.inner.close()


def test_real_gpus_are_refused(api: Api) -> None:
    api.service.operations.telemetry = RealGpus(api.telemetry)
    r = api.client.post(PATH, json={"gpu": 0, "fault": "xid", "xid": 79})
    assert r.status_code == 409 and "faults are injected only into the fake fleet" in r.text

"""``/api/v1/jobs/{id}/rounds`` and ``/models``: what happened in each round, and the models."""

from __future__ import annotations

import base64
import hashlib

import httpx
import pytest
from support.api import ACCURACY, FinishedJob

from dpfl.server.store import STAGES, Store

pytestmark = pytest.mark.anyio


async def test_rounds_show_participants_dropouts_timings_epsilon_accuracy(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    r = await admin.get(f"/api/v1/jobs/{finished.job.id}/rounds")
    assert r.status_code == 200
    rounds = r.json()
    assert [(x["number"], x["attempt"], x["status"]) for x in rounds] == [
        (1, 1, "completed"),
        (2, 1, "completed"),
        (3, 1, "aborted"),
        (3, 2, "completed"),
    ]
    ids = sorted(finished.client_ids)
    by_key = {(x["number"], x["attempt"]): x for x in rounds}
    for x in rounds:
        stored = store.get_round(x["id"])
        assert sorted(x["invited"]) == ids
        assert sorted(x["accepted"]) == ids
        assert x["stage_seconds"] == pytest.approx(stored.stage_seconds)
        assert x["epsilon"] == (None if stored.epsilon is None else pytest.approx(stored.epsilon))
        # the stored record, as the coordinator wrote it (the API shows it without its version)
        assert x["noise"] == {k: v for k, v in stored.setup.to_json().items() if k != "version"}
        assert x["noise"]["sample"] == finished.client_ids
        assert "version" not in x["noise"]
    # a dropout at share_keys: four contributed, all five were charged (DP-FedAvg population)
    second = by_key[(2, 1)]
    assert second["dropped"]["share_keys"] == [finished.client_ids[1]]
    assert len(second["participants"]) == 4
    assert second["accuracy"] == ACCURACY[2]
    assert second["model_version"] == 2
    assert len(store.ledger_entries(round_id=second["id"])) == 5
    # the aborted attempt: its dropouts, its reason, no charge, no participants
    aborted = by_key[(3, 1)]
    assert sorted(aborted["dropped"]["advertise_keys"]) == sorted(finished.client_ids[-2:])
    assert "too few survivors" in aborted["abort_reason"]
    assert aborted["epsilon"] is None
    assert aborted["committed_at"] is None
    assert aborted["participants"] == []
    assert aborted["accuracy"] is None
    assert set(aborted["stage_seconds"]) == set(STAGES[: STAGES.index("advertise_keys") + 1])
    # the aggregate ε after each charged round grows, and ends at the job's largest ε
    charged = [x["epsilon"] for x in rounds if x["epsilon"] is not None]
    assert charged == sorted(charged)
    # (the round's figure is the job's figure of the charged clients, fixed at commit)
    by_client = [
        store.client_budget(c, delta=finished.job.delta).by_job[finished.job.id].epsilon
        for c in store.job_epsilons(finished.job.id)
    ]
    assert charged[-1] == pytest.approx(max(by_client))
    assert max(store.job_epsilons(finished.job.id).values()) == pytest.approx(charged[-1])
    assert [x["accuracy"] for x in rounds if x["status"] == "completed"] == [
        ACCURACY[1],
        ACCURACY[2],
        ACCURACY[3],
    ]
    only = (await admin.get(f"/api/v1/jobs/{finished.job.id}/rounds", params={"number": 3})).json()
    assert [(x["number"], x["attempt"]) for x in only] == [(3, 1), (3, 2)]
    r = await admin.get(f"/api/v1/jobs/{finished.job.id}/rounds", params={"number": 0})
    assert r.status_code == 422
    assert "query parameter 'number'" in r.json()["detail"]
    assert (await admin.get("/api/v1/jobs/job-nope/rounds")).status_code == 404


async def test_models_list_and_download_with_checksums(
    admin: httpx.AsyncClient, finished: FinishedJob, store: Store
) -> None:
    job = finished.job.id
    versions = (await admin.get(f"/api/v1/jobs/{job}/models")).json()
    assert [v["version"] for v in versions] == [0, 1, 2, 3]
    assert versions[0]["round_id"] is None
    assert [v["round_id"] for v in versions[1:]] == [
        x.id for x in finished.rounds if x.model_version is not None
    ]
    for v in versions:
        r = await admin.get(f"/api/v1/jobs/{job}/models/{v['version']}")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/octet-stream"
        data = r.content
        assert data == store.get_model_version(job, v["version"]).data
        digest = hashlib.sha256(data).hexdigest()
        assert v["sha256"] == digest == r.headers["x-checksum-sha256"]
        assert v["size"] == len(data)
        assert r.headers["repr-digest"] == (
            f"sha-256=:{base64.b64encode(hashlib.sha256(data).digest()).decode()}:"
        )
        assert r.headers["etag"] == f'"{digest}"'
        assert f"{job}-v{v['version']}.model" in r.headers["content-disposition"]
    r = await admin.get(f"/api/v1/jobs/{job}/models/4")
    assert r.status_code == 404
    assert r.json()["detail"] == f"job {job!r} has no model version 4"
    for bad in ("-1", "latest", str(2**31)):
        r = await admin.get(f"/api/v1/jobs/{job}/models/{bad}")
        assert r.status_code == 422, bad
        assert "path parameter 'version'" in r.json()["detail"]
    assert (await admin.get("/api/v1/jobs/job-nope/models")).status_code == 404

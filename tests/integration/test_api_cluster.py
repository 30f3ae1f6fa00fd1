"""``GET /v1/cluster`` against the test broker (issue 16, the dashboard's cluster page): a
scheduler owning every partition, a worker group with its queues and the lease it holds, the
projector's group; and a clear 503, in bounded time, when no broker answers."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from duetime.core.config import CommonSettings
from duetime.infra.process import free_port
from tests.helpers import wait_for
from tests.integration.test_api import assert_error, job_body
from tests.integration.test_api_support import RunningApi, running_stack

TOKEN = "cluster-test-token-0123456789"
PRIORITIES = ["critical", "high", "normal", "low"]


@pytest.fixture
def api(settings: CommonSettings) -> Iterator[RunningApi]:
    running = RunningApi(settings, tokens=(TOKEN,))
    yield running
    running.stop()


def test_the_cluster_shows_scheduler_ownership_workers_queues_and_leases(
    settings: CommonSettings, api: RunningApi
) -> None:
    prefix = settings.topic_prefix
    with running_stack(settings) as sink, api.client(TOKEN) as c:
        sink.gate.clear()  # the job below holds its lease until the checks are done
        try:
            body = job_body(
                name="held",
                schedule={"at": datetime.now(UTC).isoformat()},
                target={"type": "http", "url": sink.url},
                payload={"gated": True},
            )
            assert c.post("/v1/jobs", json=body).status_code == 201

            def holding() -> dict[str, Any] | None:
                answer = c.get("/v1/cluster")
                assert answer.status_code == 200, answer.text
                got = answer.json()
                workers = [g for g in got["workers"] if g["group"] == f"{prefix}workers"]
                held = [m for g in workers for m in g["members"] if m["leases_held"]]
                # the projector joins its group on its own time: wait for it too
                projector = got["projector"] and got["projector"]["members"]
                return got if held and projector else None

            shown = wait_for(
                holding, 60, "the worker's lease and the projector's group", interval_s=0.5
            )
        finally:
            sink.gate.set()
        # callers at the same time share one describe, and each gets the whole answer
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: c.get("/v1/cluster"), range(4)))
        assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
        assert all(a.json()["schedulers"]["members"] for a in answers)
    assert shown is not None
    got: dict[str, Any] = shown
    assert got["prefix"] == prefix and got["partitions"] == settings.partitions
    # the scheduler owns every partition, so none is unowned
    schedulers = got["schedulers"]
    assert schedulers["group"] == f"{prefix}schedulers" and schedulers["state"] == "stable"
    assert [m["partitions"] for m in schedulers["members"]] == [list(range(settings.partitions))]
    assert schedulers["members"][0]["client_id"].startswith("duetime-")
    assert got["unowned_partitions"] == []
    # the one worker reads the default queue's four priorities, every partition of each
    (group,) = [g for g in got["workers"] if g["group"] == f"{prefix}workers"]
    assert group["queues"] == ["default"] and group["role"] == "worker"
    (member,) = group["members"]
    assert member["worker_id"].startswith("api-w-") and member["host"]
    assert [(q["queue"], q["priority"]) for q in member["queues"]] == [
        ("default", p) for p in PRIORITIES
    ]
    assert all(q["partitions"] == list(range(settings.partitions)) for q in member["queues"])
    assert member["leases_held"] == 1
    renewed = datetime.fromisoformat(member["last_lease_renewal_at"].replace("Z", "+00:00"))
    at = datetime.fromisoformat(got["at"].replace("Z", "+00:00"))
    assert abs((at - renewed).total_seconds()) < 120 and member["seen_at"] == got["at"]
    # the projector's group reads the job-keyed topics
    projector = got["projector"]
    assert projector["group"] == f"{prefix}projector" and projector["members"]
    assert f"{prefix}jobs" in projector["members"][0]["topics"]
    # no other test's groups leak in as workers of this prefix
    assert all(g["group"].startswith(prefix) for g in got["workers"])


def test_unknown_query_and_no_token_are_refused(api: RunningApi) -> None:
    with api.client() as anonymous:
        assert_error(anonymous.get("/v1/cluster"), 401, "unauthorized")
    with api.client(TOKEN) as c:
        assert_error(c.get("/v1/cluster", params={"group": "x"}), 400)


def test_no_broker_is_a_clear_503_in_bounded_time(settings: CommonSettings) -> None:
    gone = replace(settings, bootstrap_servers=f"127.0.0.1:{free_port()}")
    api = RunningApi(gone, tokens=(TOKEN,))
    try:
        with api.client(TOKEN) as c:
            # the client gives up after 30 s: an answer at all is the bound being kept
            error = assert_error(c.get("/v1/cluster"), 503, "unavailable")
            assert "Kafka did not answer" in error["message"]
            # calls at the same time share the describe and its 503: never a hang
            with ThreadPoolExecutor(3) as pool:
                answers = list(pool.map(lambda _: c.get("/v1/cluster"), range(3)))
            for answer in answers:
                assert_error(answer, 503, "unavailable")
    finally:
        api.stop()

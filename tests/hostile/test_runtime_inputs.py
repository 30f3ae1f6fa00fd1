"""Hostile inputs only a running role can judge: raw records past the API, Python refs and
tasks, HTTP targets the worker must not call, secrets that must not leak, replays.

One stack of real role processes for the module; the last test asserts it survived (same
PIDs, plain jobs fire, no secret and no injected line in any role's log). See README.md.
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from duetime.core.errors import ValidationError
from duetime.schemas.codec import Codec
from tests.e2e.procs import Role
from tests.helpers import TopicReader, wait_for
from tests.hostile.conftest import PAST, HostileStack, assert_refused


def job(stack: HostileStack, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "job_id": str(uuid.uuid4()),
        "name": "hostile-runtime",
        "schedule": PAST,
        "target": {"type": "http", "url": stack.sink.url},
        "payload": {},
        "retry": {"max_retries": 0},
        "timeout_s": 5,
    }
    body.update(fields)
    return body


def produce(stack: HostileStack, topic: str, key: str, value: bytes) -> tuple[int, int]:
    """Write one raw record (past every producer's validation); its (partition, offset)."""
    producer = Producer({"bootstrap.servers": stack.settings.bootstrap_servers, "acks": "all"})
    where: list[tuple[int, int]] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        where.append((msg.partition(), msg.offset()))

    producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
    assert producer.flush(30) == 0, "the raw record was not acknowledged"
    return where[0]


def dead_letters(stack: HostileStack, job_id: str) -> list[dict[str, Any]]:
    """The job's dead letters, once there is one."""

    def listed() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = stack.get_json("/v1/dlq", job_id=job_id)["items"]
        return items

    return wait_for(listed, 30, f"a dead letter of {job_id}")


def error_of(execution: dict[str, Any]) -> dict[str, Any]:
    error = execution.get("error")
    assert isinstance(error, dict), f"the execution has no error: {execution}"
    return error


# --- finding 1 (past the API): a raw JobDefinition with the DAG label ---------------------


@pytest.mark.parametrize("value", ["uuid", "not-a-uuid"])
def test_raw_job_with_dag_label_does_not_stop_the_scheduler(
    stack: HostileStack, value: str
) -> None:
    built = stack.sdk.build(job(stack, name="raw-dag-label"))
    label = str(uuid.uuid4()) if value == "uuid" else value
    definition = replace(built, labels={"duetime.dag": label})  # as a raw writer could set it
    job_id = definition.job_id
    partition, offset = produce(stack, stack.topics.jobs, job_id, Codec().dump(definition))

    def handled() -> str | None:
        stack.assert_up()
        resp = stack.api.get(f"/v1/jobs/{job_id}")
        if resp.status_code == 200 and resp.json()["status"] in ("failed", "dead"):
            return "marked " + str(resp.json()["status"])
        for p in stack.parked():
            if (p.topic, p.partition, p.offset) == (stack.topics.jobs, partition, offset):
                assert p.error, "parked without a reason (header duetime-error)"
                if p.role == "scheduler":
                    return f"parked: {p.error}"
        return None

    wait_for(handled, 60, "the scheduler to park the record or mark the job failed", 1.0)
    stack.assert_up()


def test_restores_over_bad_records_keep_schedulers_up(stack: HostileStack) -> None:
    """The finding's scheduler exited again at every restore of the partition. A bad record
    on every partition, then a second scheduler joins (it restores what it is given) and
    leaves (the first restores what comes back): both stay up, plain jobs fire throughout."""
    partitions: set[int] = set()
    for _ in range(100):
        if len(partitions) == stack.settings.partitions:
            break
        built = stack.sdk.build(job(stack, name="raw-dag-label-restore"))
        definition = replace(built, labels={"duetime.dag": str(uuid.uuid4())})
        encoded = Codec().dump(definition)
        partitions.add(produce(stack, stack.topics.jobs, definition.job_id, encoded)[0])
    assert len(partitions) == stack.settings.partitions, "a bad record on every partition"
    first = stack.roles["scheduler"]
    owned_before = first.log().count("owning partition")
    extra = Role.start(f"{first.name}-extra", ["scheduler"], stack.env)
    try:

        def restored() -> bool:
            stack.assert_up()
            assert extra.process.poll() is None, f"the joining scheduler exited:\n{extra.log()}"
            return "owning partition" in extra.log()

        wait_for(restored, 90, "the joining scheduler to restore a partition", 0.2)
        stack.plain_jobs_fire(count=stack.settings.partitions)
        assert extra.process.poll() is None, f"the joining scheduler exited:\n{extra.log()}"
    finally:
        code = extra.stop(30)
    assert code == 0, f"the joining scheduler ended with {code}:\n{extra.log()[-3000:]}"

    def came_back() -> bool:
        stack.assert_up()
        return first.log().count("owning partition") > owned_before

    wait_for(came_back, 90, "the first scheduler to restore the partitions that came back", 0.2)
    stack.plain_jobs_fire(count=stack.settings.partitions)


# --- finding 2: Python refs that must never run ------------------------------------------

FORBIDDEN_REFS = [
    "sys:exit",
    "this:s",
    "builtins:print",
    "os:path.__class__.__subclasses__",
    "os:_exit",
    "os:system",
    "subprocess:run",
    "importlib:import_module",
    "tests.hostile.tasks:ok.__globals__",
]


def refused_or_unknown_target(stack: HostileStack, body: dict[str, Any]) -> str:
    """422 naming target.ref at creation, or: accepted, then dead after one attempt with
    reason unknown_target (never run, never retried)."""
    resp = stack.post_job(body)
    if resp.status_code != 201:
        assert_refused(resp, "target.ref", (422,))
        stack.assert_nothing_written({body["job_id"]})
        return "refused"
    execution = stack.wait_finished_execution(body["job_id"])
    assert execution["status"] == "dead", execution
    assert error_of(execution)["reason"] == "unknown_target", execution
    assert len(execution["attempts"]) == 1, f"retried: {execution['attempts']}"
    return "unknown_target"


@pytest.mark.parametrize("ref", FORBIDDEN_REFS)
def test_forbidden_python_refs_never_run(stack: HostileStack, ref: str) -> None:
    body = job(stack, target={"type": "python", "ref": ref}, retry={"max_retries": 2})
    refused_or_unknown_target(stack, body)
    sdk_body = dict(body, job_id=str(uuid.uuid4()))
    try:
        stack.sdk.create_job(sdk_body)
    except ValidationError as exc:
        assert "target.ref" in str(exc.details.get("field")), exc
    else:
        execution = stack.wait_finished_execution(sdk_body["job_id"])
        assert error_of(execution)["reason"] == "unknown_target", execution
    stack.assert_up()
    # what importing or calling them prints (the workers' stdout is their log): "this" is not
    # callable, so only its import would show that it was not refused before importing
    log = stack.roles["worker"].log()
    assert "Beautiful is better than ugly" not in log, "the worker imported 'this'"
    assert "ExecutionContext(" not in log, "the worker called builtins:print"


def test_raw_execution_request_with_forbidden_ref(stack: HostileStack) -> None:
    """An execution request written straight to an execution topic (past the API and the
    scheduler): the worker's own allow-list refuses it, permanently."""
    reader = TopicReader(stack.settings, [stack.topics.execution("normal")], "execution")
    results = TopicReader(stack.settings, [stack.topics.results], "result")
    try:
        sample = wait_for(reader.snapshot, 30, "an execution request to copy")[0]
        for ref in ("sys:exit", "os:_exit", "builtins:print"):
            request = {k: v for k, v in sample.items() if not k.startswith("_")} | {
                "execution_id": str(uuid.uuid4()),
                "job_id": str(uuid.uuid4()),
                "attempt": 1,
                "target": {"ref": ref},
            }
            produce(
                stack,
                stack.topics.execution("normal"),
                request["job_id"],
                Codec().encode("execution", request),
            )

            def outcome(eid: str = request["execution_id"]) -> dict[str, Any] | None:
                stack.assert_up()
                done = [
                    r
                    for r in results.snapshot()
                    if r["execution_id"] == eid and r["status"] not in ("running",)
                ]
                return done[-1] if done else None

            result = wait_for(outcome, 30, f"the worker's result for a raw {ref} request", 0.2)
            assert result is not None
            assert result["status"] != "success", result
            assert result["error"]["reason"] == "unknown_target", result
            assert result["error"]["retryable"] is False, result
    finally:
        reader.close()
        results.close()


@pytest.mark.parametrize(
    "task",
    [
        "raise_system_exit",
        "raise_keyboard_interrupt",
        "async_system_exit",
        "async_keyboard_interrupt",
    ],
)
def test_task_raising_base_exceptions_fails_the_attempt(stack: HostileStack, task: str) -> None:
    body = job(stack, target={"type": "python", "ref": f"tests.hostile.tasks:{task}"})
    assert stack.post_job(body).status_code == 201
    execution = stack.wait_finished_execution(body["job_id"])
    assert execution["status"] == "dead", execution
    assert error_of(execution)["message"] or error_of(execution)["type"], execution
    stack.assert_up()


def test_allowed_task_runs(stack: HostileStack) -> None:
    """The refusals above are of the refs, not of every Python target."""
    body = job(stack, target={"type": "python", "ref": "tests.hostile.tasks:ok"})
    assert stack.post_job(body).status_code == 201
    execution = stack.wait_finished_execution(body["job_id"])
    assert execution["status"] == "success", execution


# --- finding 5: SSRF and the failing target's body -------------------------------------------

METADATA = [
    ("http://169.254.169.254/computeMetadata/v1/?recursive=true", {"Metadata-Flavor": "Google"}),
    ("http://169.254.169.254/latest/meta-data/", {}),
    ("http://2852039166/computeMetadata/v1/", {"Metadata-Flavor": "Google"}),
    ("http://0xA9FEA9FE/latest/meta-data/", {}),
    ("http://169.254.170.2/v2/credentials", {}),
    ("http://[fe80::1]/", {}),
    ("http://[::ffff:169.254.169.254]/", {}),
]


@pytest.mark.parametrize(("url", "headers"), METADATA, ids=[u for u, _ in METADATA])
def test_link_local_targets_denied(stack: HostileStack, url: str, headers: dict[str, str]) -> None:
    """Refused at creation (naming the target), or denied by the worker: dead after one
    attempt (a permanent refusal, not a connection failure that is retried)."""
    body = job(
        stack,
        target={"type": "http", "url": url, "headers": headers},
        retry={"max_retries": 2, "base_delay_s": 0.1},
        timeout_s=3,
    )
    resp = stack.post_job(body)
    if resp.status_code != 201:
        assert_refused(resp, "target", (422,))
        stack.assert_nothing_written({body["job_id"]})
        return
    execution = stack.wait_finished_execution(body["job_id"])
    assert execution["status"] == "dead", execution
    assert len(execution["attempts"]) == 1, f"retried (not denied): {execution['attempts']}"
    assert error_of(execution)["retryable"] is False, execution
    assert error_of(execution)["message"], execution


def test_target_error_body_not_stored(stack: HostileStack) -> None:
    stack.secrets.add(stack.secret_sink.secret)
    body = job(stack, target={"type": "http", "url": stack.secret_sink.url})
    assert stack.post_job(body).status_code == 201
    execution = stack.wait_finished_execution(body["job_id"])
    assert execution["status"] == "dead", execution
    assert error_of(execution)["http_status"] == 500, execution
    stored = stack.api.get(f"/v1/executions/{execution['execution_id']}")
    assert stored.status_code == 200
    assert stack.secret_sink.secret not in stored.text, "the target's body is in the error"
    dlq = wait_for(
        lambda: [
            d
            for d in stack.get_json("/v1/dlq", job_id=body["job_id"])["items"]
            if d["execution_id"] == execution["execution_id"]
        ],
        30,
        "the dead letter",
    )
    assert stack.secret_sink.secret not in str(dlq)


# --- finding 9: credentials in a target ------------------------------------------------------


def test_target_credentials_masked(stack: HostileStack) -> None:
    password, api_key, token = (f"{k}-{uuid.uuid4().hex}" for k in ("PW", "KEY", "TOKEN"))
    stack.secrets |= {password, api_key, token}
    port = stack.secret_sink.server.server_address[1]
    # URL credentials and an Authorization header cannot go together (the user's header
    # would silently replace them), so one job carries each
    targets: list[dict[str, Any]] = [
        {"url": f"http://alice:{password}@127.0.0.1:{port}/fail?api_key={api_key}&x=1"},
        {
            "url": f"http://127.0.0.1:{port}/fail?api_key={api_key}",
            "headers": {"Authorization": f"Bearer {token}", "X-Api-Key": api_key},
        },
    ]
    shown: list[str] = []
    for i, target in enumerate(targets):
        body = job(stack, name=f"with-credentials-{i}", target={"type": "http", **target})
        created = stack.post_job(body)
        assert created.status_code == 201, created.text
        execution = stack.wait_finished_execution(body["job_id"])
        assert execution["status"] == "dead", execution
        assert error_of(execution)["http_status"] == 500, execution
        shown += [
            created.text,
            stack.api.get(f"/v1/jobs/{body['job_id']}").text,
            stack.api.get("/v1/jobs", params={"name": body["name"]}).text,
            stack.api.get(f"/v1/jobs/{body['job_id']}/executions").text,
            stack.api.get(f"/v1/executions/{execution['execution_id']}").text,
        ]
        shown.append(str(dead_letters(stack, body["job_id"])))
    for text in shown:
        for secret in (password, api_key, token):
            assert secret not in text, f"a credential is shown verbatim: {text[:600]}"
    # masked when shown, still sent: the target received its credentials
    basic = "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
    got = {r.get("authorization") for r in stack.secret_sink.requests}
    assert basic in got, "the worker did not send the URL's credentials"
    assert f"Bearer {token}" in got, "the worker did not send the job's Authorization header"


# --- finding 12: replaying one dead letter twice ----------------------------------------------


def test_replaying_a_dead_letter_twice_runs_it_once(stack: HostileStack) -> None:
    body = job(stack, name="replay-twice", target={"type": "http", "url": stack.secret_sink.url})
    assert stack.post_job(body).status_code == 201
    first = stack.wait_finished_execution(body["job_id"])
    eid = first["execution_id"]
    wait_for(
        lambda: stack.get_json("/v1/dlq", job_id=body["job_id"])["items"], 30, "the dead letter"
    )
    answers: list[httpx.Response] = []

    def replay() -> None:
        with httpx.Client(base_url=stack.url, timeout=30) as c:
            answers.append(c.post(f"/v1/dlq/{eid}/replay"))

    threads = [threading.Thread(target=replay) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a.status_code < 500 for a in answers), [a.text for a in answers]
    assert any(a.status_code in (200, 202) for a in answers), [a.text for a in answers]
    # one more, sequentially, after both: still the same single replay
    again = stack.api.post(f"/v1/dlq/{eid}/replay")
    assert again.status_code < 500, again.text

    def replay_finished() -> list[dict[str, Any]] | None:
        items = stack.executions(body["job_id"])
        others = [e for e in items if e["execution_id"] != eid]
        return items if others and all(e["status"] in ("dead", "success") for e in items) else None

    items = wait_for(replay_finished, 60, "the replayed execution to finish", 0.3)
    # the control commands of one job are handled in order on its partition: by the time the
    # first replay has run and finished, the later ones have long been handled too
    stack.wait_job(body["job_id"], ("dead", "success"))
    items = stack.executions(body["job_id"])
    assert len(items) == 2, f"{len(items)} executions after replaying one dead letter: {items}"


# --- finding 12: a newline in a name must not forge a log line --------------------------------


@pytest.mark.parametrize("sep", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_newline_in_name_does_not_forge_log_lines(stack: HostileStack, sep: str) -> None:
    injected = f"INJECTED-{uuid.uuid4().hex[:8]}"
    stack.injected_lines.add(injected)
    body = job(
        stack,
        name=f"nice{sep}{injected} level=ERROR msg=forged",
        target={"type": "http", "url": stack.secret_sink.url},
    )
    resp = stack.post_job(body)
    if resp.status_code != 201:
        assert_refused(resp, "name", (422,))
        stack.assert_nothing_written({body["job_id"]})
        return
    # it ran and failed (so every role had a reason to log it)
    assert stack.wait_finished_execution(body["job_id"])["status"] == "dead"


# --- issue 14 item 6: a failed DAG run repaired (the e2e test of the feature, on this stack) ---


def test_a_failed_dag_run_is_repaired_to_success(
    stack: HostileStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """a → b → c where a fails for good until a flag file exists: the run fails and skips b
    and c; once fixed, POST .../retry re-runs a, then b and c, and the run ends success with
    each node run exactly once more. A second retry asks nothing new; a third is a 409."""
    flag = tmp_path_factory.mktemp("dag-repair") / "a-is-fixed"
    tasks = "tests.hostile.repair_tasks"

    def member(key: str, task: str, *depends_on: str) -> dict[str, Any]:
        return {
            "key": key,
            "name": f"repair-{key}",
            "target": {"type": "python", "ref": f"{tasks}:{task}"},
            "payload": {"flag": str(flag)},
            "retry": {"max_retries": 0},
            "depends_on": list(depends_on),
        }

    jobs = [member("a", "fail_until_flag"), member("b", "ok", "a"), member("c", "ok", "b")]
    created = stack.api.post("/v1/dags", json={"name": "repair-e2e", "jobs": jobs})
    assert created.status_code == 201, created.text
    dag_id, job_ids = created.json()["dag_id"], created.json()["job_ids"]
    wait_for(lambda: stack.api.get(f"/v1/dags/{dag_id}").status_code == 200, 30, "the DAG row")
    triggered = stack.api.post(f"/v1/dags/{dag_id}/trigger")
    assert triggered.status_code == 202, triggered.text
    run_id = triggered.json()["dag_run_id"]

    def run(*statuses: str) -> dict[str, Any]:
        """The run once its status is one of ``statuses``; empty (falsy) until then."""
        stack.assert_up()
        for item in stack.get_json(f"/v1/dags/{dag_id}/runs")["items"]:
            if item["dag_run_id"] == run_id and item["status"] in statuses:
                return dict(item)
        return {}

    failed = wait_for(lambda: run("failed"), 60, "the run to fail", 0.2)
    assert failed["node_statuses"] == {"a": "dead", "b": "skipped", "c": "skipped"}
    wait_for(lambda: stack.get_json("/v1/dlq", job_id=job_ids["a"])["items"], 30, "a's letter")
    unknown = stack.api.post(f"/v1/dags/{dag_id}/runs/{uuid.uuid4()}/retry")
    assert unknown.status_code == 404, unknown.text

    flag.touch()  # the operator fixes what a needs
    asked = time.monotonic()
    answer = stack.api.post(f"/v1/dags/{dag_id}/runs/{run_id}/retry")
    assert answer.status_code == 202, answer.text
    assert answer.json() == {
        "dag_id": dag_id,
        "dag_run_id": run_id,
        "rerun": ["a"],
        "reblock": ["b", "c"],
        "already_requested": False,
    }
    again = stack.api.post(f"/v1/dags/{dag_id}/runs/{run_id}/retry")  # a double click
    assert again.status_code == 202, again.text
    assert again.json()["already_requested"] is True

    done = wait_for(lambda: run("success"), 60, "the repaired run to succeed", 0.2)
    print(f"DAG repair: retry asked → run success projected in {time.monotonic() - asked:.2f} s")
    assert done["node_statuses"] == dict.fromkeys("abc", "success")
    assert done["finished_at"] is not None
    # each node ran exactly once more: a twice in all (dead, then success), b and c once
    runs = {
        key: sorted(e["status"] for e in stack.executions(job_id))
        for key, job_id in job_ids.items()
    }
    assert runs == {"a": ["dead", "success"], "b": ["success"], "c": ["success"]}
    finished = stack.api.post(f"/v1/dags/{dag_id}/runs/{run_id}/retry")
    assert finished.status_code == 409, finished.text
    assert "succeeded" in finished.json()["error"]["message"]


# --- the end ---------------------------------------------------------------------------------


def test_stack_survived(stack: HostileStack) -> None:
    stack.assert_survived()

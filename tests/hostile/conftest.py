"""The hostile-input suite's stack: every role as a real process, one stack per test module.

``stack`` (module-scoped) gives each module its own topic prefix and database on the session's
broker and PostgreSQL (as ``settings`` in ``tests/conftest.py`` does per test), and starts a
scheduler, a worker, the resolver, the projector and the API (``tests.e2e.procs.Role``). The
worker may call loopback HTTP sinks (``DUETIME_WORKER_EGRESS_ALLOW=loopback``; link-local is
never allowed) and import ``module:function`` refs under ``tests`` only
(``DUETIME_WORKER_PYTHON_MODULES=tests``). The API runs without tokens on 127.0.0.1.

:class:`HostileStack` holds what the tests assert with: the REST client, an SDK client, the
sinks, a reader of every key written to the jobs and dags topics (to prove a refused create
wrote nothing), and :meth:`HostileStack.assert_survived`, which each module calls in its last
test: the same role PIDs as at the start, plain jobs created now still fire, nothing of a
refused create reached PostgreSQL or Kafka, and no secret or injected line is in a role's log.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg import sql

from duetime.core.config import CommonSettings, Env
from duetime.core.errors import DuetimeError, PayloadTooLarge, ValidationError
from duetime.core.topics import Topics
from duetime.infra.process import free_port
from duetime.producers.sdk import JobClient
from tests.conftest import Services, _drop_database
from tests.e2e.procs import Role, role_env
from tests.faults.support import Parked, parked
from tests.helpers import serve_loopback, stop_server, wait_for
from tests.integration.test_dag_support import delete_internal_topics
from tests.integration.test_worker_support import Sink

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
ROLES = ("api", "scheduler", "worker", "resolver", "projector")
PAST = {"at": "2020-01-01T00:00:00Z"}
"""A one-time schedule in the past: the job runs at once."""
FAR = {"at": "2099-01-01T00:00:00Z"}
"""A one-time schedule that never comes during the test."""
TERMINAL = ("success", "dead", "skipped", "cancelled")


# --- module-scoped topics and database ---------------------------------------------------


@pytest.fixture(scope="module")
def hostile_settings(services: Services, template_database: str) -> Iterator[CommonSettings]:
    """As ``settings`` in tests/conftest.py, for a whole module: its own prefix and database."""
    from confluent_kafka.admin import AdminClient

    from duetime.infra.topics import create_topics

    name = f"h_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.admin_database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_database)
            )
        )
    common = replace(
        CommonSettings.from_env(Env({})),
        bootstrap_servers=services.bootstrap_servers,
        database_url=services.database_url(name),
        topic_prefix=f"h{uuid.uuid4().hex[:10]}.",
        partitions=PARTITIONS,
        instance_id=f"hostile-{uuid.uuid4().hex[:6]}",
    )
    specs = Topics(common.topic_prefix).specs(common.partitions)
    create_topics(common.bootstrap_servers, specs)
    try:
        yield common
    finally:
        delete_internal_topics(common)
        admin = AdminClient({"bootstrap.servers": common.bootstrap_servers})
        for future in admin.delete_topics([s.name for s in specs]).values():
            with contextlib.suppress(Exception):
                future.result()
        _drop_database(services, name)


# --- sinks ---------------------------------------------------------------------------------


class SecretSink:
    """An HTTP target that always answers 500 with a body holding a secret (a stack trace
    with a connection string, as a real failing service might): the body must never reach
    an execution's stored error, a dead letter or a log."""

    def __init__(self) -> None:
        self.secret = f"SINK-SECRET-{uuid.uuid4().hex}"
        self.requests: list[dict[str, str]] = []
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with sink.lock:
                    sink.requests.append({k.lower(): v for k, v in self.headers.items()})
                body = f"Traceback: postgresql://admin:{sink.secret}@db/prod".encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET = do_PUT = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = serve_loopback(Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/fail"

    def stop(self) -> None:
        stop_server(self.server)


# --- every key written to the jobs and dags topics ----------------------------------------


class KeyLog:
    """A read_uncommitted consumer of some topics in a thread: how many records each key has,
    and how far each partition has been read (so a check can wait until the reader has seen
    everything written before it, rather than sleep)."""

    def __init__(self, settings: CommonSettings, topics: list[str]) -> None:
        self.settings = settings
        self.topics = topics
        self.counts: dict[str, Counter[str]] = {t: Counter() for t in topics}
        self.positions: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        conf = {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"hostile-keys-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_uncommitted",  # an aborted write is a write attempt too
            "enable.auto.commit": False,
            "log_level": 3,
        }
        self._consumer = Consumer(conf)
        self._watermarks = Consumer({**conf, "group.id": f"hostile-wm-{uuid.uuid4().hex[:8]}"})
        self._tps = [TopicPartition(t, p, 0) for t in topics for p in range(settings.partitions)]
        self._consumer.assign(self._tps)
        self._thread = threading.Thread(target=self._run, name="hostile-keys", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._consumer.consume(500, 0.1)
            except KafkaException:
                continue
            with self._lock:
                for msg in batch:
                    if msg.error():
                        continue
                    key = (msg.key() or b"").decode(errors="replace")
                    self.counts[str(msg.topic())][key] += 1
                    tp = (str(msg.topic()), msg.partition() or 0)
                    self.positions[tp] = (msg.offset() or 0) + 1
            if not batch:
                # transaction markers are never delivered: the position steps over them
                with contextlib.suppress(KafkaException):
                    for at in self._consumer.position(self._consumer.assignment()):
                        with self._lock:
                            where = (at.topic, at.partition)
                            if at.offset > self.positions.get(where, 0):
                                self.positions[where] = at.offset

    def catch_up(self, timeout_s: float = 30) -> None:
        """Wait until everything written to the topics so far has been read."""
        highs = {
            (tp.topic, tp.partition): self._watermarks.get_watermark_offsets(tp, timeout=10)[1]
            for tp in self._tps
        }

        def caught_up() -> bool:
            with self._lock:
                return all(self.positions.get(tp, 0) >= h for tp, h in highs.items() if h > 0)

        wait_for(caught_up, timeout_s, f"the key reader to reach {highs}", interval_s=0.05)

    def count(self, topic: str, key: str) -> int:
        with self._lock:
            return self.counts[topic][key]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self._consumer.close()
        with contextlib.suppress(Exception):
            self._watermarks.close()


# --- the stack ----------------------------------------------------------------------------


@dataclass
class HostileStack:
    settings: CommonSettings
    topics: Topics
    url: str
    api: httpx.Client
    sdk: JobClient
    sink: Sink
    secret_sink: SecretSink
    roles: dict[str, Role]
    pids: dict[str, int]
    keys: KeyLog
    env: dict[str, str]
    """The roles' environment (to start one more of a role)."""
    refused_jobs: set[str] = field(default_factory=set)
    """Job ids of every refused create: none may exist anywhere at the end."""
    refused_dags: set[str] = field(default_factory=set)
    secrets: set[str] = field(default_factory=set)
    """Strings that must never appear in a role's log."""
    injected_lines: set[str] = field(default_factory=set)
    """Text put after a newline in an input: no log line may start with it."""

    # --- roles ----------------------------------------------------------------------------

    def assert_up(self) -> None:
        """Every role still runs as the process it started as."""
        for name, role in self.roles.items():
            code = role.process.poll()
            assert code is None, f"{name} exited with {code}:\n{role.log()[-4000:]}"
            assert role.process.pid == self.pids[name], f"{name} is not the process it was"

    def logs(self) -> dict[str, str]:
        return {name: role.log() for name, role in self.roles.items()}

    # --- REST -----------------------------------------------------------------------------

    def post_job(self, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
        return self.api.post("/v1/jobs", json=body, **kwargs)

    def get_json(self, path: str, **params: Any) -> Any:
        resp = self.api.get(path, params=params)
        assert resp.status_code == 200, f"GET {path}: {resp.status_code} {resp.text[:500]}"
        return resp.json()

    def wait_job(
        self,
        job_id: str,
        statuses: tuple[str, ...] = TERMINAL,
        timeout_s: float = 60,
        others: dict[str, Role] | None = None,
    ) -> dict[str, Any]:
        """GET /v1/jobs/{id} until its status is one of ``statuses`` (roles checked on the way);
        a timeout says what :meth:`explain` knows (``others``: roles the test started itself)."""
        last: dict[str, Any] = {}

        def reached() -> bool:
            nonlocal last
            self.assert_up()
            resp = self.api.get(f"/v1/jobs/{job_id}")
            assert resp.status_code in (200, 404), f"{resp.status_code} {resp.text[:300]}"
            if resp.status_code == 200:
                last = resp.json()
            return last.get("status") in statuses

        try:
            wait_for(reached, timeout_s, f"job {job_id} to reach {statuses}", interval_s=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.explain(job_id, last, others)}") from None
        return last

    def explain(
        self, job_id: str, last: dict[str, Any], others: dict[str, Role] | None = None
    ) -> str:
        """What a timed-out wait knew: the job as last read, its executions, and what each
        role logged last (INFO and above), so a failure far away (CI) can be read."""
        resp = self.api.get(f"/v1/jobs/{job_id}/executions")
        parts = [f"job: {json.dumps(last)[:1500]}", f"executions: {resp.text[:3000]}"]
        logs = self.logs() | {name: role.log() for name, role in (others or {}).items()}
        for name, text in logs.items():
            lines = [line for line in text.splitlines() if " DEBUG " not in line]
            parts.append(f"--- {name}, last lines ---\n" + "\n".join(lines[-25:]))
        return "\n".join(parts)

    def executions(self, job_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get_json(f"/v1/jobs/{job_id}/executions")["items"]
        return items

    def wait_finished_execution(self, job_id: str, timeout_s: float = 60) -> dict[str, Any]:
        """The job's first execution once it is terminal (``dead`` or ``success``)."""
        got: dict[str, Any] = {}

        def finished() -> bool:
            nonlocal got
            self.assert_up()
            resp = self.api.get(f"/v1/jobs/{job_id}/executions")
            if resp.status_code != 200:
                return False
            items = resp.json()["items"]
            done = [e for e in items if e["status"] in TERMINAL]
            if done:
                got = done[-1]
            return bool(done)

        wait_for(finished, timeout_s, f"an execution of {job_id} to finish", interval_s=0.2)
        return got

    # --- what was written -----------------------------------------------------------------

    def job_rows(self, job_ids: set[str]) -> list[str]:
        with psycopg.connect(self.settings.database_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT job_id::text FROM jobs WHERE job_id = ANY(%s::uuid[])", (sorted(job_ids),)
            ).fetchall()
        return [r[0] for r in rows]

    def dag_rows(self, dag_ids: set[str]) -> list[str]:
        with psycopg.connect(self.settings.database_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT dag_id::text FROM dags WHERE dag_id = ANY(%s::uuid[])", (sorted(dag_ids),)
            ).fetchall()
        return [r[0] for r in rows]

    def assert_nothing_written(self, job_ids: Iterable[str], dag_ids: Iterable[str] = ()) -> None:
        """No row and no record for any of these ids: the refused create left no trace."""
        jobs, dags = set(job_ids), set(dag_ids)
        self.refused_jobs |= jobs
        self.refused_dags |= dags
        self.keys.catch_up()
        on_topic = [j for j in jobs if self.keys.count(self.topics.jobs, j)]
        on_topic += [d for d in dags if self.keys.count(self.topics.dags, d)]
        assert not on_topic, f"refused, yet on the jobs/dags topics: {on_topic}"
        rows = self.job_rows(jobs) + (self.dag_rows(dags) if dags else [])
        assert not rows, f"refused, yet in PostgreSQL: {rows}"

    def parked(self) -> list[Parked]:
        return parked(self.settings)

    # --- the end of a module ----------------------------------------------------------------

    def plain_jobs_fire(self, count: int = 2 * PARTITIONS, timeout_s: float = 60) -> None:
        """Plain jobs created now (spread over the partitions by their random ids) reach the
        sink and succeed before the deadline."""
        ids = []
        for i in range(count):
            resp = self.post_job(
                {
                    "name": f"plain-after-{i}",
                    "schedule": PAST,
                    "target": {"type": "http", "url": self.sink.url},
                    "payload": {"plain": i},
                }
            )
            assert resp.status_code == 201, resp.text
            ids.append(resp.json()["job_id"])
        for job_id in ids:
            assert self.wait_job(job_id, TERMINAL, timeout_s)["status"] == "success"
        delivered = {d.job_id for d in self.sink.deliveries}
        assert set(ids) <= delivered, f"not delivered: {set(ids) - delivered}"

    def assert_survived(self) -> None:
        self.assert_up()
        self.plain_jobs_fire()
        if self.refused_jobs or self.refused_dags:
            self.assert_nothing_written(self.refused_jobs, self.refused_dags)
        self.assert_up()
        for name, text in self.logs().items():
            for secret in self.secrets:
                assert secret not in text, f"a secret ({secret[:12]}...) is in {name}'s log"
            # a terminal starts a line at "\n" and at "\r" alike
            for line in re.split(r"[\r\n]", text):
                for injected in self.injected_lines:
                    assert not line.startswith(injected), f"{name}'s log has an injected line"


@pytest.fixture(scope="module")
def stack(
    hostile_settings: CommonSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostileStack]:
    settings = hostile_settings
    port = free_port()
    env = role_env(
        settings,
        PYTHONPATH=str(ROOT),
        DUETIME_API_HOST="127.0.0.1",
        DUETIME_API_PORT=str(port),
        DUETIME_METRICS_PORT="0",
        DUETIME_LOG_FORMAT="text",
        DUETIME_SCHEDULER_STATE_DIR=str(tmp_path_factory.mktemp("scheduler-state")),
        DUETIME_LEASE_TTL_S="5",
        DUETIME_WORKER_EGRESS_ALLOW="loopback",
        DUETIME_WORKER_PYTHON_MODULES="tests",
        DUETIME_RESOLVER_COMMIT_INTERVAL_S="0.5",
    )
    env.pop("DUETIME_API_TOKENS", None)
    tag = uuid.uuid4().hex[:4]
    roles = {name: Role.start(f"hostile-{name}-{tag}", [name], env) for name in ROLES}
    pids = {name: role.process.pid for name, role in roles.items()}
    url = f"http://127.0.0.1:{port}"
    api = httpx.Client(base_url=url, timeout=30)
    sink = Sink().start()
    secret_sink = SecretSink()
    sdk = JobClient(settings=settings)
    keys = KeyLog(
        settings, [Topics(settings.topic_prefix).jobs, Topics(settings.topic_prefix).dags]
    )
    hostile = HostileStack(
        settings=settings,
        topics=Topics(settings.topic_prefix),
        url=url,
        api=api,
        sdk=sdk,
        sink=sink,
        secret_sink=secret_sink,
        roles=roles,
        pids=pids,
        keys=keys,
        env=env,
    )
    try:

        def ready() -> bool:
            hostile.assert_up()
            try:
                return api.get("/readyz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, "the API to be ready", interval_s=0.2)
        # the whole path works before any hostile input: scheduler, worker, projector, API
        hostile.plain_jobs_fire(count=1, timeout_s=90)
        yield hostile
    finally:
        api.close()
        for role in roles.values():
            role.stop(10)
        keys.close()
        with contextlib.suppress(Exception):
            sdk.close()
        sink.stop()
        secret_sink.stop()


# --- assertions on refusals -----------------------------------------------------------------


def assert_refused(
    resp: httpx.Response,
    field: str | None,
    statuses: tuple[int, ...] = (400, 413, 422),
) -> dict[str, Any]:
    """A 4xx among ``statuses`` with the documented error body naming ``field`` (a substring
    of ``details.field``, so a DAG member's ``jobs[0].target.ref`` names ``target.ref``)."""
    assert resp.status_code in statuses, (
        f"expected one of {statuses}, got {resp.status_code}: {resp.text[:800]}"
    )
    body = resp.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), resp.text[:800]
    error = body["error"]
    assert {"code", "message", "details"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"], error
    if field is not None:
        named = str(error["details"].get("field", ""))
        assert field in named, f"the error names {named!r}, not {field!r}: {error}"
    return dict(error)


def assert_sdk_refused(call: Callable[[], Any], field: str | None) -> DuetimeError:
    """The SDK refuses with a ValidationError / PayloadTooLarge naming ``field``."""
    try:
        call()
    except (ValidationError, PayloadTooLarge) as exc:
        if field is not None:
            named = f"{exc.details.get('field', '')} {getattr(exc, 'field', '') or ''} {exc}"
            assert field in named, f"the SDK's error does not name {field!r}: {exc!r}"
        return exc
    except Exception as exc:  # anything else is the finding: say what it was
        raise AssertionError(
            f"the SDK raised {type(exc).__name__}: {exc!s:.300}, not a ValidationError"
        ) from exc
    raise AssertionError(f"the SDK accepted an input naming {field!r} as bad")


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def thread_count(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads line in /proc/{pid}/status")


def now_s() -> float:
    return time.monotonic()

"""Property-based runs against the live API's /openapi.json: schemathesis per operation and
stateful (following the document's links: create a job, read it, pause it, ...), and hostile
bodies and query values of our own (deep nesting, NUL and control characters): no 5xx,
every status documented, every answer matching its documented schema."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.errors import FlakyStrategyDefinition, Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from duetime.core.config import CommonSettings
from tests.integration.test_api_support import RunningApi

TOKEN = "openapi-test-token-0123456789"
_COMMANDS = ("pause", "resume", "trigger", "cancel")
EXAMPLES_PER_OPERATION = 15  # x 2 modes x ~30 operations: about 25 s


def test_no_5xx_and_every_answer_matches_the_published_schema(settings: CommonSettings) -> None:
    # with a token configured, as the published security scheme says: schemathesis also
    # checks that requests without it (or with a wrong one) are refused
    api = RunningApi(settings, max_payload_bytes=4096, tokens=(TOKEN,))
    try:
        schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")

        @schema.auth()
        class Bearer:
            def get(self, case: schemathesis.Case[Any], ctx: object) -> str:
                return TOKEN

            def set(self, case: schemathesis.Case[Any], data: str, ctx: object) -> None:
                case.headers["Authorization"] = f"Bearer {data}"

        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]  # an invalid schema fails the test here
        assert len(operations) >= 18
        failures: list[str] = []
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @given(case=operation.as_strategy(generation_mode=mode))
                @hsettings(
                    max_examples=EXAMPLES_PER_OPERATION,
                    deadline=None,
                    database=None,
                    derandomize=True,  # the same examples on every run: no flaky CI
                    suppress_health_check=list(HealthCheck),
                )
                def run(case: schemathesis.Case[Any]) -> None:
                    # A schema-valid body may still be an invalid job (a cron that never
                    # fires, an unknown time zone, a bad ref): those are 422 by design, so
                    # "valid data accepted" cannot hold; every other check runs.
                    case.call_and_validate(
                        base_url=api.url,
                        excluded_checks=[positive_data_acceptance],
                    )

                try:
                    run()
                except Unsatisfiable:
                    assert mode is GenerationMode.NEGATIVE  # no input of it can be invalid
                except BaseException as exc:  # collect every operation's failure, then report
                    failures.append(f"{operation.label} [{mode.value}]: {exc}"[:2000])
        assert not failures, "\n\n".join(failures)
        # a valid create, checked like the generated cases: whether the generated bodies
        # include a valid job depends on how they are drawn from the document, so the 201
        # path (and its answer's schema) is not left to chance
        create = next(o for o in operations if o.method.upper() == "POST" and o.path == "/v1/jobs")
        valid = create.Case(
            body={"name": "openapi-valid", "target": {"type": "kafka", "topic": "sink.events"}},
            headers={"Authorization": f"Bearer {TOKEN}"},
            media_type="application/json",
        )
        answer = valid.call_and_validate(
            base_url=api.url, excluded_checks=[positive_data_acceptance]
        )
        assert answer.status_code == 201, answer.text
        # the run reached the routes' logic, not only the token check
        metrics = httpx.get(f"{api.url}/metrics").text
        for route, status in (("/v1/jobs", "201"), ("/v1/jobs", "422"), ("/v1/jobs", "400")):
            assert f'method="POST",route="{route}",status="{status}"' in metrics, status
    finally:
        api.stop()


STATEFUL_SCENARIOS = 40


def test_stateful_runs_along_the_links_find_no_5xx(settings: CommonSettings) -> None:
    api = RunningApi(settings, max_payload_bytes=4096, tokens=(TOKEN,))
    try:
        schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
        calls: list[tuple[str, int]] = []

        class Machine(schema.as_state_machine()):  # type: ignore[misc]  # a generated class
            def get_call_kwargs(self, case: schemathesis.Case[Any]) -> dict[str, Any]:
                # the token on every call: the scenarios are about what follows a create
                return {"base_url": api.url, "headers": {"Authorization": f"Bearer {TOKEN}"}}

            def after_call(self, response: Any, case: schemathesis.Case[Any]) -> None:
                calls.append((f"{case.method} {case.path}", response.status_code))

            def validate_response(
                self, response: Any, case: schemathesis.Case[Any], **kwargs: Any
            ) -> None:
                assert response.status_code < 500, (case.method, case.path, response.text)
                case.validate_response(response, excluded_checks=[positive_data_acceptance])

        # The server keeps state between scenarios (a job id created once answers 200, not 201,
        # the next time), so a replayed choice sequence can enable other rules and hypothesis
        # stops with FlakyStrategyDefinition. A 5xx is never that error; every call's status
        # is checked below, whatever stopped the run.
        with contextlib.suppress(FlakyStrategyDefinition):
            Machine.run(
                settings=hsettings(
                    max_examples=STATEFUL_SCENARIOS,
                    stateful_step_count=6,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                )
            )
        assert all(status < 500 for _, status in calls), [c for c in calls if c[1] >= 500]
        # the links were followed: a job created over REST was then addressed by its id (an
        # unknown id answers 404 on each of these, so a success means the link's id was used;
        # which of the links hypothesis draws depends on the document's set of links)
        assert ("POST /v1/jobs", 201) in calls, calls[:20]
        by_id = {
            ("GET /v1/jobs/{job_id}", 200),
            ("PATCH /v1/jobs/{job_id}", 200),
            ("DELETE /v1/jobs/{job_id}", 200),
            *((f"POST /v1/jobs/{{job_id}}/{verb}", 202) for verb in _COMMANDS),
        }
        assert by_id & set(calls), sorted(set(calls))
    finally:
        api.stop()


_HOSTILE_TEXT = st.text(
    alphabet=st.sampled_from(["\x00", "\x1b", "\n", "\ud800", "a", "[", "{", '"', "\\", "\u202e"]),
    max_size=6,
)


def _nested(value: Any, depth: int, kind: str) -> Any:
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(
        st.sampled_from(["/v1/jobs", "/v1/dags", "/v1/dlq/replay", "/v1/dlq/replay-progress"])
    )
    leaf = draw(st.one_of(_HOSTILE_TEXT, st.integers(), st.just(10**400), st.none()))
    depth = draw(st.sampled_from([0, 1, 5, 62, 63, 64, 65, 100, 500, 950]))
    kind = draw(st.sampled_from(["list", "dict"]))
    job = {
        "name": draw(_HOSTILE_TEXT | st.just("ok")),
        "target": {
            "type": "http",
            "url": draw(
                st.sampled_from(
                    ["http://127.0.0.1:9/h", "http://u:p@127.0.0.1:9/h?\x00", "http://\x00/"]
                )
            ),
        },
        "payload": _nested(leaf, depth, kind),
        "schedule": draw(
            st.sampled_from(
                [
                    None,
                    {"at": "9999-12-31T23:30:00-01:00"},
                    {"at": "0001-01-01T00:30:00+01:00"},
                    {"cron": "0 2 * * *", "timezone": "\x00"},
                ]
            )
        ),
    }
    body: Any = {
        "/v1/jobs": job,
        "/v1/dags": {"name": job["name"], "jobs": [{"key": "a", **job, "schedule": None}]},
        "/v1/dlq/replay": {"name": leaf if isinstance(leaf, str) else job["name"]},
        "/v1/dlq/replay-progress": {"execution_ids": _nested(leaf, depth, kind)},
    }[path]
    return path, json.dumps(body).encode()


def test_hostile_bodies_and_query_values_find_no_5xx(settings: CommonSettings) -> None:
    api = RunningApi(settings, max_payload_bytes=4096)
    try:
        with httpx.Client(base_url=api.url, timeout=30) as c:

            @given(hostile_bodies())
            @hsettings(
                max_examples=150,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def bodies(case: tuple[str, bytes]) -> None:
                path, raw = case
                r = c.post(path, content=raw, headers={"Content-Type": "application/json"})
                assert r.status_code < 500, (path, raw[:200], r.text)
                if r.status_code >= 400:
                    assert set(r.json()["error"]) == {"code", "message", "details"}

            @given(
                st.sampled_from(
                    [
                        ("/v1/jobs", "name"),
                        ("/v1/jobs", "name_contains"),
                        ("/v1/jobs", "cursor"),
                        ("/v1/jobs", "status"),
                        ("/v1/dlq", "name"),
                        ("/v1/dlq", "job_id"),
                        ("/v1/dlq", "cursor"),
                        ("/v1/dags", "name_contains"),
                        ("/v1/stats/lag", "group"),
                    ]
                ),
                st.text(max_size=20),
            )
            @hsettings(
                max_examples=150,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def queries(where: tuple[str, str], value: str) -> None:
                path, param = where
                r = c.get(path, params={param: value})
                assert r.status_code < 500, (path, param, value, r.text)

            bodies()
            queries()
    finally:
        api.stop()

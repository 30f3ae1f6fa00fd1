"""The web dashboard (issues 9 and 16) in headless Chromium, against the roles as real processes.

The API runs with a bearer token, so the dashboard is used as an operator would: sign in,
create jobs over the REST API, find them in the list, open one, pause and resume it, run a
DAG and see its graph coloured by status (a failed run in the legend's colour of a final
failure), find DAG jobs marked and linked to their DAG, tell a job's lifecycle from its last
run's outcome, see who owns which partition on the cluster page, replay a dead-lettered
execution and see it succeed. A job named ``<script>alert(1)</script>`` must show as text
(any JavaScript dialog fails the test).

Chromium is Debian's (``apt-get install -y chromium``; ``./run test`` installs it), driven by
the ``playwright`` package; ``playwright install`` is never needed. With
``DUETIME_UI_SCREENSHOTS=<dir>`` the test also seeds a busier workload and saves screenshots
of the main pages there (``docs/screenshots`` for the README).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright

from duetime.core.config import CommonSettings
from duetime.infra.process import free_port
from tests.e2e import output_tasks
from tests.e2e.procs import Role, role_env
from tests.helpers import wait_for
from tests.integration.test_worker_support import Sink

TOKEN = "ui-test-token-0123456789abcdef"
XSS_NAME = "<script>alert(1)</script>"
TASKS = "tests.e2e.test_dag_tasks"
OUTPUT_TASKS = "tests.e2e.output_tasks"
SCREENSHOTS = os.environ.get("DUETIME_UI_SCREENSHOTS")
WAIT_MS = 60_000  # a deadline for what the stack must do (the machine may be busy)


def chromium_path() -> str:
    path = os.environ.get("DUETIME_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        pytest.fail(
            f"no Chromium at {path}: apt-get install -y chromium (./run test installs it), "
            "or point DUETIME_CHROMIUM at one"
        )
    return path


@dataclass
class Stack:
    url: str
    api: httpx.Client
    sink: Sink
    roles: list[Role]


@pytest.fixture
def stack(settings: CommonSettings) -> Iterator[Stack]:
    sink = Sink().start()
    port = free_port()
    env = role_env(
        settings,
        DUETIME_API_PORT=str(port),
        DUETIME_API_TOKENS=TOKEN,
        DUETIME_MISFIRE_THRESHOLD_S="60",
    )
    roles = [
        Role.start(name, [name], env)
        for name in ("api", "projector", "scheduler", "worker", "resolver")
    ]
    url = f"http://127.0.0.1:{port}"
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)

    def ready() -> bool:
        for role in roles:
            assert role.process.poll() is None, f"{role.name} exited:\n{role.log()[-3000:]}"
        try:
            return api.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, 60, "the API to be ready", interval_s=0.2)
        yield Stack(url, api, sink, roles)
    finally:
        api.close()
        for role in roles:
            role.stop(10)
        sink.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    tab = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", on_dialog)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    try:
        yield tab
    finally:
        context.close()
    assert not dialogs, f"a JavaScript dialog opened: {dialogs} (markup was run, not shown)"
    assert not errors, f"uncaught errors in the page: {errors}"


def create_job(api: httpx.Client, **body: Any) -> dict[str, Any]:
    answer = api.post("/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def shot(tab: Page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        tab.evaluate("document.getElementById('toasts').replaceChildren()")
        tab.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def soon(seconds: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def test_dashboard_end_to_end(stack: Stack, page: Page) -> None:
    api = stack.api
    tag = uuid.uuid4().hex[:6]
    yearly = {"cron": "0 3 1 1 *", "timezone": "Europe/Berlin"}
    sink_target = {"type": "http", "url": stack.sink.url}
    listed = [
        create_job(
            api,
            name=f"ui-{tag}-report-{i}",
            schedule=yearly,
            target=sink_target,
            priority=("critical", "high", "normal", "low")[i % 4],
            payload={"n": i},
        )
        for i in range(6)
    ]
    xss = create_job(
        api,
        name=XSS_NAME,
        schedule=yearly,
        target=sink_target,
        payload={"html": '<img src=x onerror="alert(2)">', "n": "</pre><b>bold</b>"},
        labels={"team": "<i>ops</i>"},
    )
    busy = seed_busy_workload(stack) if SCREENSHOTS else None

    # -- sign in: the API has a token, the dashboard asks for it ---------------------------
    page.goto(f"{stack.url}/ui/")
    expect(page.locator("form.signin")).to_be_visible()
    page.fill("#token", TOKEN)
    page.click("form.signin button[type=submit]")
    expect(page.locator("[data-stat=jobs] .stat-value")).to_have_text(re.compile(r"\d"))

    # -- jobs list: the jobs created over the API, searchable --------------------------------
    page.click("nav a[data-nav=jobs]")
    for job in listed:
        expect(page.locator(f"tr[data-job-id='{job['job_id']}']")).to_be_visible()
    page.fill("input[name=q]", f"ui-{tag}-report-3")
    page.press("input[name=q]", "Enter")
    expect(page.locator("table[data-testid=jobs-table] tbody tr")).to_have_count(1)
    page.select_option("select[name=priority]", "critical")
    expect(page.locator("p.empty")).to_have_text("No jobs match.")
    page.click("a:text('Clear')")

    # -- a job named like markup is text, everywhere -----------------------------------------
    link = page.locator(f"tr[data-job-id='{xss['job_id']}'] td.name a")
    expect(link).to_have_text(XSS_NAME)
    assert page.locator("main script").count() == 0
    link.click()
    expect(page.locator("h1.job-name")).to_have_text(XSS_NAME)
    expect(page.locator("pre.json").last).to_contain_text('<img src=x onerror=\\"alert(2)\\">')
    assert page.locator("main img, main b, main i:not(.swatch)").count() == 0
    expect(page.get_by_text("<i>ops</i>")).to_be_visible()

    # -- a job's page: pause and resume -------------------------------------------------------
    target = listed[0]
    page.goto(f"{stack.url}/ui/#/jobs/{target['job_id']}")
    expect(page.locator("h1.job-name")).to_have_text(f"ui-{tag}-report-0")
    expect(page.locator("ol.next-runs li")).to_have_count(5)
    lifecycle = page.locator(".title-row [data-lifecycle]")
    expect(lifecycle).to_have_text("active")
    page.click("button[data-action=pause]")
    expect(lifecycle).to_have_text("paused")
    expect(page.locator("button[data-action=resume]")).to_be_enabled()
    page.click("button[data-action=resume]")
    expect(lifecycle).to_have_text("active")
    expect(page.locator("button[data-action=pause]")).to_be_enabled()

    # -- lifecycle and last outcome apart: a cron job whose one manual trigger failed --------
    check_lifecycle_apart_from_outcome(stack, page, tag)

    # -- a DAG: trigger a run, see every node coloured by its status --------------------------
    ok = {"type": "python", "ref": f"{TASKS}:ok"}
    dag = api.post(
        "/v1/dags",
        json={
            "name": f"ui-{tag}-pipeline",
            "jobs": [
                {"key": k, "name": f"ui-{tag}-{k}", "target": ok, "depends_on": d}
                for k, d in (
                    ("extract", []),
                    ("clean", ["extract"]),
                    ("audit", ["extract"]),
                    ("load", ["clean", "audit"]),
                )
            ],
        },
    )
    assert dag.status_code == 201, dag.text
    dag_id = dag.json()["dag_id"]
    page.click("nav a[data-nav=dags]")
    page.click(f"tr[data-dag-id='{dag_id}'] a")
    expect(page.locator("svg.dag g.node")).to_have_count(4)
    page.click("button[data-action=trigger-dag]")
    graph = page.locator("[data-testid=dag-graph]")
    expect(graph).to_have_attribute("data-run-id", re.compile(r"\S"))
    for key in ("extract", "clean", "audit", "load"):
        expect(graph.locator(f"g.node[data-key={key}]")).to_have_attribute("data-status", "success")
    edges = graph.locator("path.edge")
    expect(edges).to_have_count(4)
    run_id = graph.get_attribute("data-run-id")
    assert run_id
    check_dag_jobs_are_marked_and_linked(stack, page, tag, dag_id, run_id)
    check_failed_dag_run(stack, page)

    # -- dead letters: one dies, the operator replays it, it succeeds -------------------------
    stack.sink.broken = True  # the target answers 503 until the operator has looked
    flaky = create_job(
        api,
        name=f"ui-{tag}-flaky",
        schedule={"at": soon()},
        target=sink_target,
        retry={"max_retries": 0},
    )
    page.click("nav a[data-nav=dlq]")
    row = page.locator("table[data-testid=dlq-table] tr[data-execution-id]").filter(
        has_text=f"ui-{tag}-flaky"
    )
    expect(row).to_have_count(1)
    expect(row.locator("td.error")).to_contain_text("HTTP 503")
    if SCREENSHOTS:
        page.locator("table[data-testid=dlq-table] tr.detail summary").nth(1).click()
    shot(page, "dead-letters")
    stack.sink.broken = False
    row.locator("button[data-action=replay]").click()
    dialog = page.locator("dialog.confirm")
    expect(dialog).to_be_visible()
    dialog.locator("button.primary").click()
    expect(page.locator("[data-testid=replay-summary]")).to_have_text(
        "1 succeeded, 0 dead again, 0 in progress"
    )
    # the replay is a new execution of the job: the dead one stays in its history
    page.goto(f"{stack.url}/ui/#/jobs/{flaky['job_id']}")
    executions = page.locator("table[data-testid=executions-table] tr[data-execution-id]")
    expect(executions).to_have_count(2)
    expect(executions.first).to_have_attribute("data-status", "success")
    expect(executions.first.locator("td").nth(3)).to_have_text("replay")
    expect(executions.last).to_have_attribute("data-status", "dead")

    # -- a bulk replay of every dead letter the filter matches, with its progress -------------
    stack.sink.broken = True
    bulk_name = f"ui-{tag}-bulk"
    for _ in range(3):
        create_job(
            api,
            name=bulk_name,
            schedule={"at": soon()},
            target=sink_target,
            retry={"max_retries": 0},
        )
    page.click("nav a[data-nav=dlq]")
    page.fill("input[name=name]", bulk_name)
    page.press("input[name=name]", "Enter")
    # the three rows of *these* jobs: three rows alone could be the unfiltered page of earlier
    # dead letters, still shown before the filter applies and before these jobs died (then the
    # replay below matched nothing: "0 succeeded, 0 dead again, 0 in progress")
    bulk_rows = page.locator("table[data-testid=dlq-table] tr[data-execution-id]")
    expect(bulk_rows.filter(has_text=bulk_name)).to_have_count(3)
    expect(bulk_rows).to_have_count(3)
    stack.sink.broken = False
    page.click("button[data-action=replay-matching]")
    expect(dialog).to_contain_text("Replay every dead letter not yet replayed?")
    dialog.locator("button.primary").click()
    expect(page.locator("[data-testid=replay-summary]")).to_have_text(
        "3 succeeded, 0 dead again, 0 in progress"
    )
    expect(page.locator("table[data-testid=dlq-table] .badge.st-replayed")).to_have_count(3)

    # -- an execution's output and traceback: over REST and in its own view ------------------
    check_output_and_traceback(stack, page)

    # -- the cluster: scheduler ownership, workers and their queues, resolver, projector ------
    check_cluster_page(stack, page)

    # -- overview: charts drawn from the stats endpoints --------------------------------------
    page.click("nav a[data-nav=overview]")
    expect(page.locator("figure.chart-card")).to_have_count(4)
    expect(page.locator("figure.chart-card svg.chart rect").first).to_be_visible()
    # the lag per queue and priority: the default queue's row, a cell per priority
    lag_row = page.locator("table[data-testid=lag-table] tr[data-queue=default]")
    expect(lag_row.locator("td[data-priority]")).to_have_count(4)
    if busy is not None:
        page.goto(f"{stack.url}/ui/#/jobs/{busy}")
        expect(page.locator("table[data-testid=executions-table]")).to_be_visible()
        page.locator("table[data-testid=executions-table] tr.detail summary").nth(1).click()
        shot(page, "job")
        page.goto(f"{stack.url}/ui/#/jobs")
        expect(page.locator("table[data-testid=jobs-table]")).to_be_visible()
        shot(page, "jobs")
        page.goto(f"{stack.url}/ui/#/")
        expect(page.locator("figure.chart-card svg.chart polyline").first).to_be_visible()
        # the lag chart has a line (two samples at least; the page samples every 5 s)
        lag_line = page.locator('svg.chart[aria-label^="Consumer lag"] polyline').first
        expect(lag_line).to_have_attribute("points", re.compile(r"\S+\s+\S+"), timeout=WAIT_MS)
        shot(page, "overview")


def check_lifecycle_apart_from_outcome(stack: Stack, page: Page, tag: str) -> None:
    """Issue 16: a cron job whose one manual trigger failed is still "active"; its last run
    is "dead". Both on its page and in the jobs list."""
    cron = create_job(
        stack.api,
        name=f"ui-{tag}-cron-trigger-fails",
        schedule={"cron": "0 3 1 1 *", "timezone": "Europe/Berlin"},
        target={"type": "http", "url": stack.sink.url},
        payload={"answer_status": 500},
        retry={"max_retries": 0},
    )
    page.goto(f"{stack.url}/ui/#/jobs/{cron['job_id']}")
    expect(page.locator("[data-testid=last-outcome]")).to_contain_text("none yet")
    page.click("button[data-action=trigger]")
    expect(page.locator("[data-testid=last-outcome] .badge")).to_have_text("dead")
    expect(page.locator(".title-row [data-lifecycle]")).to_have_text("active")
    job = stack.api.get(f"/v1/jobs/{cron['job_id']}").json()
    assert (job["lifecycle"], job["last_outcome"]) == ("active", "dead"), job
    page.goto(f"{stack.url}/ui/#/jobs?q=ui-{tag}-cron-trigger-fails")
    row = page.locator(f"tr[data-job-id='{cron['job_id']}']")
    expect(row.locator("[data-lifecycle]")).to_have_text("active")
    expect(row.locator("td.last-run .badge")).to_have_text("dead")


def check_dag_jobs_are_marked_and_linked(
    stack: Stack, page: Page, tag: str, dag_id: str, run_id: str
) -> None:
    """Issue 16: DAG members and the DAG's trigger job are marked in the jobs list and on
    their page, linked to their DAG (a member also to the run of its latest execution)."""
    from duetime.producers.sdk import dag_member_job_id, dag_trigger_job_id

    page.goto(f"{stack.url}/ui/#/jobs?q=ui-{tag}-")
    member_row = page.locator(f"tr[data-job-id='{dag_member_job_id(dag_id, 'clean')}']")
    member_tag = member_row.locator("a.dag-tag")
    expect(member_tag).to_have_attribute("data-dag-role", "member")
    expect(member_tag).to_have_text("DAG: clean")
    expect(member_tag).to_have_attribute("href", f"#/dags/{dag_id}?run={run_id}")
    trigger_row = page.locator(f"tr[data-job-id='{dag_trigger_job_id(dag_id)}']")
    expect(trigger_row.locator("a.dag-tag")).to_have_attribute("data-dag-role", "trigger")
    expect(trigger_row.locator("a.dag-tag")).to_have_attribute("href", f"#/dags/{dag_id}")
    # a member's page links to the run its latest execution belonged to
    member_tag.click()
    expect(page.locator("[data-testid=dag-graph]")).to_have_attribute("data-run-id", run_id)
    page.goto(f"{stack.url}/ui/#/jobs/{dag_member_job_id(dag_id, 'load')}")
    expect(page.locator("a.execution-run-link")).to_have_attribute(
        "href", f"#/dags/{dag_id}?run={run_id}"
    )
    page.locator("a.dag-run-link").click()
    expect(page.locator("[data-testid=dag-graph]")).to_have_attribute("data-run-id", run_id)


def colour(page: Page, selector: str) -> str:
    return str(page.locator(selector).first.evaluate("el => getComputedStyle(el).backgroundColor"))


def check_failed_dag_run(stack: Stack, page: Page) -> None:
    """A run where one node dies and its descendants are skipped: the run is drawn in the
    legend's colour of a final failure ("dead"), not that of "failed (will retry)"; every
    node's fill is its status's colour in the legend."""
    ok = {"type": "python", "ref": f"{TASKS}:ok"}
    fail = {"type": "python", "ref": f"{TASKS}:fail"}
    nodes = [
        ("extract", ok, []),
        ("clean", ok, ["extract"]),
        ("enrich", fail, ["extract"]),
        ("aggregate", ok, ["clean", "enrich"]),
        ("audit", ok, ["clean"]),
        ("publish", ok, ["aggregate", "audit"]),
    ]
    answer = stack.api.post(
        "/v1/dags",
        json={
            "name": "nightly-etl",
            "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
            "jobs": [
                {"key": k, "name": f"etl-{k}", "target": t, "depends_on": d} for k, t, d in nodes
            ],
        },
    )
    assert answer.status_code == 201, answer.text
    dag_id = answer.json()["dag_id"]
    page.goto(f"{stack.url}/ui/#/dags/{dag_id}")
    page.click("button[data-action=trigger-dag]")
    graph = page.locator("[data-testid=dag-graph]")
    expect(graph.locator("g.node[data-key=publish]")).to_have_attribute("data-status", "skipped")
    expect(graph.locator("g.node[data-key=audit]")).to_have_attribute("data-status", "success")
    expect(graph.locator("g.node[data-key=enrich]")).to_have_attribute("data-status", "dead")
    run_badge = ".graph-card h2 [data-run-status]"
    expect(page.locator(run_badge)).to_have_text("failed")
    final = colour(page, "[data-legend=dead] .swatch")
    assert colour(page, run_badge) == final
    assert colour(page, "table[data-testid=dag-runs] [data-run-status=failed]") == final
    assert final != colour(page, "[data-legend=failed] .swatch")
    # every status in the legend has a colour of its own
    swatches = page.locator("[data-testid=dag-legend] .swatch").evaluate_all(
        "els => els.map((el) => getComputedStyle(el).backgroundColor)"
    )
    assert len(swatches) == 10 and len(set(swatches)) == len(swatches), swatches
    for status in ("success", "dead", "skipped"):
        fill = graph.locator(f"g.node[data-status={status}] rect").first.evaluate(
            "el => getComputedStyle(el).fill"
        )
        assert fill == colour(page, f"[data-legend={status}] .swatch"), status
    shot(page, "dag-run")


def check_cluster_page(stack: Stack, page: Page) -> None:
    """Issue 16: which scheduler owns which partitions, which workers are alive with their
    queues, the resolver and the projector (every role of the stack runs as a process)."""
    page.click("nav a[data-nav=cluster]")
    schedulers = page.locator("table[data-testid=schedulers-table] tbody tr")
    expect(schedulers).to_have_count(1)
    expect(page.locator("[data-testid=unowned]")).to_contain_text("has its scheduler")
    cells = page.locator("[data-testid=partition-grid] .partition")
    count = cells.count()
    assert count >= 1
    owner = schedulers.first.get_attribute("data-client-id")
    for p in range(count):
        expect(cells.nth(p)).to_have_attribute("data-owner", str(owner))
    worker = page.locator("table[data-testid=workers-table] tbody tr")
    expect(worker).to_have_count(1)
    queues = worker.locator("li[data-queue=default]")
    expect(queues).to_have_count(4)
    for name in ("resolver", "projector"):
        expect(page.locator(f"[data-testid=cluster-{name}] tbody tr")).to_have_count(1)
    expect(page.locator("[data-testid=cluster-at]")).to_contain_text("as of")
    shot(page, "cluster")


def seed_busy_workload(stack: Stack) -> str:
    """For the screenshots only: a few minutes of varied work behind the charts; the id of
    a job whose executions fail once, then succeed."""
    api, url = stack.api, stack.sink.url
    every = {"cron": "*/2 * * * * *"}
    for i, priority in enumerate(("critical", "high", "normal", "low")):
        create_job(
            api,
            name=f"sync-{priority}",
            schedule=every,
            target={"type": "http", "url": url},
            priority=priority,
            overlap="allow",
            payload={"sleep_s": 0.05 * i},
        )
    invoices = create_job(
        api,
        name="invoice-export",
        schedule={"cron": "*/5 * * * * *"},
        target={"type": "http", "url": url},
        payload={"fail_times": 1},
        retry={"max_retries": 1, "base_delay_s": 1},
        overlap="allow",
    )
    for i in range(6):
        create_job(
            api,
            name=f"webhook-{i}",
            schedule={"at": soon(i)},
            target={"type": "http", "url": url},
            payload={"fail_times": 5},
            retry={"max_retries": 1, "base_delay_s": 1},
        )
    for i in range(20):
        create_job(
            api,
            name=f"nightly-report-{i:02d}",
            schedule={"cron": f"{i} 2 * * *", "timezone": "Europe/Berlin"},
            target={"type": "python", "ref": f"{TASKS}:ok"},
            priority=("high", "normal", "low")[i % 3],
        )

    def buckets_with_work() -> int:
        stats = api.get("/v1/stats/executions", params={"window_s": 900, "bucket_s": 15})
        return sum(1 for b in stats.json()["buckets"] if sum(b["outcomes"].values()))

    # the charts have a few 15 s buckets of finished executions behind them
    wait_for(lambda: buckets_with_work() >= 5, 180, "five 15 s buckets of executions", 1)
    return str(invoices["job_id"])


def check_output_and_traceback(stack: Stack, page: Page) -> None:
    """Issue 14.5: a Python task that raises and one that returns, both visible through
    ``GET /v1/executions/{id}`` and on the dashboard's execution view, as text, redacted."""
    api = stack.api
    jobs = {
        kind: create_job(
            api,
            name=f"ui-{kind}",
            schedule={"at": soon()},
            target={"type": "python", "ref": f"{OUTPUT_TASKS}:{kind}"},
            retry={"max_retries": 0},
        )["job_id"]
        for kind in ("raises", "returns")
    }

    def finished(job_id: str, status: str) -> dict[str, Any]:
        items = api.get(f"/v1/jobs/{job_id}/executions").json()["items"]
        return dict(items[0]) if items and items[0]["status"] == status else {}

    dead = wait_for(lambda: finished(jobs["raises"], "dead"), 60, "the raising task to die")
    done = wait_for(lambda: finished(jobs["returns"], "success"), 60, "the task to return")
    failed = api.get(f"/v1/executions/{dead['execution_id']}").json()
    trace = failed["traceback"]
    assert "in raises" in trace and "in _innermost" in trace, trace
    assert trace.endswith(
        "ValueError: <img src=x onerror=alert(3)> cannot reach https://***@api.example.com/report"
    ), trace
    assert output_tasks.SECRET not in str(failed)
    returned = api.get(f"/v1/executions/{done['execution_id']}").json()
    assert returned["output"] == {"html": "<b>bold</b>", "attempt": 1}
    assert returned["traceback"] is None

    page.goto(f"{stack.url}/ui/#/jobs/{jobs['raises']}")
    page.locator("a.execution-link").first.click()
    shown = page.locator("[data-testid=execution-traceback] pre.traceback")
    expect(shown).to_contain_text("in _innermost")
    expect(shown).to_contain_text("<img src=x onerror=alert(3)>")
    expect(shown).not_to_contain_text(output_tasks.SECRET)
    page.goto(f"{stack.url}/ui/#/executions/{done['execution_id']}")
    expect(page.locator("[data-testid=execution-output] pre.json")).to_contain_text("<b>bold</b>")
    expect(page.locator("[data-testid=execution-traceback]")).to_contain_text("none")
    assert page.locator("main img, main b").count() == 0

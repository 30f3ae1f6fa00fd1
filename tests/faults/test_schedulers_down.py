"""Every scheduler down while crons and one-time jobs fall due, then restarted (issue 8).

Crons every 5 s with each misfire policy × each overlap policy, and one-time jobs (created
during the outage, due 5 s into it) with each misfire policy; workers keep running (runs
take 1.5 s). Both schedulers are SIGKILLed right after an occurrence K fired, stay down
(CI: 30 s, full: 5 minutes), and start again. Then, per job, the occurrences in (K, handling
time] — the missed ones — ran exactly as the job's policies declare
(schedule.misfire_fires, overlap_decision):

| misfire | overlap | missed occurrences that run |
|---|---|---|
| skip | any | none |
| run_once | any | one: the latest missed (trigger misfire) |
| run_all | allow | all of them (trigger misfire) |
| run_all | skip | the first (the rest find it live) |
| run_all | queue_one | the first, and the second once the first ended |

A one-time job missed under skip never runs (status skipped); under run_once and run_all it
runs once. No two runs of a job with overlap skip or queue_one are ever at the sink at the same
time. Every occurrence before the outage and from two periods after the catch-up on ran.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from duetime.core.clock import SYSTEM_CLOCK
from duetime.core.models import Misfire, Overlap
from duetime.core.records import OneTimeSchedule
from duetime.infra.harness import RoleProc
from duetime.producers.sdk import JobCreated
from tests.faults.harness import Scenario, size, utc_ms, wait_for, write_figures

SIZES = {"ci": {"down_s": 30}, "full": {"down_s": 300}}
PERIOD_S = 5
PERIOD_MS = PERIOD_S * 1000
RUN_S = 1.5
THRESHOLD_S = 5  # DUETIME_MISFIRE_THRESHOLD_S (the default)
MISFIRES = ("skip", "run_once", "run_all")
OVERLAPS = ("allow", "skip", "queue_one")
CRONS_PER_COMBINATION = 2
ONE_TIME_PER_POLICY = 5
AFTER_S = 30  # how long crons keep running after the schedulers are back


def test_all_schedulers_down_then_each_misfire_and_overlap_policy_does_what_it_declares(
    new_scenario: Callable[..., Scenario],
) -> None:
    down_s = SIZES[size()]["down_s"]
    scenario = new_scenario("schedulers-down", effects=True, terminal=True)
    schedulers = _start_roles(scenario)
    created_at = datetime.now(UTC)
    crons = _create_crons(scenario, created_at, down_s)
    k_ms = _occurrence_k(scenario, crons, created_at)
    with scenario.fault("all-schedulers-sigkill") as fault:
        for s in schedulers:
            s.kill()
        killed_ms = SYSTEM_CLOCK.now_ms()
        assert killed_ms < k_ms + PERIOD_MS, "the schedulers died after the next occurrence"
        one_time = _create_one_time_jobs(scenario)
        # the outage itself (the fault's duration, the subject of this test): nothing to wait on
        time.sleep(max(0.0, down_s - (SYSTEM_CLOCK.now_ms() - killed_ms) / 1000))
        for s in schedulers:
            s.spawn()
        restarted_ms = SYSTEM_CLOCK.now_ms()
        fault.update(down_s=down_s, k_ms=k_ms)
    scenario.schedulers_own_all(2)
    cancelled_ms = _run_on_then_cancel(scenario, crons, restarted_ms)
    events = scenario.history.events()

    violations, expectations, handled_ms = judge(
        events, crons, one_time, k_ms, restarted_ms, cancelled_ms
    )
    for job_id, expect in expectations.items():
        job = crons.get(job_id) or one_time[job_id]
        scenario.record_job(job, expect, exact=job_id in one_time)
    report = scenario.finish()
    violations += _one_time_violations(scenario, one_time)
    config: dict[str, Any] = {
        "down_s": down_s,
        "cron_period_s": PERIOD_S,
        "run_s": RUN_S,
        "crons": len(crons),
        "one_time_jobs": len(one_time),
        "schedulers": 2,
        "workers": 2,
        "misfire_threshold_s": THRESHOLD_S,
        "catch_up_after_restart_s": round((handled_ms - restarted_ms) / 1000, 2),
        "policy_violations": len(violations),
    }
    write_figures("schedulers-down", report, size(), config)
    print("figures:", report.figures(), "config:", config)
    assert not violations, "\n".join(violations[:20])
    assert report.ok, report.summary()


def _start_roles(scenario: Scenario) -> list[RoleProc]:
    """Two schedulers (returned: the ones to kill), a projector and two workers, all up."""
    schedulers = [scenario.start_role("scheduler") for _ in range(2)]
    scenario.start_role("projector")
    for i in range(2):
        scenario.start_role("worker", f"worker-{i + 1}", DUETIME_LEASE_TTL_S="5")
    scenario.schedulers_own_all(2)
    scenario.workers_assigned()
    return schedulers


def _create_crons(scenario: Scenario, created_at: datetime, down_s: float) -> dict[str, JobCreated]:
    """CRONS_PER_COMBINATION crons every PERIOD_S per misfire × overlap policy."""
    end = created_at + timedelta(seconds=25 + down_s + AFTER_S + 30)
    crons: dict[str, JobCreated] = {}
    with scenario.job_client() as client:
        for misfire, overlap in itertools.product(MISFIRES, OVERLAPS):
            for i in range(CRONS_PER_COMBINATION):
                job = client.create_job(
                    name=f"cron-{misfire}-{overlap}-{i}",
                    schedule={
                        "cron": f"*/{PERIOD_S} * * * * *",
                        "start_at": created_at.isoformat(),
                        "end_at": end.isoformat(),
                    },
                    target={"type": "http", "url": scenario.sink.url},
                    payload={"sleep_s": RUN_S},
                    misfire=misfire,
                    overlap=overlap,
                    wait=False,
                )
                crons[job.job_id] = job
        client.flush()
    return crons


def _occurrence_k(scenario: Scenario, crons: dict[str, JobCreated], created_at: datetime) -> int:
    """K: an occurrence every cron has been requested for, with time left before the next."""

    def fired_everywhere(k_ms: int) -> bool:
        seen = {
            e["job_id"]
            for e in scenario.history.events()
            if e["kind"] == "request" and e["scheduled_at_ms"] == k_ms
        }
        return set(crons) <= seen

    k_ms = (utc_ms(created_at) // PERIOD_MS + 2) * PERIOD_MS
    while True:
        wait_for(lambda k=k_ms: fired_everywhere(k), 60, f"every cron's occurrence {k_ms}")  # type: ignore[misc]
        if SYSTEM_CLOCK.now_ms() < k_ms + PERIOD_MS - 1500:
            return k_ms
        k_ms += PERIOD_MS  # too close to the next one: take the next


def _create_one_time_jobs(scenario: Scenario) -> dict[str, JobCreated]:
    """One-time jobs created while no scheduler runs, due well before any is back."""
    outage_at = datetime.now(UTC) + timedelta(seconds=5)
    one_time: dict[str, JobCreated] = {}
    with scenario.job_client() as client:
        for misfire in MISFIRES:
            for i in range(ONE_TIME_PER_POLICY):
                job = client.create_job(
                    name=f"once-{misfire}-{i}",
                    schedule={"at": outage_at.isoformat()},
                    target={"type": "http", "url": scenario.sink.url},
                    misfire=misfire,
                    wait=False,
                )
                one_time[job.job_id] = job
    return one_time


def _run_on_then_cancel(scenario: Scenario, crons: dict[str, JobCreated], restarted_ms: int) -> int:
    """The catch-up, then AFTER_S of regular runs (every cron has been requested for an
    occurrence AFTER_S past the restart); then the crons are cancelled and every execution
    ends (a run the cancel reached ends cancelled). Returns when the cancel was sent."""

    def fired_since(from_ms: int) -> bool:
        latest: dict[str, int] = {}
        for e in scenario.history.events():
            if e["kind"] == "request" and e["job_id"] in crons:
                latest[e["job_id"]] = max(latest.get(e["job_id"], 0), e["scheduled_at_ms"])
        return all(latest.get(j, 0) > from_ms for j in crons)

    wait_for(lambda: fired_since(restarted_ms), 120, "every cron to fire after the restart", 1)
    wait_for(
        lambda: fired_since(restarted_ms + AFTER_S * 1000),
        AFTER_S + 120,
        f"every cron to fire {AFTER_S} s after the restart",
        1,
    )
    cancelled_ms = SYSTEM_CLOCK.now_ms()
    with scenario.job_client() as client:  # stop the crons so every execution can end
        for job_id in crons:
            client.cancel(job_id)
        client.flush()
    try:
        wait_for(lambda: _all_results_final(scenario), 120, "every execution to end", interval_s=1)
    except AssertionError as exc:  # say which, and their last results
        odd, no_result = _not_final(scenario)
        raise AssertionError(
            f"{exc}; last results not final: {dict(Counter(odd.values()))}, e.g. "
            f"{sorted(odd)[:3]}; no result at all: {len(no_result)}, e.g. {no_result[:3]}"
        ) from None
    return cancelled_ms


def _one_time_violations(scenario: Scenario, one_time: dict[str, JobCreated]) -> list[str]:
    """A one-time job missed under skip is skipped; under run_once and run_all it ran."""
    statuses = _one_time_statuses(scenario, one_time)
    out: list[str] = []
    for job_id, job in one_time.items():
        want = "skipped" if job.definition.misfire == Misfire.SKIP else "success"
        if statuses.get(job_id) != want:
            out.append(f"one-time {job.definition.name}: {statuses.get(job_id)} != {want}")
    return out


def _all_results_final(scenario: Scenario) -> bool:
    odd, no_result = _not_final(scenario)
    return not odd and not no_result


def _not_final(scenario: Scenario) -> tuple[dict[str, tuple[str, str | None]], list[str]]:
    """The executions whose last result is not final (with it: status and reason), and those
    with no result at all. Final: success, dead, or a failure the scenario's cancel caused."""
    final = scenario.recorder.final_statuses()
    odd = {e: r for e, r in final.items() if r[0] not in ("success", "dead") and not _by_cancel(r)}
    return odd, sorted(set(scenario.recorder.executions) - set(final))


def _by_cancel(result: tuple[str, str | None]) -> bool:
    return result == ("failure", "cancelled")


def _one_time_statuses(scenario: Scenario, jobs: dict[str, Any]) -> dict[str, str]:
    with psycopg.connect(scenario.settings.database_url) as conn:
        rows = conn.execute(
            "SELECT job_id::text, status FROM jobs WHERE job_id = ANY(%s::uuid[])", (list(jobs),)
        ).fetchall()
    return {j: s for j, s in rows}


def judge(
    events: list[dict[str, Any]],
    crons: dict[str, JobCreated],
    one_time: dict[str, JobCreated],
    k_ms: int,
    restarted_ms: int,
    cancelled_ms: int,
) -> tuple[list[str], dict[str, list[int]], int]:
    """Policy violations, each job's expected occurrences, and the latest catch-up time.

    The scenario ends by cancelling the crons (at ``cancelled_ms``): a run the cancel reached
    ends cancelled, without an effect, and is not expected; a cancelled run of an occurrence
    due more than two periods before it is a violation (nothing else cancels).

    Catch-up runs: requests with trigger misfire, and runs of occurrences due before the
    restart (queue_one's held one fires with trigger schedule once the first ended).
    Certainly missed: occurrences after K and before the restart minus the misfire
    threshold (a later one may still fire on time).
    """
    period_ms = PERIOD_MS
    requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["kind"] == "request" and e["attempt"] == 1:
            requests[e["job_id"]].append(e)
    violations: list[str] = []
    stopped: set[tuple[str, int]] = set()  # occurrences the scenario's cancel stopped
    for e in events:
        if e["kind"] == "result" and e.get("reason") == "cancelled":
            if e["scheduled_at_ms"] < cancelled_ms - 2 * PERIOD_MS:
                name = crons[e["job_id"]].definition.name if e["job_id"] in crons else e["job_id"]
                violations.append(f"{name}: {_rel([e['scheduled_at_ms']], k_ms)} cancelled early")
            stopped.add((e["job_id"], e["scheduled_at_ms"]))
    expectations: dict[str, list[int]] = {}
    missed = list(range(k_ms + period_ms, restarted_ms - THRESHOLD_S * 1000, period_ms))
    handled_all: list[int] = []
    for job_id, job in crons.items():
        d = job.definition
        name, misfire, overlap = d.name, d.misfire, d.overlap
        mine = sorted(requests[job_id], key=lambda r: r["scheduled_at_ms"])
        catch_up = [
            r
            for r in mine
            if r["scheduled_at_ms"] > k_ms
            and (r["trigger"] == "misfire" or r["scheduled_at_ms"] < restarted_ms)
        ]
        got = [r["scheduled_at_ms"] for r in catch_up]
        want: list[int]
        if misfire == Misfire.SKIP:
            ok, want = not got, []
        elif misfire == Misfire.RUN_ONCE:
            ok = len(got) == 1 and got[0] >= missed[-1]
            want = got if ok else missed[-1:]
        elif overlap == Overlap.ALLOW:
            want = list(range(k_ms + period_ms, max(got, default=0) + 1, period_ms))
            ok = got == want and set(missed) <= set(got)
        elif overlap == Overlap.SKIP:
            ok, want = got == missed[:1], missed[:1]
        else:
            ok, want = got == missed[:2], missed[:2]
        if not ok:
            violations.append(
                f"{name}: missed {_rel(missed, k_ms)} ran {_rel(got, k_ms)}, wanted "
                f"{_rel(want, k_ms)} (triggers {[r['trigger'] for r in catch_up]})"
            )
        handled = max(
            (r["emitted_at_ms"] for r in catch_up),
            default=min((r["emitted_at_ms"] for r in mine if r["scheduled_at_ms"] > k_ms),
                        default=restarted_ms),
        )  # fmt: skip
        handled_all.append(handled)
        before = [r["scheduled_at_ms"] for r in mine if r["scheduled_at_ms"] <= k_ms]
        regular_from = handled + 2 * period_ms
        regular_from += (-regular_from) % period_ms
        last = max((r["scheduled_at_ms"] for r in mine), default=regular_from)
        expectations[job_id] = sorted(
            t
            for t in set(before) | set(want) | set(range(regular_from, last + 1, period_ms))
            if (job_id, t) not in stopped
        )
    for job_id, job in one_time.items():
        schedule = job.definition.schedule
        assert isinstance(schedule, OneTimeSchedule), job.definition
        skip = job.definition.misfire == Misfire.SKIP
        expectations[job_id] = [] if skip else [schedule.at_ms]
    violations += overlap_violations(events, crons)
    return violations, expectations, max(handled_all, default=restarted_ms)


def overlap_violations(events: list[dict[str, Any]], crons: dict[str, JobCreated]) -> list[str]:
    """Runs of one job (distinct executions) at the sink at the same time, where the job's
    overlap policy forbids it."""
    spans: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for e in events:
        if e["kind"] == "delivery" and e["job_id"] in crons:
            spans[e["job_id"]].append((e["at_ms"], e["answered_ms"], e["key"]))
    out: list[str] = []
    for job_id, runs in spans.items():
        d = crons[job_id].definition
        if d.overlap == Overlap.ALLOW:
            continue
        busy_until, busy_key = 0, ""
        for start, end, key in sorted(runs):
            if key != busy_key and start < busy_until:
                out.append(f"{d.name} ({d.overlap.value}): two runs overlap at the sink")
            if end > busy_until:
                busy_until, busy_key = end, key
    return out


def _rel(times: list[int], k_ms: int) -> list[float]:
    return [round((t - k_ms) / 1000, 1) for t in times]

"""The offline checker on hand-made histories: each anomaly is found, and a clean history
passes. Pure and fast: no broker, no database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.faults.checker import check
from tests.faults.history import History, load

T0 = 1_700_000_000_000


def config(effects: bool = True, terminal: bool = True) -> dict[str, Any]:
    return {"kind": "config", "t_ms": T0, "scenario": "hand", "effects": effects,
            "terminal": terminal}  # fmt: skip


def job(job_id: str, expect: list[int] | None, exact: bool = False) -> dict[str, Any]:
    return {"kind": "job", "t_ms": T0, "job_id": job_id, "name": job_id, "expect_ms": expect,
            "exact": exact, "misfire": "run_once", "overlap": "allow"}  # fmt: skip


def request(
    job_id: str,
    due: int,
    execution_id: str | None = None,
    attempt: int = 1,
    offset: int = 0,
    seen: int | None = None,
    partition: int = 0,
) -> dict[str, Any]:
    return {"kind": "request", "t_ms": seen or due + 10, "topic": "x.exec.normal",
            "partition": partition, "offset": offset,
            "execution_id": execution_id or f"e-{job_id}-{due}", "job_id": job_id,
            "attempt": attempt, "scheduled_at_ms": due, "due_at_ms": due,
            "emitted_at_ms": due + 5, "trigger": "schedule"}  # fmt: skip


def delivery(key: str, at: int, status: int = 200, job_id: str = "") -> dict[str, Any]:
    return {"kind": "delivery", "t_ms": at, "key": key, "job_id": job_id, "attempt": 1,
            "scheduled_at_ms": None, "status": status, "at_ms": at}  # fmt: skip


def status(execution_id: str, value: str = "success") -> dict[str, Any]:
    return {"kind": "status", "t_ms": T0, "execution_id": execution_id, "job_id": "",
            "scheduled_at_ms": 0, "status": value, "attempt": 1}  # fmt: skip


def clean() -> list[dict[str, Any]]:
    """Two one-time jobs, each requested once, effected once, finished."""
    return [
        config(),
        job("a", [T0]),
        job("b", [T0 + 1000]),
        request("a", T0, offset=0),
        request("b", T0 + 1000, offset=1),
        delivery(f"e-a-{T0}", T0 + 40),
        delivery(f"e-b-{T0 + 1000}", T0 + 1030),
        status(f"e-a-{T0}"),
        status(f"e-b-{T0 + 1000}"),
        audit(),
    ]


def audit() -> dict[str, Any]:
    return {"kind": "audit", "t_ms": T0, "aborted": [], "lso": [],
            "uncommitted": [["x.exec.normal", 0, [0, 1]]]}  # fmt: skip


def test_a_clean_history_passes_with_its_figures() -> None:
    report = check(clean())
    assert report.ok, report.summary()
    figures = report.figures()
    assert figures["jobs"] == 2 and figures["effects"] == 2 and figures["lost"] == 0
    assert figures["duplicate_effects"] == 0 and figures["duplicate_requests"] == 0
    assert report.start_lateness_ms == {"p50": 40.0, "p99": 40.0, "max": 40.0}
    assert report.emit_lateness_ms["max"] == 5.0


def test_a_job_without_an_effect_is_lost() -> None:
    events = [e for e in clean() if not (e["kind"] == "delivery" and e["key"].startswith("e-b"))]
    report = check(events)
    assert report.lost == [("b", T0 + 1000)]
    assert not report.ok


def test_a_failed_delivery_is_not_an_effect() -> None:
    events = clean()
    for e in events:
        if e["kind"] == "delivery" and e["key"].startswith("e-b"):
            e["status"] = 500
    assert check(events).lost == [("b", T0 + 1000)]


def test_without_effects_a_job_counts_once_requested() -> None:
    events = [config(effects=False, terminal=False), job("a", [T0]), job("b", [T0 + 1000]),
              request("a", T0)]  # fmt: skip
    report = check(events)
    assert report.lost == [("b", T0 + 1000)]
    assert report.stuck == []  # not judged: nothing executes in this scenario


def test_the_same_key_delivered_twice_is_a_redelivery_not_a_duplicate_effect() -> None:
    events = [*clean(), delivery(f"e-a-{T0}", T0 + 5000)]
    report = check(events)
    assert report.ok and report.redelivered == 1 and report.figures()["duplicate_effects"] == 0


def test_one_occurrence_effected_under_two_keys_is_a_duplicate_effect() -> None:
    events = [*clean(), request("a", T0, execution_id="other", offset=2),
              delivery("other", T0 + 60)]  # fmt: skip
    report = check(events)
    assert [d["keys"] for d in report.duplicate_effects] == [sorted([f"e-a-{T0}", "other"])]
    # and the two execution ids for one occurrence are a duplicate request too
    assert any("execution_ids" in d for d in report.duplicate_requests)
    assert not report.ok


def test_a_success_without_an_idempotency_key_is_a_duplicate_effect() -> None:
    events = [*clean(), delivery("", T0 + 70, job_id="a")]
    assert check(events).duplicate_effects == [{"missing_key": True, "job_id": "a"}]


def test_the_same_attempt_requested_twice_is_a_duplicate_request() -> None:
    events = [*clean(), request("a", T0, offset=7)]
    report = check(events)
    assert report.duplicate_requests == [
        {"job_id": "a", "scheduled_at_ms": T0, "attempt": 1, "copies": 2}
    ]


def test_a_retry_is_a_new_attempt_of_the_same_execution_not_a_duplicate() -> None:
    events = [*clean(), request("a", T0, attempt=2, offset=8)]
    assert check(events).duplicate_requests == []


def test_a_record_of_an_aborted_transaction_read_committed_is_an_aborted_read() -> None:
    events = clean()
    events[-1]["aborted"] = [["x.exec.normal", 0, 1]]
    report = check(events)
    assert report.aborted_reads == [("x.exec.normal", 0, 1)] and report.aborted_records == 1


def test_a_record_that_vanished_from_the_log_is_a_lost_read() -> None:
    events = clean()
    events[-1]["uncommitted"] = [["x.exec.normal", 0, [0]]]
    assert check(events).lost_reads == [("x.exec.normal", 0, 1)]


def test_a_partition_whose_last_stable_offset_lags_is_a_hanging_transaction() -> None:
    events = clean()
    row = {"topic": "x.exec.normal", "partition": 0, "lso": 3, "high": 9, "settled": False}
    events[-1]["lso"] = [row, {**row, "partition": 1, "lso": 9, "settled": True}]
    assert check(events).hanging_partitions == [row]


def test_an_execution_left_running_is_stuck() -> None:
    events = [e for e in clean() if not (e["kind"] == "status" and "e-b" in e["execution_id"])]
    events.append(status(f"e-b-{T0 + 1000}", "running"))
    report = check(events)
    assert report.stuck == [{"execution_id": f"e-b-{T0 + 1000}", "status": "running"}]


def test_an_exact_job_that_ran_an_undeclared_occurrence_is_unexpected() -> None:
    events = [config(effects=False, terminal=False), job("c", [T0, T0 + 2000], exact=True),
              request("c", T0), request("c", T0 + 1000, offset=1),
              request("c", T0 + 2000, offset=2)]  # fmt: skip
    report = check(events)
    assert report.unexpected == [("c", T0 + 1000)] and report.lost == []


def test_recovery_is_measured_from_the_fault_end_to_the_in_flight_work_done() -> None:
    # "a" was at the sink (in flight) when the fault started at T0+20; it finished at T0+3000
    events = [
        config(),
        job("a", [T0]),
        request("a", T0),
        {**delivery(f"e-a-{T0}", T0 + 10), "status": -1},
        delivery(f"e-a-{T0}", T0 + 3000),
        {"kind": "fault", "t_ms": T0, "name": "kill", "start_ms": T0 + 20, "end_ms": T0 + 1000},
    ]
    assert check(events).recovery_s == {"kill": 2.0}


def test_the_history_file_round_trips_and_skips_a_torn_line(tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl")
    for e in clean():
        history.add(**e)
    history.close()
    with (tmp_path / "h.jsonl").open("a") as f:
        f.write('{"kind": "request", "job_')  # a writer killed mid-line
    events = load(tmp_path / "h.jsonl")
    assert len(events) == len(clean())
    assert check(events).ok

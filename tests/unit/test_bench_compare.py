"""bench/compare.py: a scenario that fails is recorded as failed, and the table says so."""

from __future__ import annotations

from typing import Any

import pytest

from bench import compare


def test_a_failed_scenario_is_written_as_failed_with_a_redacted_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written: dict[str, dict[str, Any]] = {}
    monkeypatch.setattr(compare, "write_result", lambda name, got: written.update({name: got}))

    def slow() -> None:
        raise TimeoutError("the load generator did not finish in 180 s (http://u:secret@db/x)")

    compare._attempt("http-rate-1000", slow)
    compare._attempt("worker-rate-350", lambda: None)  # a scenario that finishes writes itself
    assert list(written) == ["http-rate-1000"]
    failed = written["http-rate-1000"]["failed"]
    assert failed.startswith("TimeoutError: the load generator did not finish in 180 s")
    assert "secret" not in failed


def test_the_table_shows_a_failed_side_and_no_ratios_for_it() -> None:
    table = {
        "http 1000/s": {
            "duetime": {"result": "http-rate-1000", "failed": "TimeoutError: too slow"},
            "peers": {
                "celery": {
                    "throughput_jobs_per_s": 825.0,
                    "lateness_p99_ms": 5445.0,
                    "throughput_ratio": None,
                    "lateness_ratio": None,
                    "cpu_ms_per_job": 1.5,
                }
            },
        }
    }
    line = compare.readme_table(table).splitlines()[-1]
    assert "did not finish (TimeoutError: too slow)" in line
    assert "825 jobs/s, p99 5445 ms, 1.5 ms CPU/job" in line
    assert line.endswith("| – | – |")

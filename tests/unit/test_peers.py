"""The peers' bookkeeping: workload plan, percentiles, lost and duplicate counting.

No network: these check the arithmetic that turns recorded job starts into the figures
that bench/results/peers-*.json reports.
"""

from __future__ import annotations

import pytest

from bench.peers.common import Workload, percentile, summarize
from bench.peers.run import default_output


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0


def test_workload_due_times_and_defaults() -> None:
    burst = Workload("burst", jobs=4000)
    assert burst.total == 4000
    assert burst.due_s(100.0, 3999) == 100.0
    assert burst.effective_lead_s == 14.0
    sustained = Workload("sustained", rate_per_s=200, duration_s=3, lead_s=2)
    assert sustained.total == 600
    assert sustained.due_s(100.0, 200) == pytest.approx(101.0)
    assert sustained.effective_lead_s == 2
    with pytest.raises(ValueError):
        Workload("daily")


def test_summarize_counts_lost_and_duplicates() -> None:
    w = Workload("burst", jobs=5)
    starts = [(0, 10.1), (1, 10.2), (2, 10.3), (2, 10.9), (3, 10.5)]  # 4 lost, 2 twice
    r = summarize("x", w, 10.0, starts, {}, {})
    assert r["lost"] == 1
    assert r["duplicates"] == 1
    assert r["lateness_ms"]["max"] == pytest.approx(500.0)
    assert r["duration_s"] == pytest.approx(0.5)
    assert r["throughput_jobs_per_s"] == pytest.approx(8.0)
    assert {"scenario", "jobs", "machine", "versions", "config"} <= r.keys()


def test_sustained_holds_rate() -> None:
    w = Workload("sustained", rate_per_s=10, duration_s=1)
    on_time = [(i, 100.0 + i / 10 + 0.05) for i in range(10)]
    assert summarize("x", w, 100.0, on_time, {}, {})["holds_rate"] is True
    late = [(i, 100.0 + i / 10 + 2.0) for i in range(10)]
    assert summarize("x", w, 100.0, late, {}, {})["holds_rate"] is False


def test_default_output_names() -> None:
    assert default_output("burst", 350).name == "peers-burst.json"
    assert default_output("sustained", 350).name == "peers-sustained.json"
    assert default_output("sustained", 1000).name == "peers-sustained-1000.json"

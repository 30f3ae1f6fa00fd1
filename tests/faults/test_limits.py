"""Limits per key under a worker crash (issue 18, items 1 and 2: the issue's proof).

Jobs on 20 concurrency keys (``key-{payload.k}``; half of the keys with limit 1, half with
limit 3), all due within a few seconds, run by three workers; one worker is SIGKILLed once a
third of the jobs ran, and restarted. The sink records when each call started and ended:

- per key, the calls in progress at one moment never number more than the key's limit (a
  killed worker's calls end at the sink long before its leases expire: the TTL is 3 s, a call
  0.1 s);
- every job has exactly one effect: 0 lost, 0 duplicate effects (the campaign's checker);
- rate: jobs on two rate keys (5 a second, burst 2) start at most R + burst times in any
  second, counted where the calls arrive (plus one for the arrival jitter: the figure kept in
  the results is the observed maximum).

Full size (``./run faults``): 5,000 jobs on 20 keys plus 2 x 100 rated jobs; CI size: 600
plus 2 x 30. Figures: bench/results/faults-limits(-ci).json.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.faults.harness import Scenario, size, utc_ms, wait_for, write_figures
from tests.limit_sink import Call, max_in_window, max_overlap

SIZES = {
    "ci": {"jobs": 600, "rated_each": 30, "spread_s": 5},
    "full": {"jobs": 5000, "rated_each": 100, "spread_s": 10},
}
KEYS = 20
SLEEP_S = 0.1
PER_S, BURST = 5.0, 2
RATE_KEYS = ("rate-a", "rate-b")
WORKER_ENV = {
    "DUETIME_WORKER_CONCURRENCY": "50",
    "DUETIME_WORKER_BUFFER": "400",
    "DUETIME_LEASE_TTL_S": "3",
    "DUETIME_WORKER_SHUTDOWN_S": "3",
}


def limit_of(k: int) -> int:
    return 1 if k % 2 == 0 else 3


def create_jobs(
    scenario: Scenario, n: int, rated_each: int, start: datetime, spread_s: float
) -> dict[str, str]:
    """Create the jobs; returns job_id → its limit key as the checks name it."""
    keys: dict[str, str] = {}
    specs: list[tuple[dict[str, Any], datetime, str]] = []
    for i in range(n):
        k = i % KEYS
        specs.append(
            (
                {
                    "payload": {"k": k, "sleep_s": SLEEP_S, "i": i},
                    "concurrency": {"key": "key-{payload.k}", "limit": limit_of(k)},
                },
                # whole milliseconds: the checker matches occurrences by their ms
                start + timedelta(milliseconds=int(spread_s * 1000 * i / n)),
                f"key-{k}",
            )
        )
    for rate_key in RATE_KEYS:
        for i in range(rated_each):
            specs.append(
                (
                    {
                        "payload": {"i": i},
                        "rate_limit": {"key": rate_key, "per_s": PER_S, "burst": BURST},
                    },
                    start,
                    rate_key,
                )
            )
    with scenario.job_client() as client:
        for index, (extra, at, key) in enumerate(specs):
            created = client.create_job(
                name=f"limited-{index}",
                schedule={"at": at.isoformat()},
                target={"type": "http", "url": scenario.sink.url},
                retry={"max_retries": 5, "base_delay_s": 1, "max_delay_s": 5},
                # the rescue window (timeout + TTL + 30 s) stays far above the longest wait
                timeout_s=300,
                wait=False,
                **extra,
            )
            scenario.record_job(created, [utc_ms(at)])
            keys[created.job_id] = key
        client.flush()
    return keys


def calls(scenario: Scenario, keys: dict[str, str]) -> list[Call]:
    """Every call the sink received (answered or not: a killed worker's calls ran too)."""
    return [
        Call(
            execution=str(e["key"]),
            key=keys[str(e["job_id"])],
            job_id=str(e["job_id"]),
            start_s=e["at_ms"] / 1000,
            end_s=e["answered_ms"] / 1000,
        )
        for e in scenario.history.events()
        if e.get("kind") == "delivery" and str(e.get("job_id")) in keys
    ]


def test_limits_hold_through_a_worker_sigkill(new_scenario: Callable[..., Scenario]) -> None:
    sized = SIZES[size()]
    n, rated_each = sized["jobs"], sized["rated_each"]
    total = n + rated_each * len(RATE_KEYS)
    scenario = new_scenario("limits", effects=True, terminal=True)
    scenario.start_role("scheduler")
    scenario.start_role("projector")
    workers = [scenario.start_role("worker", f"worker-{i + 1}", **WORKER_ENV) for i in range(3)]
    scenario.schedulers_own_all(1)
    scenario.workers_assigned()
    # every job created before its due time (creating 5,200 took over 3 s on a loaded box: a
    # job created past its time runs at once, off the occurrence the checker expects)
    lead_s = 3 + (n + rated_each * len(RATE_KEYS)) / 250
    start = (datetime.now(UTC) + timedelta(seconds=lead_s)).replace(microsecond=0)
    keys = create_jobs(scenario, n, rated_each, start, sized["spread_s"])
    started_s = start.timestamp()

    wait_for(lambda: scenario.sink.effects() >= total // 3, 600, f"{total // 3} effects")
    victim = workers[0]
    with scenario.fault(f"sigkill-{victim.name}"):
        victim.kill()
        victim.spawn()
    victim.wait_log("assigned", 90, since_start=True)
    wait_for(lambda: scenario.sink.effects() >= total, 900, f"{total} effects", interval_s=1)
    took_s = max(c.end_s for c in calls(scenario, keys)) - started_s
    report = scenario.finish()

    recorded = calls(scenario, keys)
    overlap = max_overlap(c for c in recorded if c.key.startswith("key-"))
    over = {k: v for k, v in overlap.items() if v > limit_of(int(k.split("-")[1]))}
    rates = max_in_window([c for c in recorded if c.key in RATE_KEYS], 1.0)
    figures = {
        **report.figures(),
        "max_overlap_by_key": overlap,
        "keys_over_limit": len(over),
        "max_starts_in_1s_by_rate_key": rates,
        "rate_bound": PER_S + BURST,
        "seconds_to_run_all": round(took_s, 1),
    }
    config: dict[str, Any] = {
        "workers": 3,
        "keys": KEYS,
        "limits": "1 on even keys, 3 on odd keys",
        "sleep_s": SLEEP_S,
        "rate_limit": {"keys": list(RATE_KEYS), "per_s": PER_S, "burst": BURST},
        "jobs": n,
        "rated_jobs": rated_each * len(RATE_KEYS),
        "worker_env": WORKER_ENV,
        "sigkilled": victim.name,
    }
    write_figures("limits", figures, size(), config)
    print("figures:", figures)
    assert report.ok, report.summary()
    assert report.figures()["lost"] == 0 and report.effects == total
    assert not over, over
    # counted where the calls arrive, after the token was taken: one token of arrival jitter
    # (a call delayed on its way lands in the next second's window) is allowed for
    assert all(count <= PER_S + BURST + 1 for count in rates.values()), rates

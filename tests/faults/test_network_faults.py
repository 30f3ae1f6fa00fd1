"""Indeterminate commit (issue 8): the scheduler's traffic to the broker is black-holed while
it commits, for longer than its transaction timeout, then restored.

The only scheduler reaches the broker through a :class:`~tests.faults.proxy.TcpProxy` (its own
broker listener advertises the proxy, so every one of its connections crosses it); the worker,
the projector and the harness talk to the broker directly. One-time jobs fall due every few
tens of milliseconds, so the cut lands in the middle of a transaction or of its commit. While
it lasts the broker aborts the open transaction (its timeout) and expires the scheduler's
group session; the scheduler's commit times out with an unknown outcome. Once traffic flows
again the scheduler must recreate its producers (KIP-890 is not in librdkafka: never retry on
the old instance), rejoin, restore from its changelog and fire everything that fell due: no
lost occurrence, no duplicate request or effect, no torn (hanging or aborted-but-read)
transaction. CI size: 8 s cut with a 5 s transaction timeout; full: 40 s with the default 30 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import pytest

from tests.faults.harness import FaultStack, Scenario, size, utc_ms, wait_for, write_figures
from tests.faults.proxy import TcpProxy
from tests.faults.support import lateness_vs_schedule_ms

SIZES: dict[str, dict[str, Any]] = {
    "ci": {"jobs": 200, "spread_s": 15, "txn_timeout_ms": 5000, "cut_s": 8},
    "full": {"jobs": 3000, "spread_s": 120, "txn_timeout_ms": 30_000, "cut_s": 40},
}


class ProxiedStack(FaultStack):
    """A private stack whose broker has one more listener per proxy, advertised as the proxy:
    a client bootstrapped to ``proxies[i].address`` only ever connects through that proxy."""

    def __init__(self, name: str, proxies: int = 1, **kwargs: Any) -> None:
        from duetime.infra.local_kafka import LocalKafka
        from duetime.infra.process import free_port

        super().__init__(name, **kwargs)
        self.proxies: list[TcpProxy] = []
        pairs = []
        for _ in range(proxies):
            listener = free_port()
            proxy = TcpProxy(listener)
            self.proxies.append(proxy)
            pairs.append((listener, proxy.port))
        k = self.kafka
        self.kafka = LocalKafka(
            k.home,
            port=k.port,
            controller_port=k.controller_port,
            heap_mb=k.heap_mb,
            partition_dir=k.partition_dir,
            extra_listeners=pairs,
        )

    def start(self) -> Self:
        for proxy in self.proxies:
            proxy.start()
        return super().start()

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        super().close()


@pytest.fixture(scope="module")
def proxied_stack() -> Iterator[ProxiedStack]:
    with ProxiedStack("network") as stack:
        yield stack


@pytest.fixture
def scenario(proxied_stack: ProxiedStack) -> Iterator[Scenario]:
    made = proxied_stack.scenario("indeterminate-commit", 6, effects=True, terminal=True)
    try:
        yield made
    finally:
        for proxy in proxied_stack.proxies:
            proxy.restore()
        made.close()


@pytest.mark.slow
def test_indeterminate_commit_recreates_the_producer_and_tears_nothing(
    proxied_stack: ProxiedStack, scenario: Scenario
) -> None:
    sized = SIZES[size()]
    proxy = proxied_stack.proxies[0]
    scenario.role_bootstrap = proxy.address
    scheduler = scenario.start_role(
        "scheduler",
        "scheduler-1",
        DUETIME_SCHEDULER_TRANSACTION_TIMEOUT_MS=str(sized["txn_timeout_ms"]),
    )
    scenario.role_bootstrap = proxied_stack.bootstrap
    scenario.start_role("worker", "worker-1", DUETIME_WORKER_CONCURRENCY="50")
    scenario.start_role("projector")
    scenario.schedulers_own_all(1)
    scenario.workers_assigned()
    n, spread_s = sized["jobs"], sized["spread_s"]
    start = datetime.now(UTC) + timedelta(seconds=3)
    with scenario.job_client() as client:
        for i in range(n):
            at = start + timedelta(seconds=spread_s * i / n)
            created = client.create_job(
                name=f"commit-{i}",
                schedule={"at": at.isoformat()},
                target={"type": "http", "url": scenario.sink.url},
                payload={"i": i},
                retry={"max_retries": 5, "base_delay_s": 1, "max_delay_s": 5},
                wait=False,
            )
            scenario.record_job(created, [utc_ms(at)])
        client.flush()
    # cut once the scheduler is busy committing (about a quarter of the jobs are due)
    wait_for(lambda: scenario.sink.effects() >= n // 4, 120, f"{n // 4} effects before the cut")
    relayed_before = proxy.bytes_relayed
    with scenario.fault("blackhole-scheduler"):
        proxy.blackhole()
        time.sleep(sized["cut_s"])  # the cut's duration: the fault itself, not a settling
        proxy.restore()
    wait_for(lambda: scenario.sink.effects() >= n, 300, f"all {n} effects after the cut", 1.0)
    assert scheduler.running, f"the scheduler exited:\n{scheduler.log()[-3000:]}"
    log = scheduler.log()
    recreated = log.count("transaction failed (recreate)") + log.count("restoring it")
    report = scenario.finish()
    config = {
        **sized,
        "partitions": scenario.settings.partitions,
        "proxied": "scheduler (its only scheduler)",
        "transaction_failures_logged": log.count("transaction failed"),
        "producer_recreations_logged": recreated,
        "relayed_bytes_before_cut": relayed_before,
    }
    config["max_lateness_vs_schedule_ms"] = lateness_vs_schedule_ms(scenario)
    write_figures("indeterminate-commit", report, size(), config)
    print("figures:", report.figures(), "config:", config)
    assert report.ok, report.summary()
    assert report.figures()["lost"] == 0 and report.effects == n
    assert "transaction failed" in log, "the cut did not catch a transaction"

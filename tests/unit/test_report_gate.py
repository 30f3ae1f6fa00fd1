"""Starts before reports (consumers/worker/report_gate.py): a report waits while starts wait,
never longer than its bound, and goes at once when no start waits."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.worker.report_gate import ReportGate


async def _turns(gate: ReportGate, n: int) -> list[asyncio.Task[None]]:
    tasks = [asyncio.create_task(gate.turn()) for _ in range(n)]
    await asyncio.sleep(0)  # each reaches its turn (or returns)
    return tasks


def test_a_report_goes_at_once_when_no_start_waits() -> None:
    async def main() -> None:
        gate = ReportGate(10.0)
        tasks = await _turns(gate, 3)
        assert all(t.done() for t in tasks) and len(gate) == 0
        gate.starts_waiting(True)
        gate.starts_waiting(False)
        assert all(t.done() for t in await _turns(gate, 2))

    asyncio.run(main())


def test_reports_wait_for_the_starts_then_all_go() -> None:
    async def main() -> None:
        gate = ReportGate(10.0)
        gate.starts_waiting(True)
        tasks = await _turns(gate, 3)
        assert not any(t.done() for t in tasks) and len(gate) == 3
        gate.let_overdue_go()  # none has waited 10 s
        await asyncio.sleep(0)
        assert not any(t.done() for t in tasks)
        gate.starts_waiting(False)
        await asyncio.sleep(0)
        assert all(t.done() for t in tasks) and len(gate) == 0

    asyncio.run(main())


def test_a_bound_of_zero_never_holds_a_report() -> None:
    async def main() -> None:
        gate = ReportGate(0.0)
        gate.starts_waiting(True)
        assert all(t.done() for t in await _turns(gate, 2))

    asyncio.run(main())


@settings(max_examples=200, deadline=None)
@given(
    bound=st.floats(0.5, 30.0),
    ages=st.lists(st.floats(0.0, 60.0), min_size=1, max_size=20),
    at=st.floats(0.0, 60.0),
)
def test_only_reports_waiting_their_bound_are_let_go(
    bound: float, ages: list[float], at: float
) -> None:
    """Whatever the arrivals, at any instant the overdue go and the rest keep waiting."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate = ReportGate(bound)
        gate.starts_waiting(True)
        base = loop.time()
        arrivals = sorted(base + a for a in ages)
        turns = []
        for arrived in arrivals:  # arrivals in order, as the executor's reports come
            turn: asyncio.Future[None] = loop.create_future()
            gate._waiting.append((arrived, turn))
            turns.append(turn)
        now = base + at
        gate.let_overdue_go(now)
        for arrived, turn in zip(arrivals, turns, strict=True):
            assert turn.done() == (arrived <= now - bound)
        assert len(gate) == sum(1 for a in arrivals if a > now - bound)

    asyncio.run(main())

"""Fixtures of the fault campaign: one private stack per session, one scenario per test.

The stack (``FaultStack``) is the campaign's own broker and PostgreSQL on free ports; the
shared test stack is never touched. Every scenario gets its own topics and database and is
closed (its roles killed by pid, its sink stopped) even when the test fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.faults.harness import FaultStack, Scenario


@pytest.fixture(scope="session")
def fault_stack() -> Iterator[FaultStack]:
    with FaultStack("session") as stack:
        yield stack


@pytest.fixture
def new_scenario(fault_stack: FaultStack) -> Iterator[Callable[..., Scenario]]:
    made: list[Scenario] = []

    def make(name: str, partitions: int = 6, **config: Any) -> Scenario:
        scenario = fault_stack.scenario(name, partitions, **config)
        made.append(scenario)
        return scenario

    yield make
    for scenario in made:
        scenario.close()
    # a scenario that killed or paused a server leaves it running for the next one
    fault_stack.resume_broker()
    if not fault_stack.kafka.is_running():
        fault_stack.start_broker()
    if not fault_stack.postgres.is_running():
        fault_stack.start_postgres()

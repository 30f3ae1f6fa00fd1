"""Fixtures of the fault campaign: one private stack per session, one scenario per test.

The stack (``FaultStack``) is the campaign's own broker and PostgreSQL on free ports; the
shared test stack is never touched. Every scenario gets its own topics and database and is
closed (its roles killed by pid, its sink stopped) even when the test fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import FaultStack, Scenario

CORE = frozenset({"test_poison", "test_lost_execution", "test_checker", "test_proxy"})
"""The fault modules ``./run test`` runs (at CI size): bad records on every topic, the
rescuer's lost executions, and the campaign's own checker and proxy. Every other scenario
belongs to the campaign (``./run faults``): together they take longer than the README's test
command may (about 20 minutes in all)."""
CAMPAIGN_ONLY = frozenset({"test_swallowed_requests_are_rescued_and_run_exactly_once[claim]"})
"""Tests of the CORE modules that only the campaign runs (a second variant of a scenario the
CORE run already covers: here, lost executions whose leases were claimed)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip, with the reason, the campaign's scenarios outside ``./run faults``
    (``DUETIME_FAULTS_CAMPAIGN=1``), unless their file is named on the command line."""
    if os.environ.get("DUETIME_FAULTS_CAMPAIGN") == "1":
        return
    named = {Path(arg.split("::")[0]).resolve() for arg in config.args}
    skip = pytest.mark.skip(
        reason="fault campaign scenario: ./run faults (full size) or "
        "DUETIME_FAULTS_SIZE=ci ./run faults; or name its file"
    )
    here = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.path)).resolve()
        campaign = path.stem not in CORE or item.name in CAMPAIGN_ONLY
        if path.parent == here and campaign and path not in named:
            item.add_marker(skip)


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

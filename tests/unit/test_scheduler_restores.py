"""Restores off the scheduler's loop (schedulers/restores.py): results reach the loop once,
a failure is handed over (not raised in a thread), a revoked partition's owner is closed and
never handed over, and the readers are reused, then closed."""

from __future__ import annotations

import threading
from typing import Any, cast

from confluent_kafka import Consumer

from duetime.schedulers.partition import PartitionOwner
from duetime.schedulers.restores import Restored, Restores
from tests.helpers import wait_for


class FakeOwner:
    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeReader:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Builds:
    """``build`` for Restores: partition 13 fails; a partition in ``gates`` waits for it."""

    def __init__(self) -> None:
        self.owners: dict[int, FakeOwner] = {}
        self.readers: list[FakeReader] = []
        self.gates: dict[int, threading.Event] = {}
        self.used: list[Any] = []

    def reader(self) -> Consumer:
        reader = FakeReader()
        self.readers.append(reader)
        return cast(Consumer, reader)

    def build(self, p: int, reader: Consumer) -> Restored:
        self.used.append(reader)
        gate = self.gates.get(p)
        if gate is not None:
            assert gate.wait(30), "the test never opened the gate"
        if p == 13:
            raise RuntimeError("changelog unreadable")
        owner = self.owners[p] = FakeOwner(p)
        return Restored(cast(PartitionOwner, owner), p * 10, 0.01)


def collect(restores: Restores, want: int) -> dict[int, Restored | BaseException]:
    got: dict[int, Restored | BaseException] = {}

    def enough() -> bool:
        got.update(restores.done())
        return len(got) >= want

    wait_for(enough, 10, f"{want} restores to end")
    return got


def test_results_and_failures_reach_the_loop_once() -> None:
    builds = Builds()
    restores = Restores(builds.build, builds.reader)
    try:
        for p in (1, 2, 13):
            restores.start(p)
        got = collect(restores, 3)
        assert isinstance(got[13], RuntimeError)
        ok = {p: r for p, r in got.items() if isinstance(r, Restored)}
        assert {p: r.states for p, r in ok.items()} == {1: 10, 2: 20}
        assert restores.pending() == set() and restores.done() == []
        assert len(builds.readers) <= 2  # one per thread at most, reused
    finally:
        restores.close()
    assert all(r.closed for r in builds.readers)
    assert not any(o.closed for o in builds.owners.values())  # handed over: the loop's now


def test_a_partition_revoked_while_restoring_is_closed_never_handed_over() -> None:
    builds = Builds()
    builds.gates[4] = threading.Event()
    restores = Restores(builds.build, builds.reader)
    try:
        restores.start(4)
        restores.start(4)  # assigned twice while restoring: one restore
        assert restores.pending() == {4}
        assert restores.cancel(4) and not restores.cancel(4)
        builds.gates[4].set()
        wait_for(lambda: 4 in builds.owners and builds.owners[4].closed, 10, "p4 closed")
        assert restores.done() == [] and restores.pending() == set()
        assert len(builds.used) == 1
    finally:
        restores.close()


def test_close_waits_for_running_restores_and_closes_them() -> None:
    builds = Builds()
    builds.gates[7] = threading.Event()
    restores = Restores(builds.build, builds.reader)
    restores.start(7)
    threading.Timer(0.2, builds.gates[7].set).start()
    restores.close()
    assert builds.owners[7].closed and all(r.closed for r in builds.readers)


def test_readers_made_ahead_serve_the_restores_and_are_closed() -> None:
    builds = Builds()
    restores = Restores(builds.build, builds.reader, ready=2)
    try:
        wait_for(lambda: len(builds.readers) == 2, 10, "two readers made ahead")
        restores.start(1)
        restores.start(2)
        collect(restores, 2)
        assert len(builds.readers) == 2  # none made at the restores
        assert {id(r) for r in builds.used} <= {id(r) for r in builds.readers}
    finally:
        restores.close()
    assert all(r.closed for r in builds.readers)

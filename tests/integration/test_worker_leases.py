"""Leases against the real PostgreSQL: fencing, takeover, batches, and a database outage."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from duetime.consumers.worker import metrics
from duetime.consumers.worker.leases import LeaseStore


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]  # each test drives its own loop


def new_id() -> str:
    return str(uuid.uuid4())


async def expired(url: str, execution_id: str, timeout_s: float = 10.0) -> None:
    """Wait until the lease of ``execution_id`` has expired by the database's clock (the one
    the lease statements use)."""
    deadline = time.monotonic() + timeout_s
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            cur = await conn.execute(
                "SELECT expires_at < now() FROM leases WHERE execution_id = %s", (execution_id,)
            )
            row = await cur.fetchone()
            if row is not None and row[0]:
                return
            assert time.monotonic() < deadline, f"lease {execution_id} still live"
            await asyncio.sleep(0.05)


async def opened(url: str, owner: str, ttl_s: float) -> LeaseStore:
    store = LeaseStore(url, owner, ttl_s)
    await store.open()
    return store


def test_fencing_tokens_takeover_and_stale_writes(database_url: str) -> None:
    async def scenario() -> None:
        a = await opened(database_url, "worker-a", 0.5)
        b = await opened(database_url, "worker-b", 0.5)
        try:
            eid = new_id()
            first = await a.claim(eid, 1)
            assert first.token is not None and first.conflict is None
            busy = await b.claim(eid, 1)
            assert busy.conflict == "busy" and busy.owner == "worker-a"
            assert 0 < busy.retry_in_s <= 0.6
            # an expired lease nobody took over is still its holder's: renewal works
            await expired(database_url, eid)
            assert await a.renew([(eid, first.token)]) == set()
            await expired(database_url, eid)
            second = await b.claim(eid, 1)  # expired: worker-b takes it over
            assert second.token is not None and second.token > first.token
            # the zombie's writes with the stale token are rejected everywhere
            assert await a.renew([(eid, first.token)]) == {eid}
            assert await a.complete(eid, first.token, "success", b"zombie") is False
            assert await b.complete(eid, second.token, "success", b"winner") is True
            assert await b.complete(eid, second.token, "success", b"winner") is True  # retry
            done = await a.claim(eid, 1)
            assert done.conflict == "done" and done.result == b"winner"
            # a newer attempt claims over a finished one; the older request is then stale
            third = await a.claim(eid, 2)
            assert third.token is not None and third.token > second.token
            assert (await b.claim(eid, 1)).conflict == "stale"
            # released leases are claimable at once
            await a.release([(eid, third.token)])
            fourth = await b.claim(eid, 2)
            assert fourth.token is not None and fourth.token > third.token
        finally:
            await a.close()
            await b.close()
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT attempt, owner, fencing_token, state FROM leases WHERE execution_id = %s",
                (eid,),
            ).fetchone()
        assert row == (2, "worker-b", fourth.token, "held")

    run(scenario())


def test_concurrent_claims_are_batched_and_one_wins_each_execution(database_url: str) -> None:
    async def scenario() -> None:
        a = await opened(database_url, "worker-a", 10)
        b = await opened(database_url, "worker-b", 10)
        try:
            ids = [new_id() for _ in range(300)]
            batches_before = _count(metrics.LEASE_BATCH_SIZE, "claim")
            claims = await asyncio.gather(*(store.claim(eid, 1) for eid in ids for store in (a, b)))
            batches = _count(metrics.LEASE_BATCH_SIZE, "claim") - batches_before
            winners = [c for c in claims if c.token is not None]
            assert len(winners) == len(ids)  # exactly one claim per execution won
            assert len({c.token for c in winners}) == len(ids)
            assert all(c.conflict == "busy" for c in claims if c.token is None)
            assert batches <= 20, f"{len(claims)} claims took {batches} round trips"
            # the same execution twice in one batch: one claims, the other is busy
            eid = new_id()
            twice = await asyncio.gather(a.claim(eid, 1), a.claim(eid, 1))
            assert sorted(c.conflict or "" for c in twice) == ["", "busy"]
        finally:
            await a.close()
            await b.close()

    run(scenario())


def test_completions_spread_in_time_share_one_round_trip_within_the_gather(
    database_url: str,
) -> None:
    """Runs started one at a time finish one at a time: their completions wait (up to the
    gather) for each other instead of each taking its own statement and WAL flush."""

    async def scenario() -> None:
        store = LeaseStore(database_url, "worker-a", 10, complete_gather_s=5.0)
        await store.open()
        try:
            ids = [new_id() for _ in range(5)]
            claims = await asyncio.gather(*(store.claim(eid, 1) for eid in ids))

            async def complete(index: int, eid: str, token: int | None) -> bool:
                assert token is not None
                await asyncio.sleep(0.02 * index)  # one after the other, as runs finish
                return await store.complete(eid, token, "success", b"result")

            before = _count(metrics.LEASE_BATCH_SIZE, "complete")
            done = await asyncio.gather(
                *(complete(i, e, c.token) for i, (e, c) in enumerate(zip(ids, claims, strict=True)))
            )
            assert done == [True] * len(ids)
            assert _count(metrics.LEASE_BATCH_SIZE, "complete") - before == 1
        finally:
            await store.close()

    run(scenario())


def _count(histogram: object, op: str) -> float:
    for metric in histogram.collect():  # type: ignore[attr-defined]
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels.get("op") == op:
                return float(sample.value)
    return 0.0


class Proxy:
    """A TCP proxy to PostgreSQL that can be cut (``down``) and restored (``up``)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.alive:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def down(self) -> None:
        self.alive = False
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.sockets.clear()

    def up(self) -> None:
        self.alive = True

    def close(self) -> None:
        self.down()
        self.listener.close()


@pytest.fixture
def proxied_url(database_url: str) -> Iterator[tuple[str, Proxy]]:
    parts = urlsplit(database_url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}"
    yield urlunsplit(parts._replace(netloc=netloc)), proxy
    proxy.close()


def test_postgresql_outage_blocks_claims_until_it_is_back(
    proxied_url: tuple[str, Proxy],
) -> None:
    url, proxy = proxied_url

    async def scenario() -> None:
        store = await opened(url, "worker-a", 5)
        try:
            assert (await store.claim(new_id(), 1)).token is not None
            errors_before = _total(metrics.DB_ERRORS)
            proxy.down()
            pending = asyncio.ensure_future(store.claim(new_id(), 1))
            await asyncio.sleep(1.5)  # the subject: for 1.5 s the claim waits, it does not fail
            assert not pending.done(), "a claim must wait for the database, not fail"
            assert _total(metrics.DB_ERRORS) > errors_before
            proxy.up()
            started = time.monotonic()
            claim = await asyncio.wait_for(pending, 15)
            assert claim.token is not None
            assert time.monotonic() - started < 10
        finally:
            await store.close()

    run(scenario())


def _total(counter: object) -> float:
    return sum(
        s.value
        for m in counter.collect()  # type: ignore[attr-defined]
        for s in m.samples
        if s.name.endswith("_total")
    )

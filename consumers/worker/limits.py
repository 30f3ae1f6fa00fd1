"""The worker's side of the limits per key (issue 18, items 1 and 2): resolving an execution's
keys, and the executions waiting for a slot or a token.

**Where a key is resolved: here, at the worker** (docs/decisions.md says why): the request
carries the job's templates as written, and :func:`resolve` reads the payload the request
also carries. A template the payload does not satisfy (the API refuses such a job, so only a
request written otherwise gets here) fails that attempt, not retryable, naming the field.

**Waiting** (:class:`LimitWaits`; no I/O, driven by the worker's loop): a request whose claim
was refused by a limit waits outside the execution slots and without a lease, its offset not
committed (a crash redelivers it). Per wait key (``c:<key>`` or ``r:<key>``) the waiters are
ordered by priority, then by arrival; while a key has waiters, a new request of that key
joins them without asking PostgreSQL. One waiter at a time is let go to try its claim:

- when the key's retry time comes: the bucket's next token (``rate``; the claim said when),
  or a short recheck (``concurrency``: a slot freed by another worker is seen within it);
- at once when an execution of that key finishes on this worker (a local slot freed), or
  when the waiter let go before it claimed (the next may then succeed too: a limit of N
  frees up to N at once, and they start one claim after the other).

Memory is bounded by the worker's buffer: every waiter is a fetched record still counted
there, so beyond the buffer the worker stops fetching rather than hold more.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from duetime.core.keys import (
    MAX_BURST,
    MAX_LIMIT,
    MAX_PER_S,
    Template,
    parse_template,
    resolve_key,
)
from duetime.core.models import PRIORITY_ORDER, Priority
from duetime.core.records import ExecutionRequest

from .leases import Limits

__all__ = ["CONCURRENCY_RECHECK_S", "LimitWaits", "check_limits", "resolve", "wait_keys"]

CONCURRENCY_RECHECK_S = 0.25
"""A key refused for concurrency is tried again after about this long (with jitter): the
slots another worker frees are seen within it. Slots freed here wake the key at once."""
FALLBACK_S = 1.0
"""A key whose waiter was let go tries the next after this long even if the first never
answers (it was dropped by a rebalance), so a key never stays blocked with waiters."""
_RANK = {p: i for i, p in enumerate(PRIORITY_ORDER)}
_parsed = functools.lru_cache(maxsize=1024)(parse_template)
"""Templates parsed once: a job's requests all carry the same (requests hold strings)."""


def check_limits(request: ExecutionRequest) -> None:
    """Refuse limit numbers no validated job can carry (the request is then parked as poison:
    a zero rate would divide by zero in the claim)."""
    c, r = request.concurrency, request.rate_limit
    if c is not None and not 1 <= c.limit <= MAX_LIMIT:
        raise ValueError(f"concurrency.limit {c.limit} is not in [1, {MAX_LIMIT}]")
    if r is not None:
        if not (math.isfinite(r.per_s) and 0 < r.per_s <= MAX_PER_S):
            raise ValueError(f"rate_limit.per_s {r.per_s} is not in (0, {MAX_PER_S:g}]")
        if not 1 <= r.burst <= MAX_BURST:
            raise ValueError(f"rate_limit.burst {r.burst} is not in [1, {MAX_BURST}]")


def resolve(request: ExecutionRequest) -> Limits | None:
    """The request's limits with their keys resolved; None without limits.

    Raises ``ValueError`` (a :class:`~duetime.core.keys.KeyTemplateError`) naming the field
    whose template does not resolve against the payload."""
    c, r = request.concurrency, request.rate_limit
    if c is None and r is None:
        return None
    ctemplate = c.key if c is not None else None
    rtemplate = r.key if r is not None else None
    if len(request.payload_json) <= _CACHED_PAYLOAD_CHARS:
        ckey, rkey = _keys_cached(ctemplate, rtemplate, request.payload_json)
    else:
        ckey, rkey = _keys(ctemplate, rtemplate, request.payload_json)
    return Limits(
        concurrency_key=ckey,
        concurrency_limit=c.limit if c is not None else 0,
        rate_key=rkey,
        per_s=r.per_s if r is not None else 0.0,
        burst=r.burst if r is not None else 0,
    )


def _keys(
    ctemplate: str | None, rtemplate: str | None, payload_json: str
) -> tuple[str | None, str | None]:
    """The resolved (concurrency, rate) keys; the payload is parsed only when a template
    reads it (a constant key costs no JSON parsing)."""
    named = (("concurrency.key", ctemplate), ("rate_limit.key", rtemplate))
    parsed = {name: _template(name, t) for name, t in named if t is not None}
    reads = any(t.paths for t in parsed.values())
    payload = json.loads(payload_json) if reads else None
    keys = {name: _resolved(name, t, payload) for name, t in parsed.items()}
    return keys.get("concurrency.key"), keys.get("rate_limit.key")


_CACHED_PAYLOAD_CHARS = 1024
"""Payloads up to this size have their keys remembered (a recurring job's requests carry the
same payload: one JSON parse for all of them); larger ones are parsed every time, so the
cache holds at most ~4 MB of payload text."""
_keys_cached = functools.lru_cache(maxsize=4096)(_keys)
"""Pure (same templates and payload, same keys); a template that fails raises, not cached."""


def _template(name: str, template: str) -> Template:
    try:
        return _parsed(template)
    except ValueError as exc:
        raise type(exc)(f"{name} {exc}") from None


def _resolved(name: str, template: Template, payload: object) -> str:
    try:
        return resolve_key(template, payload)
    except ValueError as exc:
        raise type(exc)(f"{name} {exc}") from None


def wait_keys(limits: Limits) -> tuple[str, ...]:
    """The wait keys of an execution: ``c:<concurrency key>``, ``r:<rate key>``."""
    keys: list[str] = []
    if limits.concurrency_key is not None:
        keys.append("c:" + limits.concurrency_key)
    if limits.rate_key is not None:
        keys.append("r:" + limits.rate_key)
    return tuple(keys)


def reason_of(wait_key: str) -> str:
    return "concurrency" if wait_key.startswith("c:") else "rate"


@dataclass
class _Key:
    retry_at: float
    waiters: list[tuple[int, float, int, str]] = field(default_factory=list)
    """Heap of (priority rank, enqueued_at, seq, item key)."""


class LimitWaits:
    """The requests waiting for a limit, per wait key (see the module doc). Times are the
    caller's monotonic seconds; ``rng`` jitters the concurrency recheck."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._keys: dict[str, _Key] = {}
        self._where: dict[str, str] = {}
        """item key → its wait key."""
        self._seq = 0
        self._rng = rng or random.Random()

    def __len__(self) -> int:
        return len(self._where)

    def blocking(self, limits: Limits) -> str | None:
        """The wait key that has waiters already, if any: a new request joins them."""
        for key in wait_keys(limits):
            if key in self._keys:
                return key
        return None

    def park(
        self,
        item_key: str,
        wait_key: str,
        priority: Priority,
        enqueued_at: float,
        now: float,
        retry_in_s: float | None = None,
    ) -> None:
        """Add a waiter. ``retry_in_s``: the claim's answer said when to try again (a refusal);
        None: it joins a key that is already waiting (its retry time stays)."""
        self._seq += 1
        entry = self._keys.get(wait_key)
        if retry_in_s is not None:
            if reason_of(wait_key) == "concurrency":
                retry_in_s = CONCURRENCY_RECHECK_S * (0.5 + self._rng.random())
            retry_at = now + max(0.001, retry_in_s)
            if entry is None:
                entry = self._keys[wait_key] = _Key(retry_at)
            else:
                entry.retry_at = retry_at
        elif entry is None:  # nothing was waiting after all: it may try at once
            entry = self._keys[wait_key] = _Key(now)
        heapq.heappush(entry.waiters, (_RANK[priority], enqueued_at, self._seq, item_key))
        self._where[item_key] = wait_key

    def wake(self, wait_key: str, now: float) -> None:
        """Something on this worker freed the key (a slot, or a waiter that went to claim):
        let its next waiter try at once."""
        entry = self._keys.get(wait_key)
        if entry is not None:
            entry.retry_at = min(entry.retry_at, now)

    def due(self, now: float) -> Iterator[str]:
        """The item keys to let go now: the best waiter of each key whose time has come."""
        for wait_key in [k for k, e in self._keys.items() if e.retry_at <= now]:
            entry = self._keys[wait_key]
            while entry.waiters:
                item_key = heapq.heappop(entry.waiters)[3]
                if self._where.pop(item_key, None) == wait_key:
                    entry.retry_at = now + FALLBACK_S
                    yield item_key
                    break
            if not entry.waiters:
                del self._keys[wait_key]

    def drop(self, which: Callable[[str], bool]) -> list[str]:
        """Forget the waiters whose item key matches; returns them."""
        gone = [k for k in self._where if which(k)]
        for item_key in gone:
            del self._where[item_key]  # their heap entries are skipped by due()
        for wait_key in [k for k, e in self._keys.items() if not self._live(e)]:
            del self._keys[wait_key]
        return gone

    def _live(self, entry: _Key) -> bool:
        return any(self._where.get(w[3]) is not None for w in entry.waiters)

    def counts(self) -> dict[str, int]:
        """How many wait, per reason (``concurrency``, ``rate``)."""
        out = {"concurrency": 0, "rate": 0}
        for wait_key in self._where.values():
            out[reason_of(wait_key)] += 1
        return out

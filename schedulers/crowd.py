"""The crowd lead: fire a crowd of jobs ahead of their time by the time it takes to get them out.

Every scheduled run and retry is emitted the base fire lead (``Policy.fire_lead_ms``) before
its due time. A burst of thousands due at one instant takes longer than that to emit, commit,
fetch and claim, so without more lead most of it starts late. Here the timer fires "as late as
possible at rate R": walking the near-term jobs in wake-up order (wake = due − base lead),
job k (0-based) must be out by its wake-up, so the k jobs before it must start going out k / R
before it. Once that instant has come, every job up to k fires now. A steady load below R
never gets there, nor a job alone (no extra lead); a burst of N due at one instant fires
(N − 1) / R ahead of its wake-up; nothing fires more than ``cap_ms`` ahead of its wake-up.

Pure arithmetic on (wake-up, jobs) groups; the partition's store keeps the counts
(``StateStore.crowd``), the partition applies the result (``PartitionOwner.fire``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Crowd:
    until_ms: int
    """Fire every job waking at or before this instant now (at least ``now_ms``)."""
    next_ms: int | None
    """The instant a later group's turn comes (its jobs must start going out then), if one
    within the cap has not come yet: the timer must wake by then."""
    walked: int = field(default=0, compare=False)
    """The jobs of the groups walked (all given, unless ``total`` stopped the walk): a count
    beside the answer, not part of it."""


def crowd_lead(
    groups: Iterable[tuple[int, int]],
    now_ms: int,
    rate_per_s: float,
    cap_ms: int,
    total: int | None = None,
    min_lead_ms: float = 0,
) -> Crowd:
    """Which jobs to fire at ``now_ms``. ``groups``: (wake_ms, jobs) in ascending wake order
    (those waking before now included: they go out first); ``rate_per_s``: the jobs this
    partition plans to emit a second; ``cap_ms``: no job fires earlier than this before its
    wake-up (0: none early). ``total``: the jobs of every group, when known: the walk stops
    where even all of them would go out in time. ``min_lead_ms``: a group whose turn would
    come less than this before its wake-up does not set ``next_ms`` (the caller looks again
    at least that often anyway: under a steady load every next job's turn is a few ms before
    its wake-up, and waking for each cost the scheduler a walk per fire); once its turn has
    come it still fires with the rest."""
    until_ms, next_ms = now_ms, None
    if cap_ms <= 0 or rate_per_s <= 0:
        return Crowd(until_ms, None)
    horizon_ms = now_ms + cap_ms
    ms_per_job = 1000 / rate_per_s
    seen = 0
    for wake_ms, jobs in groups:
        if total is not None and wake_ms - now_ms > (total - 1) * ms_per_job:
            # even every job there is would start going out after now: this group's turn
            # comes no earlier than this (the rest's later), and none more than this ahead
            if (total - 1) * ms_per_job >= min_lead_ms:
                next_ms = _earlier(next_ms, math.ceil(wake_ms - (total - 1) * ms_per_job))
            break
        seen += jobs
        if wake_ms <= now_ms:
            continue  # due anyway
        start_ms = wake_ms - (seen - 1) * ms_per_job  # its last job's turn
        if wake_ms > horizon_ms:
            # beyond the cap: its turn comes once it is within the cap too (a later group's may
            # come first, and takes this one with it: the walk goes on)
            turn_ms = max(start_ms, wake_ms - cap_ms)
            if wake_ms - turn_ms >= min_lead_ms:
                next_ms = _earlier(next_ms, math.ceil(turn_ms))
            continue
        if start_ms <= now_ms:
            until_ms, next_ms = wake_ms, None  # this group and every one before it
        elif wake_ms - start_ms >= min_lead_ms:
            next_ms = _earlier(next_ms, math.ceil(start_ms))
    return Crowd(until_ms, next_ms, seen)


def _earlier(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)

"""The cyclic garbage collector's settings for a long-running role's process.

CPython runs its cyclic collector's youngest generation every 700 container allocations and a
full collection (every tracked object) whenever the long-lived objects grew by a quarter since
the last. A role allocates hundreds of objects a job, and keeps thousands of them a while (the
worker's held requests, the projector's batches, the scheduler's decoded states), so the
defaults ran a young collection every few jobs and full ones every few seconds: in `bench http
rate --rate 350` (2026-12-04, the Intel box) the projector spent ~1.1 s of 47 in 12
collections of 50-340 ms, each worker ~0.27 s in 7-8 of up to 220 ms, and every pause of a
worker's loop delayed the starts due in it (p99 start lateness 133 ms; the streaks of late starts
in the run's plot lined up with the workers' full collections). Reference counting frees
nearly everything here; cycles are rare.
"""

from __future__ import annotations

import gc

GENERATION0 = 50_000
"""Allocations between two collections of the youngest generation (CPython's default: 700)."""


def tune_collector() -> None:
    """Collect the youngest generation every ``GENERATION0`` allocations, and leave what the
    process made while starting (modules, classes, schemas, settings) out of every later
    collection: it lives as long as the process (``gc.freeze``, after one collection of the
    start-up's own garbage). Call it once the role's imports are done."""
    gc.set_threshold(GENERATION0, *gc.get_threshold()[1:])
    gc.collect()
    gc.freeze()

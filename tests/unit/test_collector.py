"""The collector's settings for a role's process (duetime/core/collector.py), in a process of
its own: a freeze in the test process would keep every test's garbage."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from duetime.core.collector import GENERATION0

PROBE = textwrap.dedent(
    """
    import gc, weakref
    from duetime.core.collector import tune_collector

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    before = cycle()  # start-up garbage: collected by the tune, not frozen
    kept = Node()  # start-up's live objects: frozen
    tune_collector()
    assert before() is None, "the start-up's garbage cycle survived"
    assert gc.get_freeze_count() > 0
    # frozen: in no generation any later collection walks (get_objects lists those)
    assert not any(o is kept for o in gc.get_objects()), "a start-up object was not frozen"
    assert gc.get_threshold()[0] == {generation0}, gc.get_threshold()
    after = cycle()  # a cycle made while serving: still collected
    gc.collect()
    assert after() is None, "a cycle made after the tune was not collected"
    print("ok")
    """
)


def test_the_tune_freezes_the_start_up_and_still_collects_what_comes_after() -> None:
    probe = PROBE.format(generation0=GENERATION0)
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr

"""A failed task's traceback as the worker reports it: bounded, innermost frames kept, redacted.

Property: whatever exception chain a task raises (causes, contexts, suppressed contexts, deep
distinct frames, hostile messages and ``__str__``), the traceback carried on the result is at
most 8 KiB of UTF-8, holds no credential written in a URL or a bearer header, keeps the final
exception line, and says how many frames it left out when it left any out.
"""

from __future__ import annotations

import re
import traceback
from typing import Any, NoReturn

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.worker.results import (
    MAX_TRACEBACK_BYTES,
    MAX_TRACEBACK_FRAMES,
    bound_traceback,
    contained,
    from_exception,
    task_traceback,
)
from duetime.core.errors import FailPermanently, RetryLater

_OMITTED_RE = re.compile(r"^\.\.\. (\d+) outer frames omitted \(the innermost are kept\) \.\.\.$")


def _ping(depth: int, message: str) -> NoReturn:
    if depth <= 0:
        raise ValueError(message)
    _pong(depth - 1, message)
    raise AssertionError("unreachable")


def _pong(depth: int, message: str) -> NoReturn:
    # alternating frames are not collapsed by "[Previous line repeated N more times]"
    if depth <= 0:
        raise KeyError(message)
    _ping(depth - 1, message)
    raise AssertionError("unreachable")


class _Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _raised(depth: int, message: str) -> BaseException:
    try:
        _ping(depth, message)
    except (ValueError, KeyError) as exc:
        return exc
    raise AssertionError("unreachable")


def _chain(links: list[tuple[int, str, str]]) -> BaseException:
    """Raise one exception per link, each while handling the previous one (its cause, its
    context, or a suppressed context); returns the last."""
    current: BaseException | None = None
    for depth, message, how in links:
        try:
            try:
                if current is not None:
                    raise current
            except BaseException as previous:
                if how == "cause":
                    raise _raised(depth, message) from previous
                if how == "suppress":
                    raise _raised(depth, message) from None
                if how == "hostile":
                    raise _Hostile(message) from previous
                raise _raised(depth, message)  # noqa: B904 -- the implicit context is the case
            raise _raised(depth, message)
        except BaseException as exc:
            current = exc
    assert current is not None
    return current


def _frames(text: str) -> int:
    return sum(1 for line in text.split("\n") if line.startswith('  File "'))


_SECRET = st.text(alphabet="abcdefghijkmnpqrstuvwxyz23456789", min_size=12, max_size=20).map(
    lambda s: "S3cr" + s
)
_NOISE = st.text(max_size=600)


@st.composite
def _messages(draw: st.DrawFn) -> tuple[str, str]:
    """(message, the secret it holds): credentials in a URL, a query value, a bearer header,
    between random text (which may be long, multi-line, control characters, any plane)."""
    secret = draw(_SECRET)
    where = draw(st.sampled_from(["userinfo", "query", "bearer", "basic"]))
    written = {
        "userinfo": f"https://svc:{secret}@api.example.com/v1",
        "query": f"http://api.example.com/hook?api_key={secret}&x=1",
        "bearer": f"Authorization: Bearer {secret}",
        "basic": f"Basic {secret}",
    }[where]
    return f"{draw(_NOISE)} {written} {draw(_NOISE)}", secret


@given(
    st.lists(
        st.tuples(
            st.integers(0, 120),
            _messages(),
            st.sampled_from(["cause", "context", "suppress", "hostile"]),
        ),
        min_size=1,
        max_size=6,
    )
)
@settings(max_examples=60, deadline=None)
def test_any_chain_is_bounded_redacted_and_keeps_the_innermost(
    links: list[tuple[int, tuple[str, str], str]],
) -> None:
    exc = _chain([(depth, message, how) for depth, (message, _), how in links])
    outcome = from_exception(exc)
    assert outcome.error is not None
    shown = outcome.error.traceback
    assert shown is not None
    assert len(shown.encode("utf-8")) <= MAX_TRACEBACK_BYTES
    for _, (_, secret), _ in links:
        assert secret not in shown
    # one line per line: no control character but the line breaks
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", shown)
    # the final exception is what is kept: its line follows the last frame shown
    last_frame = shown.rfind('\n  File "')
    assert f"{type(exc).__name__}: " in shown[last_frame:]
    full = "".join(traceback.TracebackException.from_exception(exc).format())
    first = shown.split("\n")[0]
    omitted = _OMITTED_RE.match(first)
    if len(full.encode("utf-8", "backslashreplace")) + 1 <= MAX_TRACEBACK_BYTES // 2:
        assert omitted is None  # a short traceback is whole
    if omitted is not None:
        assert int(omitted.group(1)) + _frames(shown) == _frames(full)


def test_a_deep_traceback_keeps_its_innermost_frames_and_counts_the_rest() -> None:
    exc = _raised(400, "the innermost error")
    shown = task_traceback(exc)
    assert shown is not None
    lines = shown.split("\n")
    assert len(shown.encode()) <= MAX_TRACEBACK_BYTES
    omitted = _OMITTED_RE.match(lines[0])
    assert omitted is not None
    full = "".join(traceback.format_exception(exc))
    assert int(omitted.group(1)) + _frames(shown) == _frames(full) == 402
    assert lines[-1] == "ValueError: the innermost error"  # depth 400 is even: _ping raises
    assert "in _pong" in lines[-3] or "in _ping" in lines[-3]
    # not just the last line: as many innermost frames as fit
    assert _frames(shown) > 50


def test_a_short_traceback_is_whole_and_names_the_raising_line() -> None:
    exc = _raised(0, "boom")
    shown = task_traceback(exc)
    assert shown is not None
    assert shown.startswith("Traceback (most recent call last):")
    assert "raise ValueError(message)" in shown
    assert shown.endswith("ValueError: boom")


def test_local_values_never_appear() -> None:
    def task() -> None:
        password = "hunter2-local-value"
        raise RuntimeError(f"failed for a user ({len(password)} chars)")

    try:
        task()
    except RuntimeError as exc:
        shown = task_traceback(exc)
    assert shown is not None and "RuntimeError: failed for a user (19 chars)" in shown
    assert "hunter2-local-value" not in shown


def test_one_huge_line_is_cut_and_the_whole_still_fits() -> None:
    shown = bound_traceback("Traceback (most recent call last):\nValueError: " + "x" * 100_000)
    assert len(shown.encode()) <= MAX_TRACEBACK_BYTES
    assert "[truncated: 100012 characters, limit 500]" in shown


def test_lone_surrogates_and_control_characters_are_escaped() -> None:
    shown = bound_traceback("ValueError: \ud800 and \x1b[31m red \x00 nul\r")
    shown.encode("utf-8")  # would raise on a lone surrogate
    assert "\\ud800" in shown and "\\x1b" in shown and "\\x00" in shown
    assert "\r" not in shown


def test_steering_and_contained_exceptions() -> None:
    later = from_exception(RetryLater("busy", delay_s=3))
    assert later.error is not None and later.error.traceback is None  # asked for, not a bug
    try:
        raise FailPermanently("no such customer")
    except FailPermanently as exc:
        permanent = from_exception(exc)
    assert permanent.error is not None and permanent.error.traceback is not None
    assert permanent.error.traceback.endswith("FailPermanently: no such customer")
    try:
        raise SystemExit(3)
    except SystemExit as exc:
        ended = contained(exc)
    assert ended.error is not None and ended.error.traceback is not None
    assert ended.error.traceback.endswith("SystemExit: 3")


def test_frames_beyond_the_format_limit_are_counted_even_when_the_rest_is_short() -> None:
    # 150 frames with no source line each (exec'd code): short, yet only 100 are formatted
    namespace: dict[str, Any] = {}
    exec(
        "def f(n):\n    if n == 0:\n        raise ValueError('x')\n    g(n - 1)\n"
        "def g(n):\n    f(n)\n",
        namespace,
    )
    try:
        namespace["f"](74)
    except ValueError as exc:
        shown = task_traceback(exc)
        full = "".join(traceback.format_exception(exc))
    assert shown is not None
    omitted = _OMITTED_RE.match(shown.split("\n")[0])
    assert omitted is not None, shown[:200]
    assert int(omitted.group(1)) + _frames(shown) == _frames(full)
    assert _frames(shown) == MAX_TRACEBACK_FRAMES

"""Python targets: the ``@duetime.task`` decorator, the :class:`TaskRegistry` and the context a
task receives.

Role: say which Python callables a worker may run and resolve a job's ``target.ref`` to one.

How a task becomes runnable (nothing is registered as a side effect of an import):

- ``registry = TaskRegistry()`` then ``@registry.task("send-invoice")`` registers on that
  registry, which the application passes to its worker explicitly
  (``Worker(settings, registry=registry)``).
- ``@duetime.task("send-invoice")`` only *marks* the function (it sets an attribute). A worker
  started with ``DUETIME_WORKER_IMPORTS=myapp.tasks,otherapp.jobs`` imports those modules at
  start and registers every marked function and every :class:`TaskRegistry` it finds there.
- A ``ref`` of the form ``package.module:function`` (or ``module:Class.method``) is imported
  on first use, whether registered or not, but only when the worker's operator allowed its
  module: it must be one of, or under, the module prefixes of
  ``DUETIME_WORKER_PYTHON_MODULES`` (comma list) or the modules of ``DUETIME_WORKER_IMPORTS``.
  The check comes *before* the import (importing runs a module's code). No segment of the
  ref may start with ``_`` (no private or dunder attribute is ever resolved), the path may
  not pass through another module (``allowed.mod:os.system``), and the callable must be
  defined in an allowed module (its ``__module__``). So ``sys:exit``, ``builtins:print`` or
  ``os:path.__class__`` resolve to nothing unless an operator listed ``sys``, ``builtins`` or
  ``os`` (and the last never). A plain name (no colon; hyphens allowed, ``"send-invoice"``)
  must be registered. Anything else is :class:`UnknownTarget`.

A task is called with one argument, an :class:`ExecutionContext`. A sync function runs in a
thread of its own (abandoned, not killed, when it times out or is cancelled: Python cannot
kill a thread; it sees ``ctx.cancelled`` set and should return); a coroutine function is
awaited on the worker's event loop and cancelled when it times out or is cancelled.
Its return value, if JSON-serialisable, becomes the result's ``output_json``. It steers its
outcome with :class:`~duetime.core.errors.RetryLater` (a retryable failure, optionally with
its own delay) and :class:`~duetime.core.errors.FailPermanently` (no more retries); any other
exception is a retryable failure. What is not an ``Exception`` (``SystemExit``,
``KeyboardInterrupt``, ``GeneratorExit``, a ``CancelledError`` the task raised itself) is
contained by the worker and fails the attempt permanently, naming the exception's type.
"""

from __future__ import annotations

import importlib
import inspect
import re
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from duetime.core.errors import PermanentError

__all__ = [
    "TASK_MARK",
    "ExecutionContext",
    "TaskRegistry",
    "UnknownTarget",
    "module_allowed",
    "ref_refusal",
    "task",
]

TASK_MARK = "__duetime_task__"
"""The attribute ``@duetime.task(name)`` sets on a function: the name it registers under."""

F = TypeVar("F", bound=Callable[..., Any])


class UnknownTarget(PermanentError):
    """A ``target.ref`` that names no registered task and imports nothing callable."""

    code = "unknown_target"


@dataclass(frozen=True)
class ExecutionContext:
    """What a Python task receives: which execution this is and its payload."""

    job_id: str
    execution_id: str
    """The idempotency key: the same for every attempt of this execution."""
    attempt: int
    scheduled_at: datetime
    payload: Any
    name: str = ""
    priority: str = "normal"
    trigger: str = "schedule"
    timeout_s: float = 300.0
    worker_id: str = ""
    dag_id: str | None = None
    dag_run_id: str | None = None
    dag_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    """Set when the worker stops waiting for this run: the execution was cancelled, timed out,
    lost its lease or the worker is shutting down. A sync task (which Python cannot stop from
    outside) should check ``ctx.cancelled.is_set()`` between steps, or wait on it instead of
    sleeping, and return: what it returns then is discarded."""


def task(name: str | None = None) -> Callable[[F], F]:
    """Mark a function as the task ``name`` (default: its qualified name).

    Marking registers nothing: a worker discovers marked functions in the modules listed in
    ``DUETIME_WORKER_IMPORTS``. Use :meth:`TaskRegistry.task` to register explicitly.
    """

    def mark(func: F) -> F:
        _check_name(name or func.__qualname__)
        setattr(func, TASK_MARK, name or func.__qualname__)
        return func

    return mark


def _check_name(name: str) -> None:
    if not name or ":" in name or not isinstance(name, str):
        raise ValueError(f"a task name must be a non-empty string without ':' (got {name!r})")


_REF_RE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")
_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


def module_allowed(module: str, allowed: Iterable[str]) -> bool:
    """``module`` is one of ``allowed`` or inside one of them (``a.b`` allows ``a.b.c``)."""
    return any(module == prefix or module.startswith(prefix + ".") for prefix in allowed)


def ref_refusal(ref: str, allowed: Iterable[str]) -> str | None:
    """Why ``package.module:attr.path`` may not be imported here (None: it may). Pure: it only
    reads the ref's text, so it runs before anything is imported."""
    match = _REF_RE.match(ref)
    if match is None:
        return f"target {ref[:200]!r} is not 'package.module:function'"
    module, attr_path = match.groups()
    segments = module.split(".") + attr_path.split(".")
    private = next((s for s in segments if s.startswith("_")), None)
    if private is not None:
        return f"target {ref!r} names {private!r}: private and dunder names are never resolved"
    allowed = tuple(allowed)
    if not module_allowed(module, allowed):
        listed = ", ".join(allowed) or "none"
        return (
            f"module {module!r} of target {ref!r} is not allowed on this worker "
            f"(DUETIME_WORKER_PYTHON_MODULES and DUETIME_WORKER_IMPORTS allow: {listed})"
        )
    return None


def check_module_prefixes(items: Iterable[str], variable: str) -> tuple[str, ...]:
    """Validate a list of module prefixes (a :class:`ValueError` names the bad one)."""
    out = tuple(items)
    for item in out:
        if not _MODULE_RE.match(item) or any(p.startswith("_") for p in item.split(".")):
            raise ValueError(f"{variable}: {item!r} is not a dotted module name")
    return out


class TaskRegistry:
    """Names → callables a worker may run. Build one, register on it, pass it to the worker.

    ``allowed_modules``: the module prefixes whose ``module:function`` refs may be imported
    (the worker passes ``DUETIME_WORKER_PYTHON_MODULES`` + ``DUETIME_WORKER_IMPORTS``); the
    default allows none, so only registered names resolve.
    """

    def __init__(self, allowed_modules: Iterable[str] = ()) -> None:
        self._tasks: dict[str, Callable[..., Any]] = {}
        self._imported: dict[str, Callable[..., Any]] = {}
        self.allowed_modules: tuple[str, ...] = tuple(allowed_modules)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def register(self, name: str, func: Callable[..., Any]) -> None:
        _check_name(name)
        if not callable(func):
            raise TypeError(f"task {name!r} is not callable")
        existing = self._tasks.get(name)
        if existing is not None and existing is not func:
            raise ValueError(f"task name {name!r} is already registered to {existing!r}")
        self._tasks[name] = func

    def task(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator: register the function on this registry (and mark it)."""

        def register(func: F) -> F:
            task_name = name or func.__qualname__
            task(task_name)(func)
            self.register(task_name, func)
            return func

        return register

    def update(self, other: TaskRegistry) -> None:
        for name, func in other._tasks.items():
            self.register(name, func)

    def discover(self, module_names: Iterable[str]) -> int:
        """Import ``module_names`` and register their marked functions and registries."""
        found = 0
        for module_name in module_names:
            module = importlib.import_module(module_name)
            found += self._scan(module)
        return found

    def _scan(self, module: types.ModuleType) -> int:
        found = 0
        for value in list(vars(module).values()):
            if isinstance(value, TaskRegistry) and value is not self:
                self.update(value)
                found += len(value)
            elif callable(value) and isinstance(getattr(value, TASK_MARK, None), str):
                self.register(getattr(value, TASK_MARK), value)
                found += 1
        return found

    def resolve(self, ref: str) -> Callable[..., Any]:
        """The callable for ``ref``: a registered name, or an allowed ``package.module:attr``.

        Raises :class:`UnknownTarget` (permanent) when nothing callable answers to ``ref`` here,
        or when the worker's operator did not allow it (see the module docstring).
        """
        func = self._tasks.get(ref) or self._imported.get(ref)
        if func is not None:
            return func
        if ":" not in ref:
            known = ", ".join(sorted(self._tasks)[:50]) or "none"
            raise UnknownTarget(
                f"no task named {ref[:200]!r} is registered on this worker (registered: {known})"
            )
        refusal = ref_refusal(ref, self.allowed_modules)
        if refusal is not None:
            raise UnknownTarget(refusal)
        module_name, _, attr_path = ref.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except BaseException as exc:  # an import runs user code: it can raise anything,
            # SystemExit included, and all of it means "cannot run this here"
            raise UnknownTarget(
                f"cannot import {module_name!r} for target {ref!r}: {type(exc).__name__}: {exc}"
            ) from None
        for part in attr_path.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise UnknownTarget(f"{module_name!r} has no attribute {attr_path!r}") from None
            except BaseException as exc:  # a module's __getattr__ is user code too
                raise UnknownTarget(
                    f"resolving {ref!r} raised {type(exc).__name__}: {exc}"
                ) from None
            if isinstance(obj, types.ModuleType):
                raise UnknownTarget(
                    f"target {ref!r} reaches the module {obj.__name__!r} through an attribute: "
                    "refer to an allowed module directly"
                )
        if not callable(obj):
            raise UnknownTarget(f"target {ref!r} is not callable")
        defined_in = getattr(obj, "__module__", None)
        if not isinstance(defined_in, str) or not module_allowed(defined_in, self.allowed_modules):
            raise UnknownTarget(
                f"target {ref!r} is defined in {defined_in!r}, which is not allowed on this "
                "worker (an imported name is not a task of the module that imports it)"
            )
        resolved: Callable[..., Any] = obj  # checked callable above
        self._imported[ref] = resolved
        return resolved


def is_async(func: Callable[..., Any]) -> bool:
    """True for coroutine functions (and callables whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - a callable object's async __call__
    )

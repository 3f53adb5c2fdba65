"""``@step(app)``: a plain Celery task whose result is checked to be JSON, as Ductor stores it.

A result that is not JSON fails the task with ``NotJSONSafe``, which is not retryable: the same
code would return the same value again."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from ductor_sdk.worker.failures import NonRetryable

if TYPE_CHECKING:
    from celery import Celery, Task

P = ParamSpec("P")
R = TypeVar("R")


class NotJSONSafe(NonRetryable, TypeError):
    """A ``@step`` task returned a value that is not JSON; its step fails for good."""


def _unsafe(value: Any, where: str, seen: set[int]) -> tuple[str, str] | None:
    """The first part of ``value`` that is not JSON, as ``(where, its type)``, or None."""
    if value is None or isinstance(value, str | bool):
        return None
    if isinstance(value, int):
        return None if _writable(value) else (where, "int (too many digits for JSON text)")
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, f"float ({value!r}: JSON has no such number)")
    if id(value) in seen:
        return (where, f"circular reference to a {type(value).__name__}")
    if isinstance(value, list | tuple):
        seen = seen | {id(value)}
        return next((found for i, item in enumerate(value) if (found := _unsafe(item, f"{where}[{i}]", seen))), None)
    if isinstance(value, dict):
        seen = seen | {id(value)}
        for key, item in value.items():
            if key is not None and not isinstance(key, str | int | float | bool):
                return (f"a key of {where}", type(key).__name__)
            if found := _unsafe(item, f"{where}[{key!r}]", seen):
                return found
        return None
    return (where, type(value).__name__)


def _writable(number: int) -> bool:
    """Whether ``number`` can be written as text: Python refuses a whole number of more digits than
    ``sys.get_int_max_str_digits()`` (4,300 by default), and Ductor's API takes no more either."""
    try:
        str(number)
    except ValueError:
        return False
    return True


def check_json_safe(value: Any, *, task: str) -> None:
    """Raises ``NotJSONSafe`` (a ``TypeError``) naming the task and the offending type unless ``value``
    dumps as strict JSON."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        where, kind = _unsafe(value, "result", set()) or ("result", type(value).__name__)
        raise NotJSONSafe(f"task {task!r} returned a value that is not JSON-safe: {where} is of type {kind}") from None


@overload
def step(
    app: Celery, name: str | None = None, *, bind: Literal[False] = False, **task_options: Any
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


@overload
def step(
    app: Celery, name: str | None = None, *, bind: Literal[True], **task_options: Any
) -> Callable[[Callable[Concatenate[Task[Any, Any], P], R]], Task[P, R]]: ...


def step(
    app: Celery, name: str | None = None, *, bind: bool = False, **task_options: Any
) -> Callable[[Callable[..., Any]], Task[Any, Any]]:
    """Make a function a task of ``app`` (``app.task(name=name, **task_options)``) whose return value
    must be JSON-safe. It is a plain Celery task: called outside Ductor it works the same. It is a
    task of ``app`` alone (``shared=False`` unless ``task_options`` says otherwise): Celery would
    otherwise add it to every app of the process, where another callable of the same name may be.

    Typed as ``Task[P, R]`` of the function (with Celery's types, ``celery-types``): a call, ``delay``
    or ``si`` with the wrong arguments is a type error, and the result has the function's return
    type. With ``bind=True`` the function's first parameter is the task, which callers do not pass."""

    def decorate(fun: Callable[..., Any]) -> Task[Any, Any]:
        @functools.wraps(fun)
        def run(*args: Any, **kwargs: Any) -> Any:
            result = fun(*args, **kwargs)
            check_json_safe(result, task=task.name)
            return result

        options = {"shared": False, **task_options, "bind": bind, **({"name": name} if name else {})}
        # Celery's types make every ``app.task`` a ``Task[Any, Any]``; the overloads above give it the signature.
        task: Task[Any, Any] = app.task(**options)(run)
        return task

    return decorate

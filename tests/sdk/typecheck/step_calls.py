"""Calls of ``@step`` tasks, checked by ``mypy --strict`` in ``tests/sdk/test_typing.py``: a line
marked ``# E: <code>`` must be reported with that error code, and every other line must be clean."""

from __future__ import annotations

from typing import Any, assert_type

from celery import Celery, Task
from celery.canvas import Signature
from celery.result import AsyncResult
from ductor_sdk.worker import step

app = Celery("typecheck")


@step(app, name="typecheck.add")
def add(a: int, b: int) -> int:
    return a + b


@step(app, name="typecheck.charge", acks_late=True)
def charge(order: str) -> dict[str, Any]:
    return {"order": order}


@step(app, bind=True)
def whoami(task: Task[Any, Any], times: int) -> str:
    return f"{task.name} x{times}"


assert_type(add(1, 2), int)
assert_type(add.delay(1, b=2), AsyncResult[int])
assert_type(add.si(1, 2), Signature[int])
assert_type(charge("order-1"), dict[str, Any])
assert_type(whoami(3), str)

add("x", 2)  # E: arg-type
add(1)  # E: call-arg
add(1, 2, 3)  # E: call-arg
add.delay(1, c=2)  # E: call-arg
add.si("x", 2)  # E: arg-type
total: str = add(1, 2)  # E: assignment
charge(42)  # E: arg-type
whoami("three")  # E: arg-type

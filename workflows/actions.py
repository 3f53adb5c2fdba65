"""The actions registry: what an ``action`` node of a workflow can run.

An action is a Python callable registered with ``@action("name")``. Modules
named in ``DUCTOR_ACTION_MODULES`` are imported at start-up, so their actions
register themselves. An action is called with an ``ActionCall``: its rendered
input, the connection chosen by routing (or None), the attempt number and an
idempotency key ``run_id:node_id:attempt``. It returns a JSON-serializable
output, or raises: ``RetryableActionError`` is retried by the step's retry
policy, anything else fails the step at once.

Steps run at least once: an action may run again after a worker crash, so
side effects should be keyed by the idempotency key.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from ductor_project.core.errors import StepErrorCode
from scheduling import http_action
from scheduling.action_errors import PermanentActionError, RetryableActionError

if TYPE_CHECKING:
    from scheduling.models import Connection


@dataclass(frozen=True)
class ActionCall:
    input: Any
    connection: Connection | None
    attempt: int
    idempotency_key: str


ActionFn = Callable[[ActionCall], Any]
_registry: dict[str, ActionFn] = {}


def action(name: str) -> Callable[[ActionFn], ActionFn]:
    """Register ``fn`` as the action ``name``. Names are unique; re-registering raises."""

    def register(fn: ActionFn) -> ActionFn:
        if name in _registry and _registry[name] is not fn:
            raise ValueError(f"action '{name}' is already registered")
        _registry[name] = fn
        return fn

    return register


def get_action(name: str) -> ActionFn:
    """The registered action, or ``KeyError``."""
    discover()
    return _registry[name]


def is_registered(name: str) -> bool:
    discover()
    return name in _registry


def registered_names() -> list[str]:
    discover()
    return sorted(_registry)


_discovered = False


def discover() -> None:
    """Import the modules of ``DUCTOR_ACTION_MODULES`` once per process."""
    global _discovered
    if _discovered:
        return
    for module in settings.DUCTOR_ACTION_MODULES:
        importlib.import_module(module)
    _discovered = True


# -- built-in actions -------------------------------------------------------------------------

@action("noop")
def noop(call: ActionCall) -> None:
    """Does nothing (benchmarks, placeholders)."""
    return None


@action("echo")
def echo(call: ActionCall) -> Any:
    """Returns its input unchanged."""
    return call.input


@action("sleep_ms")
def sleep_ms(call: ActionCall) -> dict[str, float]:
    """Sleeps ``input.ms`` milliseconds (at most 60 s), then returns them."""
    ms = call.input.get("ms", 0) if isinstance(call.input, dict) else 0
    if not isinstance(ms, int | float) or isinstance(ms, bool) or not 0 <= ms <= 60_000:
        raise PermanentActionError(
            "input.ms must be a number of milliseconds from 0 to 60000", code=StepErrorCode.INVALID_PARAMS
        )
    time.sleep(ms / 1000)
    return {"ms": ms}


@action("fail")
def fail(call: ActionCall) -> Any:
    """Fails on purpose (testing retries and error handling).

    Input: ``message`` (text), ``retryable`` (default true), and
    ``succeed_on_attempt``: from that attempt on it returns ``{"attempt": n}``.
    """
    params = call.input if isinstance(call.input, dict) else {}
    succeed_on = params.get("succeed_on_attempt")
    if isinstance(succeed_on, int) and call.attempt >= succeed_on:
        return {"attempt": call.attempt}
    message = str(params.get("message", "failed on purpose"))
    if params.get("retryable", True):
        raise RetryableActionError(message, code=StepErrorCode.ACTION_FAILED)
    raise PermanentActionError(message, code=StepErrorCode.ACTION_FAILED)


@action("http.request")
def http_request(call: ActionCall) -> Any:
    """An HTTP call through the routed connection (see ``scheduling.http_action``)."""
    params = call.input if isinstance(call.input, dict) else {}
    return http_action.http_request(params, call.connection, attempt=call.attempt, idempotency_key=call.idempotency_key)

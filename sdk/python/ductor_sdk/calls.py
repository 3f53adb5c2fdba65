"""Every endpoint of the API as a ``Call``: its path, its body and how its answer is read.

The one place that knows the server's URLs and bodies; the sync and the async
clients only send these. Optional arguments left as None are not sent, so the
server's defaults apply.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

from ductor_sdk import models
from ductor_sdk.errors import Conflict
from ductor_sdk.models import Model, Overlap, Page, Tier
from ductor_sdk.spec import same_spec
from ductor_sdk.transport import NO_BODY, Call, path
from ductor_sdk.workflow import Workflow

M = TypeVar("M", bound=Model)
N = TypeVar("N", bound=Model)


def compact(**values: Any) -> dict[str, Any]:
    """The values that are not None, datetimes as ISO 8601 (a query string or a body)."""
    return {key: _instant(key, value) if isinstance(value, datetime) else value
            for key, value in values.items() if value is not None}


def _instant(name: str, value: datetime) -> str:
    """``value`` in ISO 8601; one without a timezone (``datetime.now()``, the machine's local time) raises
    ``ValueError`` naming ``name``, as the server would read it as UTC."""
    if value.utcoffset() is None:
        raise ValueError(f"{name}: {value} has no timezone; give an aware time, such as datetime.now(UTC)")
    return value.isoformat()


def strings(name: str, values: Sequence[str] | None) -> list[str] | None:
    """``values`` as the list the API takes; a str alone, a ``Sequence[str]`` to a type checker that
    ``list`` splits into letters (``tags="web"``: 'w', 'e', 'b'), raises ``TypeError`` naming ``name``."""
    if isinstance(values, str):
        raise TypeError(f"{name} is a list of strings: {name}={[values]!r}")
    return None if values is None else list(values)


def list_params(**values: Any) -> dict[str, Any]:
    """A list's query string (``compact``): its ``cursor`` a bare cursor or a page's link."""
    params = compact(**values)
    if "cursor" in params:
        params["cursor"] = models.cursor_in(str(params["cursor"]))
    return params


def _nothing(_: Any) -> None:
    return None


def _many(model: type[M]) -> Callable[[Any], list[M]]:
    """A plain JSON array of ``model`` objects."""

    def parse(data: Any) -> list[M]:
        if not isinstance(data, list):
            raise models.UnexpectedAnswer(f"a list of {model.__name__} is a JSON array, and the answer held "
                                          f"{'nothing' if data is None else 'a JSON ' + type(data).__name__}")
        return [model.from_json(item) for item in data]

    return parse


def _page(model: type[M]) -> Callable[[Any], Page[M]]:
    """A page of ``model`` objects; a plain array reads as one last page."""

    def parse(data: Any) -> Page[M]:
        if isinstance(data, list):
            return Page(tuple(model.from_json(item) for item in data))
        return Page.from_json(data, model.from_json)

    return parse


class Collection(Generic[M]):
    """A collection of the API at ``name`` whose items are ``model`` objects, addressed by id,
    name or slug; its list is paginated."""

    def __init__(self, name: str, model: type[M]) -> None:
        self.name, self.model = name, model

    def list(self, **params: Any) -> Call[Page[M]]:
        return Call("GET", self.name, _page(self.model), params=list_params(**params))

    def get(self, key: str) -> Call[M]:
        return Call("GET", path(self.name, key), self.model.from_json)

    def create(self, body: Mapping[str, Any]) -> Call[M]:
        return Call("POST", self.name, self.model.from_json, body=dict(body))

    def create_as(self, body: Mapping[str, Any], model: type[N]) -> Call[N]:
        """A create answered with more than the item (a raw key shown once): read as ``model``."""
        return Call("POST", self.name, model.from_json, body=dict(body))

    def update(self, key: str, changes: Mapping[str, Any]) -> Call[M]:
        """PATCH: only the fields given change."""
        return Call("PATCH", path(self.name, key), self.model.from_json, body=dict(changes))

    def replace(self, key: str, body: Mapping[str, Any]) -> Call[M]:
        return Call("PUT", path(self.name, key), self.model.from_json, body=dict(body))

    def delete(self, key: str) -> Call[None]:
        return Call("DELETE", path(self.name, key), _nothing)

    def delete_answered(self, key: str) -> Call[M]:
        """A DELETE answered with the item (a tenant marked for deletion, ``202``)."""
        return Call("DELETE", path(self.name, key), self.model.from_json)

    def act(self, key: str, verb: str, body: Any = NO_BODY, *, idempotent: bool) -> Call[M]:
        """``POST <name>/<key>/<verb>``, answered with the item."""
        return Call("POST", path(self.name, key, verb), self.model.from_json, body=body, idempotent=idempotent)


API_KEYS = Collection("api-keys", models.ApiKey)
CONNECTIONS = Collection("connections", models.Connection)
POOLS = Collection("pools", models.Pool)
RULES = Collection("rules", models.Rule)
FAIRNESS_KEYS = Collection("fairness-keys", models.FairnessKey)
WORKFLOWS = Collection("workflows", models.WorkflowDefinition)
RUNS = Collection("runs", models.Run)
SCHEDULES = Collection("schedules", models.Schedule)
EVENTS = Collection("events", models.Event)
TRIGGERS = Collection("triggers", models.Trigger)
WEBHOOKS = Collection("webhooks", models.WebhookEndpoint)
TENANTS = Collection("tenants", models.Tenant)
TASKS = Collection("tasks", models.TaskEntry)
TASK_CATALOG = Collection("task-catalog", models.CatalogEntry)


def schedule_backfill(schedule_id: str, start: datetime, end: datetime) -> Call[models.ScheduleBackfill]:
    """``POST schedules/<id>/backfill``: idempotent, as each fire starts its run once."""
    return Call("POST", path("schedules", schedule_id, "backfill"), models.ScheduleBackfill.from_json,
                body=compact(start=start, end=end), idempotent=True)


def schedule_trigger(schedule_id: str) -> Call[models.Run]:
    """``POST schedules/<id>/trigger``: a run as a fire of this second."""
    return Call("POST", path("schedules", schedule_id, "trigger"), models.Run.from_json, idempotent=False)


def tenant_current() -> Call[models.Tenant]:
    return Call("GET", "tenant", models.Tenant.from_json)


def entitlements_current() -> Call[models.Entitlements]:
    return Call("GET", "entitlements", models.Entitlements.from_json)


def queue_current() -> Call[models.QueueStats]:
    return Call("GET", "queue", models.QueueStats.from_json)


def routing_explain(body: Mapping[str, Any]) -> Call[models.RoutingExplanation]:
    """The dry run changes nothing, so it may be sent again."""
    return Call("POST", "routing/explain", models.RoutingExplanation.from_json, body=dict(body), idempotent=True)


def member(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """A pool member: a connection's id or name, or ``{"connection", "weight", "priority"}``."""
    return {"connection": spec} if isinstance(spec, str) else dict(spec)


# --- runs ------------------------------------------------------------------------------------


def new_idempotency_key() -> str:
    """A fresh key: a start sent again with it (a retry) finds its run instead of starting another."""
    return f"sdk-{uuid.uuid4().hex}"


def run_request(
    workflow: str | Workflow, input: Any = None, *, idempotency_key: str | None = None,
    tags: Sequence[str] | None = None, tier: Tier | None = None, version: int | None = None,
    fairness_key: str | None = None,
) -> dict[str, Any]:
    """The body of a run start, with an idempotency key always (a new one when not given)."""
    name = workflow.name if isinstance(workflow, Workflow) else workflow
    return compact(workflow=name, version=version, input={} if input is None else input,
                   idempotency_key=idempotency_key or new_idempotency_key(), tier=tier,
                   tags=strings("tags", tags), fairness_key=fairness_key)


def run_start(body: Mapping[str, Any]) -> Call[models.Run]:
    """Idempotent through the body's ``idempotency_key``."""
    return Call("POST", "runs", models.Run.from_json, body=dict(body), idempotent=bool(body.get("idempotency_key")),
                tells_created=True)


def event_request(name: str, payload: Any = None, *, key: str | None = None,
                  idempotency_key: str | None = None) -> dict[str, Any]:
    """The body of one event, with an idempotency key always (a new one when not given): sent again, it
    is recorded once."""
    return compact(name=name, payload=payload, key=key, idempotency_key=idempotency_key or new_idempotency_key())


def events_send(body: Mapping[str, Any]) -> Call[models.Event]:
    return Call("POST", "events", models.Event.from_json, body=dict(body), idempotent=True)


def events_send_many(items: Sequence[Mapping[str, Any]]) -> Call[models.EventsSent]:
    events = [{**item, "idempotency_key": item.get("idempotency_key") or new_idempotency_key()} for item in items]
    return Call("POST", "events/bulk", models.EventsSent.from_json, body={"events": events}, idempotent=True)


def run_rerun(run_id: str, input: Any = None, *, idempotency_key: str | None = None) -> Call[models.Run]:
    """Idempotent through its key (a new one when not given), as a start is."""
    body = compact(input=input, idempotency_key=idempotency_key or new_idempotency_key())
    return dataclasses.replace(RUNS.act(run_id, "rerun", body, idempotent=True), tells_created=True)


def run_signal(run_id: str, name: str, payload: Any = None, *,
               idempotency_key: str | None = None) -> Call[models.Signal]:
    """Idempotent through its key (a new one when not given): sent again, it answers the first signal."""
    body = compact(name=name, payload=payload, idempotency_key=idempotency_key or new_idempotency_key())
    return Call("POST", path("runs", run_id, "signal"), models.Signal.from_json, body=body, idempotent=True)


def runs_start_many(items: Sequence[Mapping[str, Any]]) -> Call[models.BulkStarted]:
    """Every item gets an idempotency key (a new one when it has none), so the call may be sent again."""
    runs = [{**item, "idempotency_key": item.get("idempotency_key") or new_idempotency_key()} for item in items]
    return Call("POST", "runs/bulk", models.BulkStarted.from_json, body={"runs": runs}, idempotent=True)


def runs_cancel_many(*, ids: Sequence[str] | None = None, tags: Sequence[str] | None = None,
                     **filters: Any) -> Call[models.RunsCancelled]:
    """Safe to send again: a run already asked to stop is not asked (nor counted) twice."""
    body = compact(ids=strings("ids", ids) or None, tag=strings("tags", tags) or None, **filters)
    return Call("POST", "runs/cancel", models.RunsCancelled.from_json, body=body, idempotent=True)


def runs_retry_many(*, ids: Sequence[str] | None = None, tags: Sequence[str] | None = None,
                    **filters: Any) -> Call[models.RunsRetried]:
    """Not sent again on its own: a run that failed again after its retry would be retried again."""
    body = compact(ids=strings("ids", ids) or None, tag=strings("tags", tags) or None, **filters)
    return Call("POST", "runs/retry", models.RunsRetried.from_json, body=body, idempotent=False)


def run_list(*, tags: Sequence[str] | None = None, **filters: Any) -> Call[Page[models.Run]]:
    """The run list's call: ``tags`` as the repeated ``tag`` (the runs that have every one)."""
    return RUNS.list(tag=strings("tags", tags) or None, **filters)


def run_steps(run_id: str, **params: Any) -> Call[Page[models.Step]]:
    return Call("GET", path("runs", run_id, "steps"), _page(models.Step), params=list_params(**params))


# The most events one read of a run's history answers (the server's ``limit`` at most).
MAX_HISTORY_EVENTS = 1000


def run_events(run_id: str, *, after: int = 0, limit: int = MAX_HISTORY_EVENTS) -> Call[list[models.RunEvent]]:
    """The run's events after ``after`` (a ``seq``), ``limit`` at most: fewer means the history ends there."""
    return Call("GET", path("runs", run_id, "events"), _many(models.RunEvent), params={"after": after, "limit": limit})


def history_read_on(events: Sequence[models.RunEvent], limit: int) -> int | None:
    """Where a history read in answers of ``limit`` events goes on after the answer ``events``: the
    last one's ``seq``, or None when it was the last answer (it had fewer)."""
    return events[-1].seq if len(events) == limit else None


def run_lineage(run_id: str) -> Call[models.Lineage]:
    return Call("GET", path("runs", run_id, "lineage"), models.Lineage.from_json)


def run_why(run_id: str) -> Call[models.WhyWaiting]:
    return Call("GET", path("runs", run_id, "why"), models.WhyWaiting.from_json)


# --- schedules -------------------------------------------------------------------------------


def schedule_request(
    name: str, workflow: str | Workflow, *, cron: str | None = None, interval_s: int | None = None,
    timezone: str | None = None, input: Any = None, version: int | None = None, overlap: Overlap | None = None,
    catchup_window_s: int | None = None, jitter_s: float | None = None, paused: bool | None = None,
) -> dict[str, Any]:
    """The body of a schedule's create: ``cron`` or ``interval_s``, and the options given."""
    return compact(name=name, workflow=workflow.name if isinstance(workflow, Workflow) else workflow, cron=cron,
                   interval_s=interval_s, timezone=timezone, input=input, version=version, overlap=overlap,
                   catchup_window_s=catchup_window_s, jitter_s=jitter_s, paused=paused)


# --- webhooks --------------------------------------------------------------------------------


def webhook_rotate(webhook_id: str, grace_s: int | None = None) -> Call[models.WebhookEndpoint]:
    """Not idempotent: each call makes a new secret."""
    return WEBHOOKS.act(webhook_id, "rotate", compact(grace_s=grace_s), idempotent=False)


def webhook_deliveries(webhook_id: str, **params: Any) -> Call[Page[models.WebhookDelivery]]:
    return Call("GET", path("webhooks", webhook_id, "deliveries"), _page(models.WebhookDelivery),
                params=list_params(**params))


def webhook_delivery(webhook_id: str, delivery_id: str) -> Call[models.WebhookDelivery]:
    return Call("GET", path("webhooks", webhook_id, "deliveries", delivery_id), models.WebhookDelivery.from_json)


def webhook_redeliver(webhook_id: str, delivery_id: str) -> Call[models.WebhookDelivery]:
    """Not idempotent: each call sends the delivery again."""
    return Call("POST", path("webhooks", webhook_id, "deliveries", delivery_id, "redeliver"),
                models.WebhookDelivery.from_json, body=NO_BODY)


# --- workflows -------------------------------------------------------------------------------


def workflow_versions(name: str) -> Call[list[models.WorkflowVersion]]:
    return Call("GET", path("workflows", name, "versions"), _many(models.WorkflowVersion))


def workflow_apply(
    workflow: Workflow, stored: models.WorkflowDefinition | None
) -> tuple[Call[models.WorkflowDefinition] | None, models.ApplyOutcome]:
    """What ``apply`` sends, given the stored workflow (None: there is none), and its outcome:
    create it, add a version when its latest spec differs (``PUT`` adds one), change its description
    alone when only that differs (``PATCH``: no version; an empty one changes nothing), or nothing."""
    spec = workflow.to_spec()
    if stored is None:
        body = {"name": workflow.name, "spec": spec, "description": workflow.description, "if_version": 0}
        return WORKFLOWS.create(body), "created"
    if stored.spec is not None and same_spec(spec, stored.spec):
        if workflow.description and workflow.description != stored.description:
            return WORKFLOWS.update(workflow.name, {"description": workflow.description}), "described"
        return None, "unchanged"
    body = {"spec": spec, "description": workflow.description, "if_version": stored.latest_version}
    return WORKFLOWS.replace(workflow.name, body), "updated"


# How often ``apply`` reads the workflow again when another apply added a version first.
APPLY_TRIES = 5


def lost_to_another_apply(error: Conflict) -> bool:
    """Whether ``apply``'s create or new version was refused because the workflow moved on since it
    was read (``if_version``): another apply came first, and it reads the workflow again."""
    return error.field == "if_version"


# --- the platform ----------------------------------------------------------------------------


def tenant_overrides(slug: str) -> Call[list[models.Override]]:
    return Call("GET", path("tenants", slug, "overrides"), _many(models.Override))


def tenant_override_set(slug: str, field: str, value: Any, reason: str) -> Call[models.Override]:
    body = {"value": value, "reason": reason}
    return Call("PUT", path("tenants", slug, "overrides", field), models.Override.from_json, body=body)


def tenant_override_clear(slug: str, field: str) -> Call[None]:
    return Call("DELETE", path("tenants", slug, "overrides", field), _nothing)


def tenant_entitlements(slug: str) -> Call[models.Entitlements]:
    return Call("GET", path("tenants", slug, "entitlements"), models.Entitlements.from_json)


def plans() -> Call[list[models.Plan]]:
    return Call("GET", "plans", _many(models.Plan))


def plan(slug: str) -> Call[models.Plan]:
    return Call("GET", path("plans", slug), models.Plan.from_json)


def platform_queue() -> Call[list[models.ShardQueueStats]]:
    return Call("GET", "platform/queue", _many(models.ShardQueueStats))

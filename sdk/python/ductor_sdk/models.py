"""The API's objects as frozen dataclasses.

Each is read from the server's JSON by ``from_json``: known fields become
attributes (timestamps as ``datetime``, nested objects as models), a field the
server does not send keeps its default, and every field the SDK does not know
yet is tolerated and kept, with the rest, in ``raw``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, Generic, Literal, TypedDict, TypeVar
from urllib.parse import parse_qs, urlsplit

M = TypeVar("M", bound="Model")
T = TypeVar("T")

RunStatus = Literal["pending", "running", "waiting", "succeeded", "failed", "cancelled", "continued"]
StepStatus = Literal["scheduled", "queued", "running", "waiting", "succeeded", "failed", "skipped", "cancelled"]
TERMINAL_RUN_STATUSES: frozenset[RunStatus] = frozenset({"succeeded", "failed", "cancelled", "continued"})
# What ``workflows.apply`` did (``Applied.outcome``).
ApplyOutcome = Literal["created", "updated", "described", "unchanged"]
# A run's tier (the plan's ``allowed_tiers`` say which a tenant may use), and a schedule's overlap policy.
Tier = Literal["interactive", "standard", "batch"]
Overlap = Literal["skip", "buffer_one", "allow_all"]
# What a connection calls, how a pool picks among its members, what a key may do, what a webhook is sent.
ConnectionKind = Literal["http", "python", "celery"]
PoolStrategy = Literal["round_robin", "weighted", "least_inflight", "failover"]
Scope = Literal["read", "write"]
WebhookEventType = Literal["run.succeeded", "run.failed", "run.cancelled", "step.failed"]


class TaskException(TypedDict, total=False):
    """A task's exception (``task_failed``): its class's name and module."""

    type: str
    module: str


class StepError(TypedDict, total=False):
    """Why a step attempt failed (the API's ``StepError``). ``code`` is one of the step error codes
    (docs/workflows.md); an action's error adds ``status``, ``retry_after_s`` and ``details``, the
    engine's may add ``field``, ``exception`` or ``child_error``. A key the SDK does not know yet is
    kept too."""

    code: str
    message: str
    retryable: bool
    field: str
    status: int | None
    retry_after_s: float | None
    details: dict[str, Any]
    exception: TaskException
    child_error: RunError | None


class RunError(TypedDict, total=False):
    """Why a run failed (the API's ``RunError``): the step attempt that failed it (``node`` and
    ``attempt`` None when the run itself was refused, such as an output over the plan)."""

    node: str | None
    attempt: int | None
    error: StepError


def _identity(value: Any) -> Any:
    return value


def _timestamp(value: Any) -> Any:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


# Fields annotated ``datetime | None`` hold ISO 8601 times: read as aware datetimes.
_BY_ANNOTATION: Mapping[str, Callable[[Any], Any]] = {"datetime | None": _timestamp}


def many(model: type[Model]) -> Any:
    """A field holding a list of ``model`` objects, read as a tuple of them."""

    def parse(value: Any) -> Any:
        return tuple(model.from_json(item) for item in value) if isinstance(value, list) else ()

    return dataclasses.field(default=(), metadata={"parse": parse})


def one(model: type[Model]) -> Any:
    """A field holding one ``model`` object, or null (None)."""

    def parse(value: Any) -> Any:
        return model.from_json(value) if isinstance(value, Mapping) else None

    return dataclasses.field(default=None, metadata={"parse": parse})


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def tupled() -> Any:
    """A field holding a JSON list, read as a tuple of its items."""
    return dataclasses.field(default=(), metadata={"parse": _as_tuple})


def _as_timestamps(value: Any) -> Any:
    return tuple(_timestamp(item) for item in value) if isinstance(value, list) else value


def timestamps() -> Any:
    """A field holding a JSON list of ISO 8601 times, read as a tuple of aware datetimes."""
    return dataclasses.field(default=(), metadata={"parse": _as_timestamps})


class UnexpectedAnswer(TypeError):
    """An answer that holds something else than the JSON a call reads (an object, a list): not Ductor's."""


def _kind(data: Any) -> str:
    return "nothing" if data is None else f"a JSON {type(data).__name__}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Model:
    """Base of every API object; ``raw`` is the JSON object it was read from."""

    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls: type[M], data: Mapping[str, Any]) -> M:
        """The model of ``data``; fields it lacks keep their defaults, fields the model lacks stay in ``raw``.
        Raises ``UnexpectedAnswer`` when ``data`` is not a JSON object (an empty answer, a list, a string)."""
        if not isinstance(data, Mapping):
            raise UnexpectedAnswer(f"a {cls.__name__} is a JSON object, and the answer held {_kind(data)}")
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name != "raw" and field.name in data:
                parse: Callable[[Any], Any] = field.metadata.get("parse") or _BY_ANNOTATION.get(
                    str(field.type), _identity
                )
                values[field.name] = parse(data[field.name])
        return cls(**values, raw=data)


# --- tenancy ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tenant(Model):
    id: str = ""
    slug: str = ""
    name: str = ""
    status: str = ""
    plan: str = ""
    created_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TenantCreated(Tenant):
    """A tenant just created; ``api_key`` (shown once) only with ``create_api_key``."""

    api_key: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan(Model):
    slug: str = ""
    name: str = ""
    max_concurrency: int = 0
    step_rate_per_s: float = 0.0
    step_burst: int = 0
    monthly_run_quota: int = 0
    max_workflows: int = 0
    max_pools: int = 0
    max_connections: int = 0
    max_rules: int = 0
    max_schedules: int = 0
    max_fairness_keys: int = 0
    max_nesting_depth: int = 0
    max_payload_bytes: int = 0
    event_retention_days: int = 0
    history_retention_days: int = 0
    api_rate_per_s: float = 0.0
    api_burst: int = 0
    weight: int = 1
    allowed_tiers: tuple[str, ...] = tupled()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Override(Model):
    """A per-tenant override of one plan limit."""

    field: str = ""
    value: Any = None
    reason: str = ""
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entitlements(Model):
    """Effective limits (plan plus overrides; ``limits["overridden"]`` names them), usage and reset times."""

    tenant: str = ""
    limits: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    usage: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    resets: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApiKey(Model):
    id: str = ""
    name: str = ""
    display: str = ""
    scopes: tuple[str, ...] = tupled()
    state: str = ""
    created_at: datetime | None = None
    last_used_at: datetime | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApiKeyCreated(ApiKey):
    """A key just created: ``api_key`` is the raw key, shown this once."""

    api_key: str = ""


# --- routing ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Connection(Model):
    """A connection; its secret is write-only (``has_secret`` says whether one is set)."""

    id: str = ""
    name: str = ""
    kind: str = ""
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    has_secret: bool = False
    max_concurrency: int | None = None
    rate_per_s: float | None = None
    burst: int | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolMember(Model):
    connection: str = ""
    connection_name: str = ""
    weight: int = 1
    priority: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pool(Model):
    id: str = ""
    name: str = ""
    strategy: str = ""
    is_default: bool = False
    max_concurrency: int | None = None
    rate_per_s: float | None = None
    burst: int | None = None
    members: tuple[PoolMember, ...] = many(PoolMember)
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule(Model):
    id: str = ""
    name: str = ""
    priority: int = 0
    enabled: bool = True
    match: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    action: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class FairnessKey(Model):
    """The weight of one of the tenant's fairness keys (a key with none weighs 1)."""

    id: str = ""
    key: str = ""
    weight: int = 1
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoutingExplanation(Model):
    """The routing dry run: the decision, and how admission would treat the step now."""

    allowed: bool = False
    reason: str = ""
    rule: Any = None
    tier: str = ""
    partition_key: str | None = None
    # The rule's rendered fairness-key template; None: the run's own key applies.
    fairness_key: str | None = None
    pool: Mapping[str, Any] | None = None
    candidates: tuple[Mapping[str, Any], ...] = tupled()
    connection: Mapping[str, Any] | None = None
    admission: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueueStats(Model):
    """The tenant's own fair-queue backlog, per tier (``tiers``) and in total."""

    tiers: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    backlog: int = 0
    due: int = 0
    in_flight: int = 0
    oldest_waiting_ms: int = 0
    # Its share of worker time over the last minute beside its weight-fair share, and its keys'
    # (``work["keys"]``: key, weight, work_ms, share, fair_share).
    work: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardQueueStats(Model):
    """The platform's view of one queue shard: per tier its ready and blocked tenants and virtual time
    (``tiers``), its timers, items in flight and expired leases, the live worker slots and busy credits
    per Celery queue, the tenants that did the most work over the last minute (``work_shares``: tenant_id,
    weight, work_ms, share, fair_share; most first), and the live dispatchers that serve it (none: its
    due items wait)."""

    shard: int = 0
    tiers: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    timers: int = 0
    in_flight: int = 0
    expired_leases: int = 0
    worker_slots: Mapping[str, int] = dataclasses.field(default_factory=dict)
    busy: Mapping[str, int] = dataclasses.field(default_factory=dict)
    work_shares: tuple[Mapping[str, Any], ...] = tupled()
    dispatchers: tuple[str, ...] = tupled()


# How a task node's input reaches the task: as its keyword arguments, or as its one positional argument.
TaskArguments = Literal["kwargs", "single"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskEntry(Model):
    """A Celery task a ``task`` node of this tenant may call, as the task catalog lists it.

    ``arguments``: ``kwargs`` (the input object as keyword arguments) or ``single`` (the input as
    one positional argument); ``input_schema``: the JSON Schema the rendered input must match.
    """

    name: str = ""
    description: str = ""
    queue: str = ""
    arguments: TaskArguments = "kwargs"
    input_schema: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    timeout_s: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CatalogEntry(TaskEntry):
    """A task catalog entry as the platform manages it: who may call it (``plans``, ``tenants``;
    no plans: every plan) and whether it is ``enabled``."""

    plans: tuple[str, ...] = tupled()
    tenants: tuple[str, ...] = tupled()
    enabled: bool = True
    created_at: datetime | None = None
    updated_at: datetime | None = None


# --- schedules -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event(Model):
    """An event the tenant sent; ``runs``: the ids of the runs it started; ``refused``: the triggers
    that started nothing for it because their workflow's ``input_schema`` refused it, each
    ``{"trigger", "workflow", "details"}``."""

    id: str = ""
    name: str = ""
    key: str = ""
    payload: Any = None
    idempotency_key: str | None = None
    runs: tuple[str, ...] = tupled()
    refused: tuple[Mapping[str, Any], ...] = tupled()
    created_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class EventsSent(Model):
    """A bulk send: ``created`` events recorded now, and one event per item sent, in order."""

    created: int = 0
    events: tuple[Event, ...] = many(Event)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trigger(Model):
    """A workflow subscribed to the events named ``event`` that meet ``filter``."""

    id: str = ""
    workflow: str = ""
    event: str = ""
    filter: Mapping[str, Any] | None = None
    enabled: bool = True
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule(Model):
    """A schedule: runs of ``workflow`` started at the fire times of ``cron`` (read in ``timezone``) or
    every ``interval_s`` seconds. Fire times are nominal, in UTC. ``next_fires`` (the next ones) comes
    with a single schedule, not with a list of them; both are empty while it is ``paused``."""

    id: str = ""
    name: str = ""
    workflow: str = ""
    version: int | None = None
    input: Any = None
    cron: str = ""
    interval_s: int | None = None
    timezone: str = "UTC"
    overlap: str = "skip"
    catchup_window_s: int = 60
    jitter_s: float = 0.0
    paused: bool = False
    next_fire_at: datetime | None = None
    next_fires: tuple[datetime, ...] = timestamps()
    buffered_fire_at: datetime | None = None
    last_fire_at: datetime | None = None
    last_run_id: str | None = None
    fired_count: int = 0
    skipped_count: int = 0
    missed_count: int = 0
    failed_count: int = 0
    last_missed_at: datetime | None = None
    last_error: Mapping[str, Any] | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackfilledFire(Model):
    """One fire time of a backfill: its run (``created`` False: it had one already), or why its start
    was refused (``error``, ``run_id`` None)."""

    fire_at: datetime | None = None
    run_id: str | None = None
    created: bool = False
    error: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleBackfill(Model):
    """What ``schedules.backfill`` did: each fire time of the span, in order, and how many runs
    started, how many fires had theirs already, and how many starts were refused."""

    fires: tuple[BackfilledFire, ...] = many(BackfilledFire)
    started: int = 0
    existing: int = 0
    refused: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebhookEndpoint(Model):
    """An endpoint told of the tenant's runs' outcomes (``events``). ``secret`` is set only in the answer
    of its create and of a rotation: keep it, to check each delivery's signature (``ductor_sdk.webhooks``)."""

    id: str = ""
    url: str = ""
    description: str = ""
    events: tuple[str, ...] = tupled()
    workflows: tuple[str, ...] = tupled()
    enabled: bool = True
    disabled_reason: str = ""
    disabled_at: datetime | None = None
    consecutive_failures: int = 0
    previous_secret_expires_at: datetime | None = None
    secret: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebhookDelivery(Model):
    """One message to one endpoint: ``pending``, ``delivered`` or ``failed``, with each attempt (``at``,
    ``status_code``, ``error``, ``duration_ms``, ``response``) in ``attempts``. ``body`` comes with a single
    delivery, not with a list of them."""

    id: str = ""
    endpoint: str = ""
    run: str | None = None
    type: str = ""
    status: str = ""
    attempts: tuple[Mapping[str, Any], ...] = tupled()
    next_attempt_at: datetime | None = None
    body: Mapping[str, Any] | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None


# --- workflows and runs ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkflowVersion(Model):
    number: int = 0
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    created_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkflowDefinition(Model):
    """A workflow as the server stores it; ``spec`` is its latest version's, normalized."""

    id: str = ""
    name: str = ""
    description: str = ""
    latest_version: int = 0
    spec: Mapping[str, Any] | None = None
    archived_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclasses.dataclass(frozen=True)
class Applied:
    """What ``workflows.apply`` did: ``created``, ``updated`` (a new version), ``described`` (its
    description alone changed, no version) or ``unchanged``."""

    workflow: WorkflowDefinition
    outcome: ApplyOutcome

    @property
    def version(self) -> int:
        return self.workflow.latest_version


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step(Model):
    """One attempt of a node."""

    id: str = ""
    node_id: str = ""
    node_type: str = ""
    attempt: int = 1
    status: StepStatus = "queued"
    input: Any = None
    output: Any = None
    error: StepError | None = None
    routing: Mapping[str, Any] | None = None
    child_run: str | None = None
    created_at: datetime | None = None
    scheduled_for: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    heartbeat_details: Any = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run(Model):
    """A run. Read by id it also carries its first steps (``steps``, ``steps_truncated``)."""

    id: str = ""
    workflow_name: str = ""
    version: int = 0
    status: RunStatus = "pending"
    input: Any = None
    output: Any = None
    error: RunError | None = None
    idempotency_key: str | None = None
    tier: str = ""
    tags: tuple[str, ...] = tupled()
    fairness_key: str = ""
    parent_run: str | None = None
    parent_node_id: str | None = None
    root_run_id: str | None = None
    nesting_depth: int = 0
    continued_from: str | None = None
    continued_as: str | None = None  # the run it continued as new as (status ``continued``)
    rerun_of: str | None = None
    cancel_requested: bool = False
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    steps: tuple[Step, ...] = many(Step)
    steps_total: int | None = None
    steps_truncated: bool = False
    steps_url: str | None = None
    # Told by ``runs.start`` and ``runs.rerun`` only (None elsewhere): True when this call created the
    # run; False when its idempotency key had started it before (the input sent then is the run's).
    created: bool | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether the run has ended: succeeded, failed, cancelled, or continued as a new run."""
        return self.status in TERMINAL_RUN_STATUSES


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunEvent(Model):
    seq: int = 0
    type: str = ""
    node_id: str = ""
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    created_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SignalDelivery(Model):
    """The waiting step a signal resumed."""

    step_id: str = ""
    node_id: str = ""
    attempt: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Signal(Model):
    """A signal sent to a run; ``delivered_to`` is the wait it resumed, None while it is kept for one."""

    id: str = ""
    run: str = ""
    name: str = ""
    payload: Any = None
    idempotency_key: str | None = None
    delivered_to: SignalDelivery | None = one(SignalDelivery)  # noqa: RUF009 - a dataclasses.field
    created_at: datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BulkItem(Model):
    id: str = ""
    idempotency_key: str | None = None
    status: str = ""
    created: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class BulkStarted(Model):
    """A bulk start: ``created`` runs started now, and one item per run asked for, in order."""

    created: int = 0
    runs: tuple[BulkItem, ...] = many(BulkItem)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunsCancelled(Model):
    """A cancel of many runs: the ``runs`` (ids, oldest first) asked to stop by this call, and whether
    ``more`` active runs match (call again for them)."""

    cancelled: int = 0
    runs: tuple[str, ...] = tupled()
    more: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunsRetried(Model):
    """A retry of many runs: the failed ``runs`` (ids, oldest first) this call retried, and whether
    ``more`` failed runs match (call again for them)."""

    retried: int = 0
    runs: tuple[str, ...] = tupled()
    more: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Waiting(Model):
    """One waiting step (or the run's tick: ``node_id`` ""), and what holds it now: ``cause`` is one
    of not_due, partition, tenant_concurrency, rate_limited, pool_full, connection_full, queue_full,
    breaker_open, suspended, quota_exhausted, child_run, event, dispatching, task_published, in_line,
    lost."""

    node_id: str = ""
    attempt: int = 0
    step_id: str = ""
    status: str = ""
    cause: str = ""
    message: str = ""
    until: datetime | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WhyWaiting(Model):
    """``GET /runs/{id}/why``: what holds each waiting step of a run."""

    run_id: str = ""
    status: str = ""
    waiting: tuple[Waiting, ...] = many(Waiting)


class LineageNode(TypedDict):
    """A run of a lineage tree: its sub-workflow runs (``children``), and the run it continued as
    (``successor``, ContinueAsNew), each a node of its own. Times are ISO 8601 text."""

    id: str
    workflow_name: str
    status: RunStatus
    parent_run_id: str | None
    continued_from_id: str | None
    nesting_depth: int
    created_at: str
    children: list[LineageNode]
    successor: LineageNode | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lineage(Model):
    """The tree of a run's root: ``tree`` nodes hold ``children`` and a ``successor``. ``runs``
    counts its runs; ``truncated``: the tree holds only the first of them, so many levels deep
    (``runs.list(root_run_id=...)`` lists them all)."""

    root_run_id: str = ""
    runs: int = 0
    truncated: bool = False
    tree: tuple[LineageNode, ...] = tupled()


# --- pages -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a cursor-paginated list; ``next`` is the link to the following page, or None, and
    ``next_cursor`` its cursor, what a list's ``cursor=`` takes (it takes the link as well)."""

    items: tuple[T, ...]
    next: str | None = None
    previous: str | None = None

    @property
    def next_cursor(self) -> str | None:
        return cursor_in(self.next)

    @property
    def previous_cursor(self) -> str | None:
        return cursor_in(self.previous)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], item: Callable[[Mapping[str, Any]], T]) -> Page[T]:
        if not isinstance(data, Mapping):
            raise UnexpectedAnswer(f"a page is a JSON object, and the answer held {_kind(data)}")
        return cls(tuple(item(row) for row in data.get("results", [])), data.get("next"), data.get("previous"))


def cursor_in(value: str | None) -> str | None:
    """The cursor of a page's link (``https://…/runs?cursor=…``), or ``value`` itself when it is a
    bare cursor already; None for no page."""
    if value is None or "?" not in value:
        return value
    return parse_qs(urlsplit(value).query).get("cursor", [None])[0]

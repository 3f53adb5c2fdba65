"""Workflow definitions (immutable numbered versions), runs, step attempts, run events and schedules."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models

from scheduling.models import MAX_FAIRNESS_KEY
from tenants.scoping import TenantScopedModel, tenant_field


class WorkflowDefinition(TenantScopedModel):
    """A named workflow of a tenant. Its specs live in numbered, immutable versions.

    An archived one (``archived_at`` set) starts no new run and takes no new version, and does not
    count toward the plan's ``max_workflows``; its runs in flight go on, and it keeps its name,
    versions and history until it is unarchived or deleted (``workflows.services``).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    description = models.CharField(max_length=500, blank=True, default="")
    latest_version = models.PositiveIntegerField(default=0)
    archived_at = models.DateTimeField(null=True, blank=True, help_text="When it was archived; none: active.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="workflow_unique_name")]

    def __str__(self) -> str:
        return self.name


class WorkflowVersion(TenantScopedModel):
    """One immutable version of a definition's spec. Runs keep the version they started on."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    definition = models.ForeignKey(WorkflowDefinition, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["definition", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["definition", "number"], name="workflowversion_unique_number")
        ]

    def __str__(self) -> str:
        return f"{self.definition_id} v{self.number}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ValueError("workflow versions are immutable; create a new version")
        super().save(*args, **kwargs)


class WorkflowRun(TenantScopedModel):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        WAITING = "waiting"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        CONTINUED = "continued"

    TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.CONTINUED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of the tenant alone: each of the tenant's indexes below leads with it.
    tenant = tenant_field(db_index=False)
    workflow = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="runs")
    workflow_name = models.CharField(max_length=100)
    # Indexed by ``run_status`` (the admin's filter over every tenant), a plain btree: a status is
    # never matched by a pattern, so it has no ``LIKE`` index to write too.
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    input = models.JSONField(default=dict, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # NULL, not "", when absent: the per-tenant unique constraint only covers real keys.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    tier = models.CharField(max_length=16, default="standard")
    tags = models.JSONField(default=list, blank=True)
    parent_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    parent_node_id = models.CharField(max_length=63, blank=True, default="")
    root_run_id = models.UUIDField(db_index=True)
    nesting_depth = models.PositiveIntegerField(default=0)
    continued_from = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="successor"
    )
    rerun_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reruns",
        help_text="The run this one is a rerun of (POST /runs/{id}/rerun).",
    )
    cancel_requested = models.BooleanField(default=False)
    # Its fairness key inside the tenant (docs/fair-queue.md#two-levels): its ticks and steps share the
    # tenant's dispatches with the other keys' by weight; "" for none. Its children and successor keep it.
    fairness_key = models.CharField(max_length=MAX_FAIRNESS_KEY, blank=True, default="")
    lock_version = models.PositiveIntegerField(default=0, help_text="Optimistic lock, bumped by each tick.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="run_unique_idempotency_key",
            )
        ]
        indexes = [
            models.Index(fields=["status"], name="run_status"),
            models.Index(fields=["tenant", "status", "-created_at"], name="run_tenant_status"),
            # The run list: a tenant's runs newest first, a page at a time (the API's cursor order).
            models.Index(fields=["tenant", "-created_at", "-id"], name="run_tenant_newest"),
            # The reconciler's pass: the active runs (not TERMINAL), a few among millions. Not keyed on
            # updated_at, which every tick changes: an update that keeps the status can still be HOT.
            models.Index(fields=["created_at"], name="run_active",
                         condition=~models.Q(status__in=["cancelled", "continued", "failed", "succeeded"])),
            # The retention's pass: the roots of the tenant's run trees, by when they ended.
            models.Index(fields=["tenant", "finished_at", "id"], name="run_tenant_root_finished",
                         condition=models.Q(parent_run__isnull=True, continued_from__isnull=True)),
            # The run list's filter by fairness key, over the runs that have one only (the others'
            # inserts pay for no entry). Tags have no index: see migration 0012.
            models.Index(fields=["tenant", "fairness_key", "-created_at", "-id"], name="run_tenant_fairness_key",
                         condition=~models.Q(fairness_key="")),
            # The run list's filter by workflow (and the cancel and retry of many runs by it): a tenant's
            # runs of one workflow, newest first. Without it, a workflow with few runs among the tenant's
            # many was found by reading every run of the table. Its columns never change after the insert.
            models.Index(fields=["tenant", "workflow_name", "-created_at", "-id"], name="run_tenant_workflow"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name} {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL


class StepRun(TenantScopedModel):
    """One attempt of one node of a run."""

    class Status(models.TextChoices):
        SCHEDULED = "scheduled"  # waiting for a timer (sleep, retry backoff)
        QUEUED = "queued"  # in the fair queue
        RUNNING = "running"
        WAITING = "waiting"  # waiting for a child run
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        SKIPPED = "skipped"
        CANCELLED = "cancelled"

    TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.SKIPPED, Status.CANCELLED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = tenant_field(db_index=False)  # an attempt is found by its id or its run
    # No index of its own: ``steprun_unique_attempt`` leads with it (one index less to write per attempt).
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps", db_index=False)
    node_id = models.CharField(max_length=63)
    node_type = models.CharField(max_length=24)
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=16, choices=Status.choices)
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    routing = models.JSONField(null=True, blank=True, help_text="The routing decision trace.")
    child_run = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="parent_steps"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    scheduled_for = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A task node's heartbeats (``ductor_sdk.worker.heartbeat``): when the last one came, and the
    # progress it reported, which the node's next attempt is given to resume from.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeat_details = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "node_id", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["run", "node_id", "attempt"], name="steprun_unique_attempt")
        ]

    def __str__(self) -> str:
        return f"{self.node_id}#{self.attempt} ({self.status})"


class RunEvent(TenantScopedModel):
    """The ordered, append-only history of a run."""

    tenant = tenant_field(db_index=False)  # an event is found by its run
    # No index of its own: ``runevent_unique_seq`` leads with it (one index less to write per event).
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=40)
    node_id = models.CharField(max_length=63, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runevent_unique_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ValueError("run events are append-only")
        super().save(*args, **kwargs)


class TaskCatalogEntry(models.Model):
    """A Celery task of the team's own that tenants may call as a ``task`` node.

    Platform data, not a tenant's: the platform decides what may be called, on
    which queue by default, with what input, and by whom (``workflows.catalog``).
    """

    class Arguments(models.TextChoices):
        KWARGS = "kwargs", "the input object as keyword arguments"
        SINGLE = "single", "the input as one positional argument"

    name = models.CharField(max_length=200, unique=True, help_text="The Celery task name, e.g. billing.tasks.charge.")
    description = models.CharField(max_length=500, blank=True, default="")
    queue = models.CharField(
        max_length=200, blank=True, default="",
        help_text="Where the task goes when the step's routing chose no celery connection.",
    )
    arguments = models.CharField(max_length=8, choices=Arguments.choices, default=Arguments.KWARGS)
    input_schema = models.JSONField(default=dict, blank=True, help_text="A JSON Schema the rendered input must match.")
    timeout_s = models.FloatField(null=True, blank=True, help_text="The step's timeout when its node sets none.")
    plans = models.JSONField(default=list, blank=True, help_text="Plan names that may call it; empty: every plan.")
    tenants = models.JSONField(
        default=list, blank=True, help_text="Slugs of tenants that may call it besides those plans.",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "task catalog entry"
        verbose_name_plural = "task catalog"

    def __str__(self) -> str:
        return self.name

    def allows(self, *, plan: str, slug: str) -> bool:
        """Whether a tenant of ``plan`` with ``slug`` may call this task."""
        if not self.enabled:
            return False
        if not self.plans and not self.tenants:
            return True
        return plan in self.plans or slug in self.tenants


class Schedule(TenantScopedModel):
    """A tenant's schedule: runs of a workflow started at the fire times of a cron expression (in a
    time zone) or of an interval, by coordinator wake-ups (``workflows.triggers``).

    ``next_fire_at`` is the next nominal fire time not yet handled, and ``wake_at`` when the
    schedule is looked at next: that fire plus its jitter, or sooner while a fire is buffered
    (both null while paused). PostgreSQL holds them: a lost wake-up is put back from them.
    """

    class Overlap(models.TextChoices):
        SKIP = "skip", "skip a fire while a run it started is active"
        BUFFER_ONE = "buffer_one", "keep one fire until the active run ends"
        ALLOW_ALL = "allow_all", "start every fire"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    workflow = models.CharField(max_length=100, help_text="The name of the workflow whose runs it starts.")
    version = models.PositiveIntegerField(null=True, blank=True, help_text="Its version; none: the latest.")
    input = models.JSONField(default=dict, blank=True)
    cron = models.CharField(max_length=200, blank=True, default="")
    interval_s = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC", help_text="The IANA time zone of the cron fields.")
    overlap = models.CharField(max_length=16, choices=Overlap.choices, default=Overlap.SKIP)
    catchup_window_s = models.PositiveIntegerField(
        default=60, help_text="How late a fire may still start; an older one is missed.")
    jitter_s = models.FloatField(default=0.0, help_text="Each fire starts up to this much after its time.")
    paused = models.BooleanField(default=False)
    next_fire_at = models.DateTimeField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    buffered_fire_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True, help_text="The fire time of the last run started.")
    last_run_id = models.UUIDField(null=True, blank=True, help_text="The last run it started (not a foreign key: "
                                   "the run's retention is its own).")
    fired_count = models.PositiveBigIntegerField(default=0, help_text="Fires that started a run.")
    skipped_count = models.PositiveBigIntegerField(default=0, help_text="Fires the overlap policy skipped.")
    missed_count = models.PositiveBigIntegerField(
        default=0, help_text="Fires past the catch-up window, or while the tenant was suspended.")
    failed_count = models.PositiveBigIntegerField(default=0, help_text="Fires whose run start was refused.")
    last_missed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.JSONField(null=True, blank=True, help_text="Why the last refused start was refused.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="schedule_unique_name"),
            models.CheckConstraint(
                condition=(models.Q(cron="") & models.Q(interval_s__isnull=False))
                | (~models.Q(cron="") & models.Q(interval_s__isnull=True)),
                name="schedule_cron_or_interval",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "wake_at"], condition=models.Q(paused=False), name="schedule_tenant_wake"),
            models.Index(fields=["wake_at"], condition=models.Q(paused=False), name="schedule_wake"),
        ]

    def __str__(self) -> str:
        return self.name


class Event(TenantScopedModel):
    """Something that happened, as a tenant reports it (``POST /api/v1/events``): it starts a run of
    each of the tenant's workflows with a matching ``EventTrigger`` (``workflows.triggers.events``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of the tenant alone: each of the tenant's indexes below leads with it.
    tenant = tenant_field(db_index=False)
    name = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="",
                           help_text="What the event is about (an order id): a correlation key, optional.")
    payload = models.JSONField(default=dict, blank=True)
    # NULL, not "", when absent: the per-tenant unique constraint only covers real keys.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    runs = models.JSONField(default=list, blank=True, help_text="The ids of the runs it started.")
    refused = models.JSONField(default=list, blank=True,
                               help_text="The triggers that started nothing for it because their workflow's "
                                         "input_schema refused it: {trigger, workflow, details}.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "idempotency_key"],
                                    condition=models.Q(idempotency_key__isnull=False), name="event_unique_key"),
        ]
        indexes = [models.Index(fields=["tenant", "name", "-created_at"], name="event_tenant_name"),
                   models.Index(fields=["tenant", "created_at"], name="event_tenant_age"),  # the retention
                   # The admin's list of every tenant's events, newest first: without it, each page
                   # sorted the whole table.
                   models.Index(fields=["-created_at", "-id"], name="event_newest")]

    def __str__(self) -> str:
        return f"{self.name} {self.id}"


class EventTrigger(TenantScopedModel):
    """A workflow's subscription to an event name: each event of that name whose ``filter`` (a
    condition of the one language, on ``event.name``, ``event.key`` and ``event.payload…``)
    holds starts a run of the workflow's latest version, the event as its input."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.ForeignKey(WorkflowDefinition, on_delete=models.CASCADE, related_name="triggers")
    event = models.CharField(max_length=200, help_text="The name of the events it starts runs for.")
    filter = models.JSONField(null=True, blank=True, help_text="A condition the event must meet; none: every one.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["event", "created_at"]
        indexes = [models.Index(fields=["tenant", "event"], name="trigger_tenant_event")]

    def __str__(self) -> str:
        return f"{self.event} -> {self.workflow_id}"


class RunSignal(TenantScopedModel):
    """A named payload sent to one run (``POST /api/v1/runs/{id}/signal``): it resumes the run's
    ``wait_for_event`` step waiting for that name, or, while none waits, is kept until one does
    (``workflows.triggers.waits``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    # NULL, not "", when absent: the per-run unique constraint only covers real keys.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    delivered_to = models.ForeignKey(StepRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                     help_text="The wait it resumed; none: kept until a wait takes it.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["run", "idempotency_key"],
                                    condition=models.Q(idempotency_key__isnull=False), name="signal_unique_key"),
        ]
        indexes = [models.Index(fields=["run", "name"], condition=models.Q(delivered_to__isnull=True),
                                name="signal_kept")]

    def __str__(self) -> str:
        return f"{self.name} -> {self.run_id}"


class EventWait(TenantScopedModel):
    """A ``wait_for_event`` attempt waiting: the index an event finds it by (its name and
    correlation key), or a signal (its run and name). Whatever resumes it first sets ``matched_at``
    with the payload (one conditional ``UPDATE``: a timeout, an event and a signal never both win);
    the run's next tick finishes the step with it. ``expires_at`` is the step's timeout, and
    ``armed_at`` when the events that came before it was written were looked through
    (``workflows.engine.waits.arm``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="+")
    step = models.OneToOneField(StepRun, on_delete=models.CASCADE, related_name="+")
    event = models.CharField(max_length=200, help_text="The name of the event (or signal) it waits for.")
    key = models.CharField(max_length=200, blank=True, default="", help_text="The correlation key it waits for.")
    lookback_s = models.FloatField(default=0.0, help_text="It also takes an event this much older than itself.")
    expires_at = models.DateTimeField(null=True, blank=True)
    armed_at = models.DateTimeField(null=True, blank=True)
    matched_at = models.DateTimeField(null=True, blank=True)
    matched_by = models.JSONField(null=True, blank=True, help_text='What resumed it: {"event": id} or {"signal": id}.')
    payload = models.JSONField(null=True, blank=True, help_text="The payload that resumed it: the step's output.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["tenant", "event", "key"], condition=models.Q(matched_at__isnull=True),
                                name="eventwait_open")]

    def __str__(self) -> str:
        return f"{self.event}:{self.key} <- {self.step_id}"


class WebhookEndpoint(TenantScopedModel):
    """A tenant's subscription of an HTTPS endpoint to its runs' outcomes: each signed delivery is a
    fair-queue item under the tenant (``workflows.triggers.webhooks``). The secret is stored
    encrypted; after a rotation the previous one still signs until ``previous_secret_expires_at``.
    A deleted one (``deleted_at``) is disabled and found by nothing of the tenant's until the purge
    has removed its deliveries, then its row (``webhook_delivery.purge_deleted_endpoints``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True, default="")
    events = models.JSONField(default=list, help_text='What it receives: "run.succeeded", "run.failed", '
                              '"run.cancelled", "step.failed".')
    workflows = models.JSONField(default=list, blank=True, help_text="Only these workflows' runs; empty: all.")
    secret = models.TextField(help_text="The signing secret, encrypted.")
    previous_secret = models.TextField(blank=True, default="", help_text="The secret before the last rotation, "
                                       "encrypted.")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=500, blank=True, default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0, help_text="Failed attempts since the last "
                                                       "delivered one.")
    deleted_at = models.DateTimeField(null=True, blank=True, help_text="When it was deleted: gone for the tenant, "
                                      "its row and delivery log left to the purge of deleted endpoints.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["tenant"], condition=models.Q(enabled=True), name="webhook_enabled"),
                   models.Index(fields=["deleted_at"], condition=models.Q(deleted_at__isnull=False),
                                name="webhook_deleted")]

    def __str__(self) -> str:
        return self.url


class WebhookDelivery(TenantScopedModel):
    """One message to one endpoint and its attempts (the delivery log): ``pending`` until an attempt
    is answered 2xx (``delivered``) or the attempts run out (``failed``)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of the tenant alone: ``delivery_endpoint`` leads with it.
    tenant = tenant_field(db_index=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    run = models.ForeignKey(WorkflowRun, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    type = models.CharField(max_length=32)
    body = models.JSONField(help_text="The JSON sent.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.JSONField(default=list, blank=True,
                                help_text="Each attempt: at, status_code, error, duration_ms.")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "endpoint", "-created_at"], name="delivery_endpoint"),
                   models.Index(fields=["status", "next_attempt_at"], condition=models.Q(status="pending"),
                                name="delivery_pending"),
                   # The admin's list of every tenant's deliveries, newest first: without it, each page
                   # sorted the whole table.
                   models.Index(fields=["-created_at", "-id"], name="delivery_newest")]

    def __str__(self) -> str:
        return f"{self.type} -> {self.endpoint_id} ({self.status})"

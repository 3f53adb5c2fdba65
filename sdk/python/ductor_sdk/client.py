"""The synchronous client: ``Client(base_url, api_key)`` and its resources.

Every method sends one call of ``ductor_sdk.calls`` (``iter`` and ``wait``
send as many as they need). ``ductor_sdk.aio`` is the same API, awaited.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import httpx

from ductor_sdk import calls, models
from ductor_sdk.errors import Conflict, DuctorError, NotFound
from ductor_sdk.models import ConnectionKind, Overlap, Page, PoolStrategy, RunStatus, Scope, Tier, WebhookEventType
from ductor_sdk.transport import Call, Config, RetryPolicy, RunWait, SyncSender
from ductor_sdk.workflow import Workflow

T = TypeVar("T")


class _Resource:
    def __init__(self, sender: SyncSender) -> None:
        self._sender = sender

    def _send(self, call: Call[T]) -> T:
        return self._sender.send(call)

    def _iterate(self, call: Call[Page[T]]) -> Iterator[T]:
        """Every item of the list ``call`` asks for, page after page (following ``next``)."""
        while True:
            page = self._send(call)
            yield from page.items
            if page.next is None:
                return
            call = call.following(page.next)


class TenantResource(_Resource):
    def get(self) -> models.Tenant:
        """The tenant the API key acts for."""
        return self._send(calls.tenant_current())


class EntitlementsResource(_Resource):
    def get(self) -> models.Entitlements:
        """The effective limits (plan and overrides), the usage and the reset times."""
        return self._send(calls.entitlements_current())


class ApiKeys(_Resource):
    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.ApiKey]:
        return self._send(calls.API_KEYS.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.ApiKey]:
        return self._iterate(calls.API_KEYS.list(page_size=page_size))

    def get(self, key_id: str) -> models.ApiKey:
        return self._send(calls.API_KEYS.get(key_id))

    def create(
        self, name: str, *, scopes: Sequence[Scope] | None = None, expires_at: datetime | None = None
    ) -> models.ApiKeyCreated:
        """A new key; its raw ``api_key`` is in this answer only."""
        body = calls.compact(name=name, scopes=calls.strings("scopes", scopes), expires_at=expires_at)
        return self._send(calls.API_KEYS.create_as(body, models.ApiKeyCreated))

    def revoke(self, key_id: str) -> models.ApiKey:
        """Revoke a key (idempotent; the row is kept)."""
        return self._send(calls.API_KEYS.act(key_id, "revoke", idempotent=True))


class Connections(_Resource):
    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.Connection]:
        return self._send(calls.CONNECTIONS.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.Connection]:
        return self._iterate(calls.CONNECTIONS.list(page_size=page_size))

    def get(self, connection_id: str) -> models.Connection:
        return self._send(calls.CONNECTIONS.get(connection_id))

    def create(
        self, name: str, kind: ConnectionKind, *, config: Mapping[str, Any] | None = None, secret: str | None = None,
        max_concurrency: int | None = None, rate_per_s: float | None = None, burst: int | None = None,
    ) -> models.Connection:
        body = calls.compact(name=name, kind=kind, config=config, secret=secret, max_concurrency=max_concurrency,
                             rate_per_s=rate_per_s, burst=burst)
        return self._send(calls.CONNECTIONS.create(body))

    def update(self, connection_id: str, **changes: Any) -> models.Connection:
        """Change the fields given (PATCH); None clears a limit."""
        return self._send(calls.CONNECTIONS.update(connection_id, changes))

    def delete(self, connection_id: str) -> None:
        self._send(calls.CONNECTIONS.delete(connection_id))

    def rotate_secret(self, connection_id: str, secret: str) -> models.Connection:
        call = calls.CONNECTIONS.act(connection_id, "rotate-secret", {"secret": secret}, idempotent=True)
        return self._send(call)


class Pools(_Resource):
    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.Pool]:
        return self._send(calls.POOLS.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.Pool]:
        return self._iterate(calls.POOLS.list(page_size=page_size))

    def get(self, pool_id: str) -> models.Pool:
        return self._send(calls.POOLS.get(pool_id))

    def create(
        self, name: str, *, members: Sequence[Mapping[str, Any] | str] = (), strategy: PoolStrategy | None = None,
        is_default: bool | None = None, max_concurrency: int | None = None, rate_per_s: float | None = None,
        burst: int | None = None,
    ) -> models.Pool:
        """A pool; each member is a connection's id or name, or ``{"connection", "weight", "priority"}``."""
        body = calls.compact(name=name, members=[calls.member(m) for m in members], strategy=strategy,
                             is_default=is_default, max_concurrency=max_concurrency, rate_per_s=rate_per_s,
                             burst=burst)
        return self._send(calls.POOLS.create(body))

    def update(self, pool_id: str, **changes: Any) -> models.Pool:
        """Change the fields given (PATCH); ``members`` given replaces them all."""
        if "members" in changes:
            changes["members"] = [calls.member(m) for m in changes["members"]]
        return self._send(calls.POOLS.update(pool_id, changes))

    def delete(self, pool_id: str) -> None:
        self._send(calls.POOLS.delete(pool_id))


class Rules(_Resource):
    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.Rule]:
        return self._send(calls.RULES.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.Rule]:
        return self._iterate(calls.RULES.list(page_size=page_size))

    def get(self, rule_id: str) -> models.Rule:
        return self._send(calls.RULES.get(rule_id))

    def create(
        self, name: str, *, priority: int, action: Mapping[str, Any], match: Mapping[str, Any] | None = None,
        enabled: bool | None = None,
    ) -> models.Rule:
        body = calls.compact(name=name, priority=priority, action=action, match=match, enabled=enabled)
        return self._send(calls.RULES.create(body))

    def update(self, rule_id: str, **changes: Any) -> models.Rule:
        """Change the fields given (PATCH)."""
        return self._send(calls.RULES.update(rule_id, changes))

    def delete(self, rule_id: str) -> None:
        self._send(calls.RULES.delete(rule_id))


class FairnessKeys(_Resource):
    """The weights of the tenant's fairness keys: backlogged keys share its dispatches by weight."""

    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.FairnessKey]:
        return self._send(calls.FAIRNESS_KEYS.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.FairnessKey]:
        return self._iterate(calls.FAIRNESS_KEYS.list(page_size=page_size))

    def get(self, fairness_key_id: str) -> models.FairnessKey:
        return self._send(calls.FAIRNESS_KEYS.get(fairness_key_id))

    def create(self, key: str, *, weight: int) -> models.FairnessKey:
        """Give ``key`` a weight (others weigh 1)."""
        return self._send(calls.FAIRNESS_KEYS.create({"key": key, "weight": weight}))

    def update(self, fairness_key_id: str, *, weight: int) -> models.FairnessKey:
        return self._send(calls.FAIRNESS_KEYS.update(fairness_key_id, {"weight": weight}))

    def delete(self, fairness_key_id: str) -> None:
        """The key weighs 1 again."""
        self._send(calls.FAIRNESS_KEYS.delete(fairness_key_id))


class Routing(_Resource):
    def explain(
        self, workflow: str, action: str, *, tags: Sequence[str] | None = None, input: Any = None,
        tier: Tier | None = None, pool: str | None = None,
    ) -> models.RoutingExplanation:
        """How a step would be routed and admitted now; takes no capacity and writes nothing."""
        body = calls.compact(workflow=workflow, action=action, tags=calls.strings("tags", tags),
                             input=input, tier=tier, pool=pool)
        return self._send(calls.routing_explain(body))


class Workflows(_Resource):
    def list(
        self, *, archived: bool = False, page_size: int | None = None, cursor: str | None = None
    ) -> Page[models.WorkflowDefinition]:
        """The active workflows by name; ``archived=True``: the archived ones."""
        return self._send(calls.WORKFLOWS.list(archived=archived or None, page_size=page_size, cursor=cursor))

    def iter(self, *, archived: bool = False, page_size: int | None = None) -> Iterator[models.WorkflowDefinition]:
        return self._iterate(calls.WORKFLOWS.list(archived=archived or None, page_size=page_size))

    def get(self, name: str) -> models.WorkflowDefinition:
        return self._send(calls.WORKFLOWS.get(name))

    def create(
        self, name: str, spec: Mapping[str, Any], *, description: str = "", if_version: int | None = None
    ) -> models.WorkflowDefinition:
        """Create the workflow, or add a version to it when the name exists (what the server does). With
        ``if_version`` (the latest version you read; 0: none yet), only while that is still the latest,
        else ``Conflict`` naming ``if_version`` and nothing is added."""
        body = calls.compact(name=name, spec=spec, description=description, if_version=if_version)
        return self._send(calls.WORKFLOWS.create(body))

    def update(
        self, name: str, spec: Mapping[str, Any], *, description: str = "", if_version: int | None = None
    ) -> models.WorkflowDefinition:
        """Add a version (always, even with the same spec); with ``if_version``, only while that is
        still the latest, else ``Conflict`` naming ``if_version``."""
        body = calls.compact(spec=spec, description=description, if_version=if_version)
        return self._send(calls.WORKFLOWS.replace(name, body))

    def describe(self, name: str, description: str) -> models.WorkflowDefinition:
        """Change its description alone, archived or not; no new version."""
        return self._send(calls.WORKFLOWS.update(name, {"description": description}))

    def versions(self, name: str) -> builtins.list[models.WorkflowVersion]:
        """Every version, newest first."""
        return self._send(calls.workflow_versions(name))

    def archive(self, name: str) -> models.WorkflowDefinition:
        """Retire it: it starts no new run (a start raises ``Conflict``) and takes no new version, and it
        leaves the plan's ``max_workflows`` count; its runs in flight go on. Idempotent."""
        return self._send(calls.WORKFLOWS.act(name, "archive", idempotent=True))

    def unarchive(self, name: str) -> models.WorkflowDefinition:
        """Make it active again (``PermissionDenied``, code ``plan_limit_reached``, when the plan has no
        room for it). Idempotent."""
        return self._send(calls.WORKFLOWS.act(name, "unarchive", idempotent=True))

    def delete(self, name: str) -> None:
        """Delete it with its versions, triggers and schedules; only while it has no run (``Conflict`` otherwise:
        archive it instead)."""
        self._send(calls.WORKFLOWS.delete(name))

    def apply(self, workflow: Workflow) -> models.Applied:
        """Make the server hold ``workflow``: create it, add a version if its spec changed, else nothing.

        When only its (non-empty) description differs, that alone changes, with no new version
        (``described``). Its create or new version names the version it read (``if_version``): when
        another apply added one first (a service's replicas applying as they start), it reads the
        workflow again and compares anew, so concurrent applies of one change add one version.
        """
        for tries_left in reversed(range(calls.APPLY_TRIES)):
            try:
                stored: models.WorkflowDefinition | None = self.get(workflow.name)
            except NotFound:
                stored = None
            call, outcome = calls.workflow_apply(workflow, stored)
            if call is None:
                assert stored is not None
                return models.Applied(stored, outcome)
            try:
                return models.Applied(self._send(call), outcome)
            except Conflict as lost:
                if not tries_left or not calls.lost_to_another_apply(lost):
                    raise
        raise AssertionError("unreachable: the last try returns or raises")


class Runs(_Resource):
    def list(
        self, *, status: RunStatus | None = None, workflow: str | None = None, created_after: datetime | None = None,
        created_before: datetime | None = None, root_run_id: str | None = None,
        tags: Sequence[str] | None = None, fairness_key: str | None = None, page_size: int | None = None,
        cursor: str | None = None,
    ) -> Page[models.Run]:
        """One page of runs, newest first, filtered (``tags``: those that have every one)."""
        return self._send(calls.run_list(status=status, workflow=workflow, created_after=created_after,
                                         created_before=created_before, root_run_id=root_run_id, tags=tags,
                                         fairness_key=fairness_key, page_size=page_size, cursor=cursor))

    def iter(
        self, *, status: RunStatus | None = None, workflow: str | None = None, created_after: datetime | None = None,
        created_before: datetime | None = None, root_run_id: str | None = None,
        tags: Sequence[str] | None = None, fairness_key: str | None = None, page_size: int | None = None,
    ) -> Iterator[models.Run]:
        """Every run that matches, newest first, across pages."""
        return self._iterate(calls.run_list(status=status, workflow=workflow, created_after=created_after,
                                            created_before=created_before, root_run_id=root_run_id, tags=tags,
                                            fairness_key=fairness_key, page_size=page_size))

    def get(self, run_id: str) -> models.Run:
        """A run, with its first steps."""
        return self._send(calls.RUNS.get(run_id))

    def start(
        self, workflow: str | Workflow, input: Any = None, *, idempotency_key: str | None = None,
        tags: Sequence[str] | None = None, tier: Tier | None = None, version: int | None = None,
        fairness_key: str | None = None,
    ) -> models.Run:
        """Start a run (of the latest version unless ``version``). Idempotent: with a key already
        used, the run of that key is returned; without one a key is made, so a retry never starts twice.
        ``fairness_key`` puts its work under that key of your tenant's (your own customer's id, say):
        your backlogged keys share your capacity by weight."""
        body = calls.run_request(workflow, input, idempotency_key=idempotency_key, tags=tags, tier=tier,
                                 version=version, fairness_key=fairness_key)
        return self._send(calls.run_start(body))

    def start_many(self, runs: Sequence[Mapping[str, Any]]) -> models.BulkStarted:
        """Start 1 to 500 runs, all or none; each item takes ``start``'s fields (``workflow``, ``input``,
        ``idempotency_key``, ``tags``, ``tier``, ``version``, ``fairness_key``) and gets a key when it has none."""
        return self._send(calls.runs_start_many(runs))

    def wait(
        self, run_id: str, *, timeout: float = 60.0, poll_interval: float = 0.5, follow: bool = True
    ) -> models.Run:
        """Poll until the run is terminal and return it; ``WaitTimeout`` (a ``TimeoutError``) after ``timeout`` s.
        A run that continued as new (ContinueAsNew) is followed to the run that carries its work on, to the
        end of its chain, whose end is returned; ``follow=False`` returns the run that continued. An outage
        of the API (no answer, 429 ``rate_limited``, 502/503/504) is polled through until ``timeout``, then
        raised; any other error is raised at once."""
        waiting = RunWait(run_id, timeout=timeout, poll_interval=poll_interval, follow=follow)
        while True:
            try:
                run = self.get(waiting.run_id)
            except DuctorError as error:  # a passing outage (Ductor restarting) is waited through
                time.sleep(waiting.failed(error))
                continue
            answer = waiting.polled(run)
            if isinstance(answer, models.Run):
                return answer
            time.sleep(answer)

    def cancel(self, run_id: str) -> models.Run:
        """Ask the run (and the children it waits for) to stop. Idempotent. For a run that continued as new,
        the last run of its chain is asked, and returned."""
        return self._send(calls.RUNS.act(run_id, "cancel", idempotent=True))

    def cancel_many(
        self, *, ids: Sequence[str] | None = None, workflow: str | None = None, tags: Sequence[str] | None = None,
        fairness_key: str | None = None, created_after: datetime | None = None,
        created_before: datetime | None = None, root_run_id: str | None = None, limit: int | None = None,
    ) -> models.RunsCancelled:
        """Ask the active runs that match (``ids`` and the filters: at least one) to stop, as ``cancel``
        does each: up to ``limit`` (500) a call, oldest first; ``more`` tells of the rest. Idempotent."""
        return self._send(calls.runs_cancel_many(ids=ids, workflow=workflow, tags=tags, fairness_key=fairness_key,
                                                 created_after=created_after, created_before=created_before,
                                                 root_run_id=root_run_id, limit=limit))

    def retry(self, run_id: str) -> models.Run:
        """Resume a failed run where it failed: its failed (and cancelled) nodes run again, then the nodes
        that never ran; what succeeded is kept. ``Conflict`` for a run that has not failed, or a child run."""
        return self._send(calls.RUNS.act(run_id, "retry", idempotent=False))

    def retry_many(
        self, *, ids: Sequence[str] | None = None, workflow: str | None = None, tags: Sequence[str] | None = None,
        fairness_key: str | None = None, created_after: datetime | None = None,
        created_before: datetime | None = None, root_run_id: str | None = None, limit: int | None = None,
    ) -> models.RunsRetried:
        """Retry the failed runs that match (``ids`` and the filters: at least one), each as ``retry`` does:
        up to ``limit`` (100; 500 at most) a call, oldest first; ``more`` tells of the rest. A child run is
        not taken: retrying its root starts it again."""
        return self._send(calls.runs_retry_many(ids=ids, workflow=workflow, tags=tags, fairness_key=fairness_key,
                                                created_after=created_after, created_before=created_before,
                                                root_run_id=root_run_id, limit=limit))

    def rerun(self, run_id: str, input: Any = None, *, idempotency_key: str | None = None) -> models.Run:
        """Start a new run of the run's version with its input (or ``input``); its ``rerun_of`` names it.
        Idempotent: without a key one is made, so a retried call never starts two."""
        return self._send(calls.run_rerun(run_id, input, idempotency_key=idempotency_key))

    def signal(self, run_id: str, name: str, payload: Any = None, *,
               idempotency_key: str | None = None) -> models.Signal:
        """Send ``name`` with ``payload`` to the run: it resumes the run's ``wait_for_event`` node waiting for
        that name (its output is ``payload``), or is kept until one waits. ``Conflict`` for a run that ended."""
        return self._send(calls.run_signal(run_id, name, payload, idempotency_key=idempotency_key))

    def events(self, run_id: str, *, after: int = 0,
               page_size: int = calls.MAX_HISTORY_EVENTS) -> builtins.list[models.RunEvent]:
        """The run's history, in order, after the event ``after`` (a ``seq``; 0: all of it). The server
        answers 1,000 events at most at a time: this reads ``page_size`` at a time until the end."""
        found: builtins.list[models.RunEvent] = []
        read_on: int | None = after
        while read_on is not None:
            events = self._send(calls.run_events(run_id, after=read_on, limit=page_size))
            found += events
            read_on = calls.history_read_on(events, page_size)
        return found

    def steps(self, run_id: str, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.Step]:
        """One page of the run's step attempts, oldest first."""
        return self._send(calls.run_steps(run_id, page_size=page_size, cursor=cursor))

    def iter_steps(self, run_id: str, *, page_size: int | None = None) -> Iterator[models.Step]:
        """Every step attempt of the run, oldest first, across pages."""
        return self._iterate(calls.run_steps(run_id, page_size=page_size))

    def lineage(self, run_id: str) -> models.Lineage:
        """The tree of the run's root: children and ContinueAsNew successors."""
        return self._send(calls.run_lineage(run_id))

    def why(self, run_id: str) -> models.WhyWaiting:
        """Why is it waiting? What holds each waiting step of the run now (read only)."""
        return self._send(calls.run_why(run_id))


class Schedules(_Resource):
    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.Schedule]:
        """One page of the tenant's schedules, by name."""
        return self._send(calls.SCHEDULES.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.Schedule]:
        return self._iterate(calls.SCHEDULES.list(page_size=page_size))

    def get(self, schedule_id: str) -> models.Schedule:
        """A schedule, with its next fire times (``next_fires``)."""
        return self._send(calls.SCHEDULES.get(schedule_id))

    def create(
        self, name: str, workflow: str | Workflow, *, cron: str | None = None, interval_s: int | None = None,
        timezone: str | None = None, input: Any = None, version: int | None = None, overlap: Overlap | None = None,
        catchup_window_s: int | None = None, jitter_s: float | None = None, paused: bool | None = None,
    ) -> models.Schedule:
        """A schedule starting runs of ``workflow`` with ``input``: at the fire times of ``cron`` (5 fields,
        or 6 with seconds first, read in ``timezone``) or every ``interval_s`` seconds. ``overlap``:
        ``skip`` (the default), ``buffer_one`` or ``allow_all``."""
        body = calls.schedule_request(name, workflow, cron=cron, interval_s=interval_s, timezone=timezone,
                                      input=input, version=version, overlap=overlap,
                                      catchup_window_s=catchup_window_s, jitter_s=jitter_s, paused=paused)
        return self._send(calls.SCHEDULES.create(body))

    def update(self, schedule_id: str, **changes: Any) -> models.Schedule:
        """Change the fields given (PATCH); a new ``cron`` or ``interval_s`` replaces the other and fires from now."""
        return self._send(calls.SCHEDULES.update(schedule_id, changes))

    def delete(self, schedule_id: str) -> None:
        """Delete it; the runs it started are kept."""
        self._send(calls.SCHEDULES.delete(schedule_id))

    def pause(self, schedule_id: str) -> models.Schedule:
        """Nothing fires until it resumes. Idempotent."""
        return self._send(calls.SCHEDULES.act(schedule_id, "pause", idempotent=True))

    def resume(self, schedule_id: str) -> models.Schedule:
        """It fires again from the first fire time after now (the pause is not caught up). Idempotent."""
        return self._send(calls.SCHEDULES.act(schedule_id, "resume", idempotent=True))

    def backfill(self, schedule_id: str, start: datetime, end: datetime) -> models.ScheduleBackfill:
        """Start the run of each fire time from ``start`` to ``end`` (both included, none in the future, at
        most 1,000), each under its fire's key: a fire that has its run starts nothing more, so it may be
        sent again. Whatever the overlap policy or a pause; a refused start is listed with its error."""
        return self._send(calls.schedule_backfill(schedule_id, start, end))

    def trigger(self, schedule_id: str) -> models.Run:
        """Start a run now, as a fire of this second would, whatever the overlap policy or a pause."""
        return self._send(calls.schedule_trigger(schedule_id))


class Events(_Resource):
    def send(self, name: str, payload: Any = None, *, key: str | None = None,
             idempotency_key: str | None = None) -> models.Event:
        """Record an event; it starts a run of each workflow whose trigger it matches (``runs``). Idempotent:
        without a key one is made, so a retried call records it once."""
        return self._send(calls.events_send(calls.event_request(name, payload, key=key,
                                                                idempotency_key=idempotency_key)))

    def send_many(self, events: Sequence[Mapping[str, Any]]) -> models.EventsSent:
        """Record 1 to 100 events (each with ``name``, ``payload``, ``key``, ``idempotency_key``), all or none."""
        return self._send(calls.events_send_many(events))

    def list(self, *, name: str | None = None, page_size: int | None = None,
             cursor: str | None = None) -> Page[models.Event]:
        """One page of the tenant's events, newest first (of ``name`` only, when given)."""
        return self._send(calls.EVENTS.list(name=name, page_size=page_size, cursor=cursor))

    def iter(self, *, name: str | None = None, page_size: int | None = None) -> Iterator[models.Event]:
        return self._iterate(calls.EVENTS.list(name=name, page_size=page_size))

    def get(self, event_id: str) -> models.Event:
        return self._send(calls.EVENTS.get(event_id))


class Triggers(_Resource):
    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.Trigger]:
        return self._send(calls.TRIGGERS.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.Trigger]:
        return self._iterate(calls.TRIGGERS.list(page_size=page_size))

    def get(self, trigger_id: str) -> models.Trigger:
        return self._send(calls.TRIGGERS.get(trigger_id))

    def create(self, workflow: str | Workflow, event: str, *, filter: Mapping[str, Any] | None = None,
               enabled: bool = True) -> models.Trigger:
        """Start a run of ``workflow`` for each event named ``event`` that meets ``filter`` (a condition on
        ``event.name``, ``event.key`` or ``event.payload…``)."""
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        return self._send(calls.TRIGGERS.create({"workflow": name, "event": event, "filter": filter,
                                                 "enabled": enabled}))

    def update(self, trigger_id: str, **changes: Any) -> models.Trigger:
        return self._send(calls.TRIGGERS.update(trigger_id, changes))

    def delete(self, trigger_id: str) -> None:
        self._send(calls.TRIGGERS.delete(trigger_id))


class Webhooks(_Resource):
    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.WebhookEndpoint]:
        """One page of the tenant's webhook endpoints, oldest first."""
        return self._send(calls.WEBHOOKS.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.WebhookEndpoint]:
        return self._iterate(calls.WEBHOOKS.list(page_size=page_size))

    def get(self, webhook_id: str) -> models.WebhookEndpoint:
        return self._send(calls.WEBHOOKS.get(webhook_id))

    def create(self, url: str, events: Sequence[WebhookEventType], *, workflows: Sequence[str] | None = None,
               description: str | None = None, enabled: bool | None = None) -> models.WebhookEndpoint:
        """Subscribe ``url`` to ``events`` (``run.succeeded``, ``run.failed``, ``run.cancelled``, ``step.failed``)
        of the runs of ``workflows`` (default: all). The answer's ``secret`` is shown this once."""
        body = calls.compact(url=url, events=calls.strings("events", events),
                             workflows=calls.strings("workflows", workflows), description=description, enabled=enabled)
        return self._send(calls.WEBHOOKS.create(body))

    def update(self, webhook_id: str, **changes: Any) -> models.WebhookEndpoint:
        """Change the fields given (PATCH); ``enabled=True`` enables a disabled endpoint again."""
        return self._send(calls.WEBHOOKS.update(webhook_id, changes))

    def delete(self, webhook_id: str) -> None:
        """Delete it and its delivery log."""
        self._send(calls.WEBHOOKS.delete(webhook_id))

    def rotate(self, webhook_id: str, *, grace_s: int | None = None) -> models.WebhookEndpoint:
        """A new secret (in the answer's ``secret``, this once); the previous one also signs for ``grace_s``
        seconds (default a day; 0: not at all)."""
        return self._send(calls.webhook_rotate(webhook_id, grace_s))

    def deliveries(self, webhook_id: str, *, page_size: int | None = None,
                   cursor: str | None = None) -> Page[models.WebhookDelivery]:
        """One page of the endpoint's delivery log, newest first."""
        return self._send(calls.webhook_deliveries(webhook_id, page_size=page_size, cursor=cursor))

    def iter_deliveries(self, webhook_id: str, *, page_size: int | None = None) -> Iterator[models.WebhookDelivery]:
        return self._iterate(calls.webhook_deliveries(webhook_id, page_size=page_size))

    def delivery(self, webhook_id: str, delivery_id: str) -> models.WebhookDelivery:
        """One delivery, with its ``body``."""
        return self._send(calls.webhook_delivery(webhook_id, delivery_id))

    def redeliver(self, webhook_id: str, delivery_id: str) -> models.WebhookDelivery:
        """Send the delivery again, at once, with a new series of attempts."""
        return self._send(calls.webhook_redeliver(webhook_id, delivery_id))


class Queue(_Resource):
    def stats(self) -> models.QueueStats:
        """The tenant's fair-queue backlog, due items, items in flight and oldest wait, per tier."""
        return self._send(calls.queue_current())


class Tasks(_Resource):
    def list(self) -> builtins.list[models.TaskEntry]:
        """The task catalog entries this tenant may call from ``task`` nodes, by name."""
        return list(self._iterate(calls.TASKS.list()))

    def get(self, name: str) -> models.TaskEntry:
        """One task this tenant may call; ``NotFound`` for any other name."""
        return self._send(calls.TASKS.get(name))


class PlatformTenants(_Resource):
    def list(self, *, page_size: int | None = None, cursor: str | None = None) -> Page[models.Tenant]:
        return self._send(calls.TENANTS.list(page_size=page_size, cursor=cursor))

    def iter(self, *, page_size: int | None = None) -> Iterator[models.Tenant]:
        return self._iterate(calls.TENANTS.list(page_size=page_size))

    def get(self, slug: str) -> models.Tenant:
        """A tenant by slug or id."""
        return self._send(calls.TENANTS.get(slug))

    def create(
        self, slug: str, *, name: str | None = None, plan: str | None = None, create_api_key: bool = False
    ) -> models.TenantCreated:
        """A new tenant; with ``create_api_key`` the answer carries its first key (shown once)."""
        body = calls.compact(slug=slug, name=name, plan=plan, create_api_key=create_api_key)
        return self._send(calls.TENANTS.create_as(body, models.TenantCreated))

    def suspend(self, slug: str) -> models.Tenant:
        return self._send(calls.TENANTS.act(slug, "suspend", idempotent=True))

    def activate(self, slug: str) -> models.Tenant:
        return self._send(calls.TENANTS.act(slug, "activate", idempotent=True))

    def delete(self, slug: str) -> models.Tenant:
        """Delete a suspended tenant and all its data: answered at once with the tenant, its status
        ``deleting``; its data is purged in the background. ``Conflict`` naming ``status`` for an
        active tenant. Idempotent."""
        return self._send(calls.TENANTS.delete_answered(slug))

    def set_plan(self, slug: str, plan: str) -> models.Tenant:
        return self._send(calls.TENANTS.act(slug, "plan", {"plan": plan}, idempotent=True))

    def entitlements(self, slug: str) -> models.Entitlements:
        return self._send(calls.tenant_entitlements(slug))

    def overrides(self, slug: str) -> builtins.list[models.Override]:
        return self._send(calls.tenant_overrides(slug))

    def set_override(self, slug: str, field: str, value: Any, *, reason: str = "") -> models.Override:
        return self._send(calls.tenant_override_set(slug, field, value, reason))

    def clear_override(self, slug: str, field: str) -> None:
        """Remove an override (nothing changes if there is none)."""
        self._send(calls.tenant_override_clear(slug, field))


class PlatformPlans(_Resource):
    def list(self) -> builtins.list[models.Plan]:
        return self._send(calls.plans())

    def get(self, slug: str) -> models.Plan:
        return self._send(calls.plan(slug))


class PlatformQueue(_Resource):
    def stats(self) -> builtins.list[models.ShardQueueStats]:
        """The fair queue of every shard, with the worker slots and busy credits per Celery queue."""
        return self._send(calls.platform_queue())


class PlatformTaskCatalog(_Resource):
    def list(self) -> builtins.list[models.CatalogEntry]:
        """Every entry of the task catalog, by name."""
        return list(self._iterate(calls.TASK_CATALOG.list()))

    def get(self, name: str) -> models.CatalogEntry:
        return self._send(calls.TASK_CATALOG.get(name))

    def create(
        self, name: str, *, description: str | None = None, queue: str | None = None,
        arguments: models.TaskArguments | None = None,
        input_schema: Mapping[str, Any] | None = None, timeout_s: float | None = None,
        plans: Sequence[str] | None = None, tenants: Sequence[str] | None = None, enabled: bool | None = None,
    ) -> models.CatalogEntry:
        """Let tenants call the Celery task ``name`` as a ``task`` node: those of ``plans`` (none: every
        plan) and the ``tenants`` named besides them."""
        body = calls.compact(name=name, description=description, queue=queue, arguments=arguments,
                             input_schema=input_schema, timeout_s=timeout_s, enabled=enabled,
                             plans=calls.strings("plans", plans),
                             tenants=calls.strings("tenants", tenants))
        return self._send(calls.TASK_CATALOG.create(body))

    def update(self, name: str, /, **changes: Any) -> models.CatalogEntry:
        """Change the fields given (PATCH). The name cannot change: ``name=`` among the changes is sent,
        and the server refuses it (``BadRequest`` naming ``name``)."""
        return self._send(calls.TASK_CATALOG.update(name, changes))

    def delete(self, name: str) -> None:
        self._send(calls.TASK_CATALOG.delete(name))


class Platform:
    """The platform-admin API; it answers platform keys (``dctp_…``) only."""

    def __init__(self, sender: SyncSender) -> None:
        self.tenants = PlatformTenants(sender)
        self.plans = PlatformPlans(sender)
        self.queue = PlatformQueue(sender)
        self.task_catalog = PlatformTaskCatalog(sender)


class Client:
    """A Ductor API client. ``base_url`` and ``api_key`` default to ``DUCTOR_URL`` and ``DUCTOR_API_KEY``.

    Calls that are safe to repeat are retried on connection errors, 429 and 502-504 (``retry``);
    ``timeout`` is httpx's, per request. Use it as a context manager, or ``close()`` it.
    """

    def __init__(
        self, base_url: str | None = None, api_key: str | None = None, *, timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy | None = None, http_client: httpx.Client | None = None,
    ) -> None:
        self.config = Config.resolve(base_url, api_key, timeout, retry or RetryPolicy())
        self._sender = SyncSender(self.config, http_client)
        self.tenant = TenantResource(self._sender)
        self.entitlements = EntitlementsResource(self._sender)
        self.api_keys = ApiKeys(self._sender)
        self.connections = Connections(self._sender)
        self.pools = Pools(self._sender)
        self.rules = Rules(self._sender)
        self.fairness_keys = FairnessKeys(self._sender)
        self.routing = Routing(self._sender)
        self.workflows = Workflows(self._sender)
        self.runs = Runs(self._sender)
        self.schedules = Schedules(self._sender)
        self.events = Events(self._sender)
        self.triggers = Triggers(self._sender)
        self.webhooks = Webhooks(self._sender)
        self.queue = Queue(self._sender)
        self.tasks = Tasks(self._sender)
        self.platform = Platform(self._sender)

    def close(self) -> None:
        self._sender.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

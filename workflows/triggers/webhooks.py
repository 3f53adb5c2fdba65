"""Webhooks: a tenant's endpoints told of its runs' outcomes by signed JSON POSTs.

A ``WebhookEndpoint`` subscribes a URL to some of ``EVENT_TYPES``, for every workflow of the tenant
or only those named in its ``workflows``. When a run ends (succeeded, failed or cancelled) or, for
``step.failed``, an attempt of one of its steps fails, ``on_run_event`` (a listener on the run's
history, ``workflows.engine.events``) creates one ``WebhookDelivery`` per matching enabled endpoint
in the transaction that records the outcome, and enqueues its fair-queue item once that commits: a
delivery exists if and only if the outcome does. Sending it, retrying it, and disabling an endpoint
that keeps failing are ``webhook_delivery``'s.

The listener runs on the hot path of every run, so it reads the tenant's enabled endpoints from
this process's copy, kept while the tenant's stamp is the same (``tenants.freshness``): a tenant
without endpoints costs no query per finished run. A change of an endpoint gives the tenant a new
stamp, at once and again once it commits: the process that makes it sees it at once, every other
within ``freshness.LOCAL_TTL_S`` (2 s), so a run that ends within 2 s of a change may still be
delivered as the endpoints were before it.

An endpoint's secret (``whsec_…``) is made here, shown in full only in the answers of the create
and of a rotation, and stored encrypted (``scheduling.secrets``). After a rotation the previous
secret goes on signing beside the new one for ``grace_s``.

A URL is https (http too while ``DUCTOR_HTTP_ALLOW_PRIVATE`` is on, for local development), at most
2,000 characters, without credentials, and its host is a host name or an IP address that is, or
resolves to, public addresses only (the policy of ``http.request``): a non-public IP literal, or
``localhost``, is refused when the URL is given (``scheduling.http_action.refuse_literal``, which
resolves nothing), and every attempt resolves the host and checks each address
(``resolve_allowed``). A name that does not resolve yet is taken: its attempts fail until it does.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from secrets import token_urlsafe
from typing import Any

import httpx
import structlog
from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import F, Func, QuerySet, Value
from django.utils import timezone

from ductor_project.core import tracing
from ductor_project.core.context import current_tenant
from ductor_project.core.errors import ApiError, Conflict, ErrorCode
from scheduling import fair_queue
from scheduling.action_errors import PermanentActionError
from scheduling.admission import webhook_scope
from scheduling.http_action import MAX_URL_CHARS, refuse_literal
from scheduling.secrets import encrypt
from tenants import freshness
from tenants.entitlements import effective_entitlements
from tenants.scoping import insert_rows
from tenants.selectors import first_or_404, parse_uuid
from tenants.usage import enforce_setting_limit
from workflows.engine.events import jsonable
from workflows.engine.journal import current_journal
from workflows.engine.statements import lock_definitions
from workflows.models import StepRun, WebhookDelivery, WebhookEndpoint, WorkflowDefinition, WorkflowRun, WorkflowVersion

log = structlog.get_logger(__name__)

EVENT_TYPES = ("run.succeeded", "run.failed", "run.cancelled", "step.failed")
# The fair-queue item kind of a delivery (its handler: ``webhook_delivery.execute_delivery``).
ITEM_KIND = "webhook"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix of the secrets made here, not a secret
DEFAULT_GRACE_S = 24 * 3600
MAX_GRACE_S = 30 * 24 * 3600
# The note a redelivery leaves in a delivery's log: its attempts are counted again from there.
REDELIVER_NOTE = "redelivery requested"

# The history events the webhooks report, by the type of the webhook they make.
_RUN_OUTCOMES = {"succeeded": "run.succeeded", "failed": "run.failed", "cancelled": "run.cancelled"}
# An attempt of a step that failed: its own failure or its child run's (``step_failed``), or its timeout.
_STEP_FAILURES = frozenset({"step_failed", "step_timed_out"})

Status = WebhookDelivery.Status


@dataclass(frozen=True)
class Revealed:
    """An endpoint with its new secret in full: what its create and each rotation answer, once."""

    endpoint: WebhookEndpoint
    secret: str


def item_id(delivery_id: Any) -> str:
    return f"webhook:{delivery_id}"


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(f"Invalid field(s): {field}. {message}", code=ErrorCode.INVALID, details={field: [message]})


# --- what an endpoint may be ------------------------------------------------------------------------------

# A host name, as a URL holds it (IDNA-encoded): dot-separated labels of letters, digits, '-' and '_',
# 1 to 63 long, neither starting nor ending with '-', and an optional final dot.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}\.?")


def checked_url(value: Any) -> str:
    """``value`` as an endpoint's URL (see the module docs), or a ``400`` naming ``url``."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise _invalid("url", "Give the URL the deliveries are POSTed to.")
    if len(text) > MAX_URL_CHARS:
        raise _invalid("url", f"At most {MAX_URL_CHARS} characters.")
    if any(char.isspace() or not char.isprintable() for char in text):
        raise _invalid("url", "Must not contain spaces or control characters.")
    try:
        url = httpx.URL(text)
        host = url.host  # decodes an IDNA host: a malformed one ("xn--") is refused here
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise _invalid("url", f"Not a URL: {exc}.") from None
    if url.scheme != "https" and not (url.scheme == "http" and settings.DUCTOR_HTTP_ALLOW_PRIVATE):
        raise _invalid("url", "Must be an https URL.")
    if not host:
        raise _invalid("url", "Must name a host.")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise _invalid("url", "Its port must be from 1 to 65535.")
    if url.userinfo:
        raise _invalid("url", "Must not carry credentials: check the signature of each delivery instead.")
    if url.fragment:
        raise _invalid("url", "Must not carry a fragment ('#').")
    try:
        # No DNS lookup in the request (slow, and a probe of the platform's resolver): a name is
        # resolved and checked at every attempt.
        refuse_literal(url.raw_host.decode("ascii"))
    except PermanentActionError as exc:
        raise _invalid("url", f"{exc.message}.") from None
    if not _is_host(url.raw_host.decode("ascii")):  # what httpx takes as a host, escaped: https://[/ is %5B
        raise _invalid("url", f"Its host {host!r} is no host name or IP address.")
    return text


def _is_host(raw: str) -> bool:
    """Whether ``raw``, a URL's host as it is sent, is an IP address or a host name (``_HOST_NAME``)."""
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        return _HOST_NAME.fullmatch(raw) is not None
    return True


def checked_events(value: Any) -> list[str]:
    """``value`` as an endpoint's event types (in ``EVENT_TYPES`` order, once each), or a ``400``
    naming ``events``."""
    if not isinstance(value, list) or not value:
        raise _invalid("events", f"Give one or more of {', '.join(EVENT_TYPES)}.")
    unknown = [str(one) for one in value if one not in EVENT_TYPES]
    if unknown:
        raise _invalid("events", f"Unknown event type {unknown[0]!r}; use {', '.join(EVENT_TYPES)}.")
    return [one for one in EVENT_TYPES if one in value]


def checked_workflows(value: Any) -> list[str]:
    """``value`` as the names of workflows of the tenant (sorted, once each; empty: every workflow),
    or a ``400`` naming ``workflows``. In the transaction that writes the endpoint: the workflows
    stay locked until it commits, so a deletion of one of them, which takes its name out of the
    endpoints, either waits for it or is waited for, and then the name is refused."""
    names = sorted({str(name) for name in value or []})
    if not names:
        return []
    lock_definitions(*names)
    known = set(WorkflowDefinition.objects.filter(name__in=names).values_list("name", flat=True))
    unknown = [name for name in names if name not in known]
    if unknown:
        raise _invalid("workflows", f"No workflow named {unknown[0]!r}.")
    return names


def _enforce_limit() -> None:
    """Refuse one more endpoint past ``DUCTOR_WEBHOOKS_PER_TENANT`` (``403 plan_limit_reached``)."""
    enforce_setting_limit("webhook endpoints", settings.DUCTOR_WEBHOOKS_PER_TENANT, live_endpoints(),
                          kind="webhooks", setting="DUCTOR_WEBHOOKS_PER_TENANT")


# --- endpoints --------------------------------------------------------------------------------------------


def _new_secret() -> str:
    return SECRET_PREFIX + token_urlsafe(32)


def webhook_create(*, url: str, events: list[str], workflows: list[str] | None = None, description: str = "",
                   enabled: bool = True) -> Revealed:
    """Subscribe ``url`` to ``events`` of the tenant's runs (of ``workflows`` only, when given), with
    a new secret. ``400`` naming a bad field, ``403 plan_limit_reached`` past the limit."""
    fields = {"url": checked_url(url), "events": checked_events(events), "description": description,
              "enabled": enabled}
    secret = _new_secret()
    with transaction.atomic():
        _enforce_limit()  # the tenant's row, then its workflows: the order a schedule's and a trigger's create take
        fields["workflows"] = checked_workflows(workflows)
        endpoint = WebhookEndpoint.objects.create(**fields, secret=encrypt(secret),
                                                  disabled_reason="" if enabled else DISABLED_BY_API,
                                                  disabled_at=None if enabled else timezone.now())
        forget_endpoints()
    log.info("webhook_created", webhook_id=str(endpoint.pk), events=endpoint.events, host=httpx.URL(endpoint.url).host)
    return Revealed(endpoint, secret)


def live_endpoints() -> QuerySet[WebhookEndpoint]:
    """The endpoints of the tenant in context that are not deleted (the only ones it sees)."""
    return WebhookEndpoint.objects.filter(deleted_at__isnull=True)


def _locked(endpoint: WebhookEndpoint) -> WebhookEndpoint:
    found: WebhookEndpoint = first_or_404(live_endpoints().select_for_update().filter(pk=endpoint.pk))
    return found


# How the disabled reason of an endpoint whose only workflow was deleted begins (``workflow_deleted``).
ONLY_WORKFLOW_DELETED = "its only workflow"
# The disabled reason of an endpoint created disabled, or disabled by a change.
DISABLED_BY_API = "disabled through the API"


def webhook_update(endpoint: WebhookEndpoint, changes: Mapping[str, Any]) -> WebhookEndpoint:
    """Change the fields in ``changes``. ``enabled`` true enables it again and zeroes its failures;
    false disables it and stops its pending deliveries. An endpoint disabled because its only workflow
    was deleted is enabled only with its ``workflows`` given in the same change (``[]`` for all):
    enabled as it is, it would cover every workflow (409 naming ``enabled``)."""
    checks = {"url": checked_url, "events": checked_events}
    fields = {name: checks[name](value) if name in checks else value for name, value in changes.items()
              if name in ("url", "events", "description")}
    with transaction.atomic():
        if "workflows" in changes:  # its workflows before its row, in the order of their deletion
            fields["workflows"] = checked_workflows(changes["workflows"])
        row = _locked(endpoint)
        if (changes.get("enabled") and not row.enabled and not row.workflows and "workflows" not in changes
                and row.disabled_reason.startswith(ONLY_WORKFLOW_DELETED)):
            message = (f"This endpoint was disabled because {row.disabled_reason}: enabled as it is, it would "
                       "cover every workflow. Give its workflows in the same request ([] for all).")
            raise Conflict(message, details={"enabled": [message]})
        for name, value in fields.items():
            setattr(row, name, value)
        stopping = "enabled" in changes and not changes["enabled"] and row.enabled
        if "enabled" in changes:
            _set_enabled(row, bool(changes["enabled"]))
        row.save()
        if stopping:
            deliveries_stop(row.pk, row.disabled_reason)
        forget_endpoints()
    log.info("webhook_updated", webhook_id=str(row.pk), fields=sorted(changes), enabled=row.enabled)
    return row


def _set_enabled(row: WebhookEndpoint, enabled: bool) -> None:
    if enabled:
        row.enabled, row.consecutive_failures, row.disabled_reason, row.disabled_at = True, 0, "", None
    elif row.enabled:
        row.enabled, row.disabled_reason, row.disabled_at = False, DISABLED_BY_API, timezone.now()


def webhook_rotate(endpoint: WebhookEndpoint, *, grace_s: int = DEFAULT_GRACE_S) -> Revealed:
    """Give the endpoint a new secret; the one it had goes on signing beside it for ``grace_s``
    seconds (0: not at all). A secret older than that one is dropped at once."""
    secret = _new_secret()
    with transaction.atomic():
        row = _locked(endpoint)
        keep = grace_s > 0
        row.previous_secret = row.secret if keep else ""
        row.previous_secret_expires_at = timezone.now() + timedelta(seconds=grace_s) if keep else None
        row.secret = encrypt(secret)
        row.save()
    log.info("webhook_secret_rotated", webhook_id=str(row.pk), grace_s=grace_s)
    return Revealed(row, secret)


# The disabled reason of a deleted endpoint (which no one of the tenant sees).
DELETED = "deleted"


def webhook_delete(endpoint: WebhookEndpoint) -> None:
    """Delete the endpoint for the tenant: two statements on its row, however long its delivery log.
    It is marked deleted and disabled, so nothing finds it, no outcome is delivered to it, and an
    attempt of a delivery still pending sends nothing; its deliveries, then its row, are removed a
    batch at a time by the coordinator (``webhook_delivery.purge_deleted_endpoints``). Deleting them
    here held one transaction for the whole log (a busy endpoint's is millions). The row is locked
    ``FOR UPDATE`` first: an outcome that locked it ``FOR KEY SHARE`` (``_still_there``) is waited
    for, and one that comes after leaves it out."""
    with transaction.atomic():
        row = _locked(endpoint)
        now = timezone.now()
        live_endpoints().filter(pk=row.pk).update(deleted_at=now, enabled=False, disabled_reason=DELETED,
                                                  disabled_at=row.disabled_at or now, updated_at=now)
        forget_endpoints()
    log.info("webhook_deleted", webhook_id=str(endpoint.pk))


def webhook_disable(endpoint_id: Any, reason: str) -> bool:
    """Disable an enabled endpoint for ``reason`` and stop its pending deliveries, in the caller's
    transaction. Returns whether it was enabled (a disabled one is left as it is)."""
    now = timezone.now()
    changed = WebhookEndpoint.objects.filter(pk=endpoint_id, enabled=True).update(
        enabled=False, disabled_reason=reason[:500], disabled_at=now, updated_at=now)
    if changed:
        deliveries_stop(endpoint_id, reason)
        forget_endpoints()
    return bool(changed)


def workflow_deleted(name: str, **kwargs: Any) -> int:
    """Take the tenant's deleted workflow ``name`` out of its endpoints' ``workflows``, in the
    deletion's transaction (a receiver of ``services.workflow_deleted``): kept, it would cover the
    next workflow given the name. An endpoint that covered that workflow alone is disabled, saying
    why (with none left, it would cover all); one disabled already takes that reason too, which is
    what asks for its workflows when it is enabled again. How many endpoints changed."""
    changed = 0
    for endpoint in live_endpoints().select_for_update().filter(workflows__contains=[name]):
        left = [workflow for workflow in endpoint.workflows if workflow != name]
        fields: dict[str, Any] = {"workflows": left, "updated_at": timezone.now()}
        if not left:
            fields["disabled_reason"] = f"{ONLY_WORKFLOW_DELETED}, '{name}', was deleted"
            webhook_disable(endpoint.pk, fields["disabled_reason"])
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(**fields)
        changed += 1
    if changed:
        forget_endpoints()
    return changed


def deliveries_stop(endpoint_id: Any, reason: str) -> int:
    """Fail the endpoint's pending deliveries (one ``UPDATE``), each with a note of why; how many."""
    now = timezone.now()
    note = delivery_note(now, f"not sent: the endpoint was disabled ({reason})")
    appended = Func(F("attempts"), Value([note], output_field=models.JSONField()), template="(%(expressions)s)",
                    arg_joiner=" || ", output_field=models.JSONField())
    return WebhookDelivery.objects.filter(endpoint_id=endpoint_id, status=Status.PENDING).update(
        status=Status.FAILED, finished_at=now, next_attempt_at=None, attempts=appended)


def webhook_of(endpoint_id: Any) -> WebhookEndpoint:
    """An endpoint of the tenant in context, or ``NotFound`` (also for another tenant's, a deleted one,
    or a bad id)."""
    found: WebhookEndpoint = first_or_404(live_endpoints().filter(pk=parse_uuid(endpoint_id)))
    return found


def delivery_of(endpoint: WebhookEndpoint, delivery_id: Any) -> WebhookDelivery:
    """A delivery of ``endpoint``, or ``NotFound`` (also another endpoint's or tenant's, or a bad id)."""
    found: WebhookDelivery = first_or_404(WebhookDelivery.objects.filter(endpoint=endpoint,
                                                                         pk=parse_uuid(delivery_id)))
    return found


def delivery_redeliver(delivery: WebhookDelivery) -> WebhookDelivery:
    """Send the delivery again, at once, with a new series of attempts (the log keeps the old ones):
    ``409 conflict`` while its endpoint is disabled."""
    with transaction.atomic():
        row: WebhookDelivery = first_or_404(WebhookDelivery.objects.select_for_update()
                                            .filter(pk=delivery.pk))
        if not WebhookEndpoint.objects.filter(pk=row.endpoint_id, enabled=True).exists():
            raise Conflict("The endpoint is disabled: enable it first (PATCH with enabled true).")
        now = timezone.now()
        row.attempts = [*row.attempts, delivery_note(now, REDELIVER_NOTE)]
        row.status, row.next_attempt_at, row.finished_at = Status.PENDING, now, None
        row.save(update_fields=["attempts", "status", "next_attempt_at", "finished_at"])
        enqueue_deliveries([Queued(*WebhookDelivery.objects.filter(pk=row.pk).values_list(*QUEUED_FIELDS).get())])
    log.info("webhook_redelivery", delivery_id=str(row.pk), webhook_id=str(row.endpoint_id))
    return row


# --- the endpoints a process knows ----------------------------------------------------------------------


_endpoints: freshness.Copies[tuple[WebhookEndpoint, ...]] = freshness.Copies()


def enabled_endpoints() -> tuple[WebhookEndpoint, ...]:
    """The enabled endpoints of the tenant in context, oldest first: this process's copy while the
    tenant's stamp is the same (``tenants.freshness``), else one query. Read only: the rows are
    shared by the process's threads."""
    return _endpoints.get(current_tenant(),
                          lambda: tuple(WebhookEndpoint.objects.filter(enabled=True).order_by("created_at")))


def forget_endpoints() -> None:
    """The tenant's endpoints changed: every process reads them again (a new stamp, now and again
    once the surrounding transaction commits: a read in between would keep what a rollback undoes)."""
    freshness.bump(current_tenant())


# --- deliveries of the runs' outcomes -----------------------------------------------------------------


def on_run_event(run: WorkflowRun, type_: str, node_id: str, data: dict[str, Any]) -> None:
    """The listener on the runs' histories: the deliveries of an outcome to the endpoints subscribed
    to it, in the outcome's transaction (see the module docs). Other events cost a lookup in a dict,
    and an outcome of a tenant without endpoints this process's copy of them."""
    kind = _RUN_OUTCOMES.get(type_) or ("step.failed" if type_ in _STEP_FAILURES else None)
    if kind is None:
        return
    targets = [endpoint for endpoint in enabled_endpoints() if kind in endpoint.events
               and (not endpoint.workflows or run.workflow_name in endpoint.workflows)]
    if targets:
        targets = _still_there(targets)
    if not targets:
        return
    now = timezone.now()
    content: dict[str, Any] = {"run": run_data(run)}
    if kind == "step.failed":
        content["step"] = _step_data(run, node_id, data)
    deliveries = [WebhookDelivery(endpoint=endpoint, run=run, type=kind, next_attempt_at=now) for endpoint in targets]
    for delivery in deliveries:
        delivery.body = {"id": str(delivery.pk), "type": kind, "created_at": _when(now), "data": content}
    insert_rows(deliveries)
    enqueue_deliveries([Queued(delivery.pk, run.tier, run.pk, run.workflow_name) for delivery in deliveries])
    log.info("webhook_deliveries_created", run_id=str(run.pk), type=kind, deliveries=len(deliveries))


def _still_there(endpoints: list[WebhookEndpoint]) -> list[WebhookEndpoint]:
    """Those of ``endpoints`` (the process's copy, which may name one deleted since) that are not
    deleted, locked ``FOR KEY SHARE`` until the outcome commits, as its deliveries' references are at
    its commit: a deletion in progress is waited for, and its endpoint left out (the purge deletes
    its row later). Before, a delivery to an endpoint deleted meanwhile failed its reference at the
    outcome's commit, and the outcome with it (a run's start whose first tick ended it answered 500)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {WebhookEndpoint._meta.db_table} "  # noqa: S608 - no value in the text
                       "WHERE tenant_id = %s AND id = ANY(%s) AND deleted_at IS NULL FOR KEY SHARE",
                       [current_tenant().pk, [endpoint.pk for endpoint in endpoints]])
        kept = {row[0] for row in cursor.fetchall()}
    return [endpoint for endpoint in endpoints if endpoint.pk in kept]


def delivery_note(now: datetime, text: str) -> dict[str, Any]:
    """An entry of a delivery's log that is not an attempt: when, and what happened to it."""
    return {"at": _when(now), "note": text[:500]}


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def run_data(run: WorkflowRun) -> dict[str, Any]:
    """The run as a webhook's body carries it (``data.run``)."""
    version: int | None
    if "workflow" in run._state.fields_cache:
        version = run.workflow.number
    else:
        version = WorkflowVersion.objects.filter(pk=run.workflow_id).values_list("number", flat=True).first()
    return {"id": str(run.pk), "workflow": run.workflow_name, "version": version, "status": run.status,
            "input": jsonable(run.input), "output": jsonable(run.output), "error": jsonable(run.error),
            "tags": list(run.tags or []), "started_at": _when(run.started_at), "finished_at": _when(run.finished_at)}


def _step_data(run: WorkflowRun, node_id: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The failed attempt (``data.step``): the tick's own, not written yet, or the stored one."""
    try:
        gathered: Sequence[StepRun] = current_journal().steps
    except RuntimeError:
        gathered = ()
    step = next((s for s in reversed(gathered) if s.run_id == run.pk and s.node_id == node_id), None)
    if step is None:
        step = StepRun.objects.filter(run_id=run.pk, node_id=node_id).order_by("-attempt").first()
    if step is None:
        return {"node_id": node_id, "attempt": data.get("attempt"), "error": None}
    return {"node_id": node_id, "attempt": step.attempt, "error": jsonable(step.error)}


@dataclass(frozen=True)
class Queued:
    """What a delivery's item carries: the delivery, and its run's tier (None: the plan's default), id
    and workflow (which name the item in Celery's tools)."""

    delivery_id: Any
    tier: str | None
    run_id: Any = None
    workflow: str = ""


# What a query reads of a delivery to enqueue it (``Queued``'s fields, in order).
QUEUED_FIELDS = ("pk", "run__tier", "run_id", "run__workflow_name")


def enqueue_deliveries(pending: Sequence[Queued]) -> None:
    """Enqueue the items of the tenant's deliveries once the surrounding transaction commits:
    ``webhook:<id>``, each in its own partition, in its run's tier (the plan's default tier when the
    plan no longer allows it). Idempotent: an item waiting keeps its place. Should Redis refuse them,
    the deliveries stay pending in PostgreSQL, and the reconciler enqueues them again."""
    tenant = current_tenant()
    scope, confs = webhook_scope(settings.DUCTOR_WEBHOOK_CONCURRENCY)
    items = [fair_queue.NewItem(item_id(one.delivery_id), one.tier or "", item_id(one.delivery_id),
                                tracing.inject({"kind": ITEM_KIND, "delivery_id": str(one.delivery_id),
                                                "run_id": str(one.run_id) if one.run_id else None,
                                                "workflow": one.workflow}), scope=scope)
             for one in pending]

    def push() -> None:
        try:
            # In a tier the plan allows now: a run's may be one it has lost since (a downgrade).
            limits = effective_entitlements(tenant)
            fair_queue.enqueue_many([dataclasses.replace(item, tier=limits.queue_tier(item.tier)) for item in items],
                                    scopes=confs, tenant=tenant)
        except Exception:
            log.exception("webhook_enqueue_failed", deliveries=len(items))

    if items:
        transaction.on_commit(push)

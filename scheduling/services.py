"""Writes of the routing data: connections, pools (with their members) and rules; and the weights of
the tenant's fairness keys.

Guarantees of every function here:
- it acts for the tenant in context (``TenantScopeError`` without one) and only
  ever reads or writes that tenant's rows;
- it is one transaction: a refused request (``ApiError``) leaves no row behind;
- rows are written through ``save()`` / ``delete()``, never ``update()``, so the
  model signals bump the tenant's routing version and the very next ``route()``
  follows the change;
- creates are checked against the plan's object ceilings (``403 plan_limit_reached``);
- bad input is ``400 invalid`` naming the field (``members[1].connection``,
  ``match.conditions[0].op``, ``action.pool``, ``priority``...).

Update functions take only the fields to change; ``UNSET`` means "leave as is".
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from django.db import IntegrityError, transaction
from django.db.models import Model

from ductor_project.core.context import current_tenant
from ductor_project.core.errors import ApiError, Conflict, ErrorCode, NotFound
from scheduling import selectors
from scheduling.connection_config import ConfigError, validate_config, validate_secret
from scheduling.models import (
    MAX_FAIRNESS_KEY,
    MAX_FAIRNESS_KEY_WEIGHT,
    Connection,
    FairnessKey,
    Pool,
    PoolMember,
    Rule,
)
from scheduling.routing import Explanation, explain
from scheduling.rules import Step, validate_action, validate_match
from scheduling.secrets import encrypt
from scheduling.templates import FieldError
from tenants.entitlements import effective_entitlements
from tenants.usage import enforce_ceiling, lock_tenant_row

log = structlog.get_logger(__name__)


class _Unset(enum.Enum):
    UNSET = "UNSET"


UNSET = _Unset.UNSET


@dataclass(frozen=True)
class MemberSpec:
    """A pool member as requested: ``connection`` is the id or the name of a connection of the tenant."""

    connection: str
    weight: int = 1
    priority: int = 0


def invalid(field: str, message: str) -> ApiError:
    """``400 invalid`` naming one field, in the shape the API uses for validation errors."""
    return ApiError(
        f"Invalid field(s): {field}. {message}", code=ErrorCode.INVALID, details={field: [message]}
    )


# Unique constraints of the routing models -> (field named in the error, message template). A value
# another row holds is ``409 conflict`` (as a taken name is everywhere in the API); the same connection
# twice in one pool's request is the request's own error, ``400 invalid``.
_UNIQUE_FIELDS: dict[str, tuple[str, str]] = {
    "connection_unique_name": ("name", "A connection named '{obj.name}' already exists."),
    "pool_unique_name": ("name", "A pool named '{obj.name}' already exists."),
    "rule_unique_priority": ("priority", "Another rule already has priority {obj.priority}."),
    "poolmember_unique_connection": ("members", "A connection can be a member of a pool only once."),
    "fairnesskey_unique_key": ("key", "The key '{obj.key}' has a weight already."),
}


def _save(obj: Model, **kwargs: Any) -> None:
    """``obj.save()`` in a savepoint; a duplicate of a unique field becomes ``409 conflict`` (``400
    invalid`` for a pool's members) naming it."""
    try:
        with transaction.atomic():
            obj.save(**kwargs)
    except IntegrityError as exc:
        constraint = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None)
        if constraint == "pool_one_default":
            raise Conflict("Another pool became the default at the same time; retry.") from exc
        if constraint not in _UNIQUE_FIELDS:
            raise
        field, template = _UNIQUE_FIELDS[constraint]
        message = template.format(obj=obj)
        if constraint == "poolmember_unique_connection":
            raise invalid(field, message) from exc
        raise Conflict(message, details={field: [message]}) from exc


@contextmanager
def _field_errors() -> Iterator[None]:
    """Turn the pure validators' errors (which name their field) into ``400 invalid``."""
    try:
        yield
    except (FieldError, ConfigError) as exc:
        raise invalid(exc.field, exc.message) from exc


def _apply_limits(
    row: Connection | Pool,
    *,
    max_concurrency: int | _Unset | None,
    rate_per_s: float | _Unset | None,
    burst: int | _Unset | None,
) -> None:
    """Set concurrency and rate limits. A rate needs a burst (default 1); no rate means no burst."""
    if max_concurrency is not UNSET:
        row.max_concurrency = max_concurrency
    if rate_per_s is not UNSET:
        row.rate_per_s = rate_per_s
    if burst is not UNSET:
        if burst is not None and row.rate_per_s is None:
            raise invalid("burst", "A burst needs rate_per_s.")
        row.burst = burst
    if row.rate_per_s is None:
        row.burst = None
    elif row.burst is None:
        row.burst = 1


def _locked(model: type[Connection] | type[Pool] | type[Rule] | type[FairnessKey], pk: Any) -> Any:
    """The row re-read under a row lock (FOR UPDATE) inside the current transaction; gone -> NotFound."""
    row = model.objects.select_for_update().filter(pk=pk).first()
    if row is None:
        raise NotFound()
    return row


# --- connections -----------------------------------------------------------------------------


@transaction.atomic
def connection_create(
    *,
    name: str,
    kind: str,
    config: dict[str, Any],
    secret: str = "",
    max_concurrency: int | None = None,
    rate_per_s: float | None = None,
    burst: int | None = None,
) -> Connection:
    """Create a connection; the secret is stored encrypted (Fernet) and never logged."""
    enforce_ceiling("connections", Connection.objects.all())
    with _field_errors():
        clean_config = validate_config(kind, config)
        validate_secret(kind, secret)
    connection = Connection(
        name=name, kind=kind, config=clean_config, secret_token=encrypt(secret) if secret else ""
    )
    _apply_limits(connection, max_concurrency=max_concurrency, rate_per_s=rate_per_s, burst=burst)
    _save(connection)
    log.info("connection_created", connection_id=str(connection.pk), kind=kind, has_secret=bool(secret))
    return connection


@transaction.atomic
def connection_update(
    *,
    connection: Connection,
    name: str | _Unset = UNSET,
    kind: str | _Unset = UNSET,
    config: dict[str, Any] | _Unset = UNSET,
    secret: str | _Unset = UNSET,
    max_concurrency: int | _Unset | None = UNSET,
    rate_per_s: float | _Unset | None = UNSET,
    burst: int | _Unset | None = UNSET,
) -> Connection:
    """Change a connection. A new ``kind`` re-validates the config; ``secret=""`` removes the secret."""
    row: Connection = _locked(Connection, connection.pk)
    if name is not UNSET:
        row.name = name
    if kind is not UNSET or config is not UNSET:
        row.kind = row.kind if kind is UNSET else kind
        with _field_errors():
            row.config = validate_config(row.kind, row.config if config is UNSET else config)
    if secret is not UNSET:
        with _field_errors():
            validate_secret(row.kind, secret)
        row.secret_token = encrypt(secret) if secret else ""
    _apply_limits(row, max_concurrency=max_concurrency, rate_per_s=rate_per_s, burst=burst)
    _save(row)
    log.info("connection_updated", connection_id=str(row.pk), secret_changed=secret is not UNSET)
    return row


@transaction.atomic
def connection_rotate_secret(*, connection: Connection, secret: str) -> Connection:
    """Replace the secret of a connection, keeping its id (members and rules are untouched)."""
    if not secret:
        raise invalid("secret", "A new secret is required.")
    row: Connection = _locked(Connection, connection.pk)
    with _field_errors():
        validate_secret(row.kind, secret)
    row.secret_token = encrypt(secret)
    row.save(update_fields=["secret_token", "updated_at"])
    log.info("connection_secret_rotated", connection_id=str(row.pk))
    return row


@transaction.atomic
def connection_delete(*, connection: Connection) -> None:
    """Delete a connection; it leaves every pool it was a member of."""
    connection_id = str(connection.pk)
    _locked(Connection, connection.pk).delete()
    log.info("connection_deleted", connection_id=connection_id)


# --- pools -----------------------------------------------------------------------------------


def _resolve_members(members: Sequence[MemberSpec]) -> list[tuple[Connection, MemberSpec]]:
    """The tenant's connections named by ``members``, locked against deletion until commit.

    A connection that is unknown, of another tenant, or listed twice is
    ``400 invalid`` naming ``members[i].connection``; nothing is written.
    """
    resolved: list[tuple[Connection, MemberSpec]] = []
    seen: set[Any] = set()
    for index, member in enumerate(members):
        found = selectors.connection_by_reference(member.connection)
        if found is None:
            raise invalid(f"members[{index}].connection", f"Unknown connection '{member.connection}'.")
        if found.pk in seen:
            raise invalid(f"members[{index}].connection", f"Connection '{found.name}' is listed twice.")
        seen.add(found.pk)
        resolved.append((found, member))
    lock = Connection.objects.select_for_update(no_key=True).filter(pk__in=seen)
    locked = set(lock.values_list("pk", flat=True))
    for index, (found, member) in enumerate(resolved):
        if found.pk not in locked:
            raise invalid(f"members[{index}].connection", f"Unknown connection '{member.connection}'.")
    return resolved


def _set_members(pool: Pool, resolved: list[tuple[Connection, MemberSpec]]) -> None:
    """Make the pool's members exactly ``resolved`` (row by row, so routing caches are invalidated)."""
    existing = {m.connection_id: m for m in PoolMember.objects.filter(pool=pool)}
    wanted = {connection.pk for connection, _ in resolved}
    for connection_id, member in existing.items():
        if connection_id not in wanted:
            member.delete()
    for connection, spec in resolved:
        row = existing.get(connection.pk)
        if row is None:
            _save(PoolMember(pool=pool, connection=connection, weight=spec.weight, priority=spec.priority))
        elif (row.weight, row.priority) != (spec.weight, spec.priority):
            row.weight, row.priority = spec.weight, spec.priority
            _save(row, update_fields=["weight", "priority"])


def _clear_other_defaults(pool: Pool) -> None:
    """Unset ``is_default`` on every other pool of the tenant (call with the tenant locked). The pools
    are locked as they are read: one that a deletion holds is waited for, and left out once deleted
    (read unlocked, its write would find no row, and fail the request)."""
    for other in Pool.objects.select_for_update().filter(is_default=True).exclude(pk=pool.pk):
        other.is_default = False
        other.save(update_fields=["is_default", "updated_at"])


@transaction.atomic
def pool_create(
    *,
    name: str,
    strategy: str = Pool.Strategy.ROUND_ROBIN,
    is_default: bool = False,
    max_concurrency: int | None = None,
    rate_per_s: float | None = None,
    burst: int | None = None,
    members: Sequence[MemberSpec] = (),
) -> Pool:
    """Create a pool with its members. Becoming the default unsets the previous default pool."""
    enforce_ceiling("pools", Pool.objects.all())  # also locks the tenant: default switches serialize
    pool = Pool(name=name, strategy=strategy, is_default=is_default)
    if is_default:  # the pools before the members' connections, in the order pool_update takes them
        _clear_other_defaults(pool)
    resolved = _resolve_members(members)
    _apply_limits(pool, max_concurrency=max_concurrency, rate_per_s=rate_per_s, burst=burst)
    _save(pool)
    _set_members(pool, resolved)
    log.info("pool_created", pool_id=str(pool.pk), members=len(resolved), is_default=is_default)
    return pool


@transaction.atomic
def pool_update(
    *,
    pool: Pool,
    name: str | _Unset = UNSET,
    strategy: str | _Unset = UNSET,
    is_default: bool | _Unset = UNSET,
    max_concurrency: int | _Unset | None = UNSET,
    rate_per_s: float | _Unset | None = UNSET,
    burst: int | _Unset | None = UNSET,
    members: Sequence[MemberSpec] | _Unset = UNSET,
) -> Pool:
    """Change a pool; ``members`` (when given) replaces the member set.

    Renaming a pool renames it in the rules that route to it, in the same
    transaction, so routing never points at a name that no longer exists.
    """
    if is_default is True:
        lock_tenant_row()  # default switches serialize, as pool_create's ceiling check does
    row: Pool = _locked(Pool, pool.pk)
    if is_default is not UNSET:
        if is_default and not row.is_default:
            _clear_other_defaults(row)
        row.is_default = is_default
    # The members' connections after every pool this locks, its own and the default it replaces: a
    # change of another pool's members locks that pool, then the connections, and taken the other way
    # round the two at once each waited for the other (PostgreSQL aborted one as a deadlock).
    resolved = None if members is UNSET else _resolve_members(members)
    old_name = row.name
    if name is not UNSET:
        row.name = name
    if strategy is not UNSET:
        row.strategy = strategy
    _apply_limits(row, max_concurrency=max_concurrency, rate_per_s=rate_per_s, burst=burst)
    _save(row)
    if row.name != old_name:
        for rule in selectors.rules_using_pool(old_name).select_for_update():
            rule.action = {**rule.action, "pool": row.name}
            rule.save(update_fields=["action", "updated_at"])
    if resolved is not None:
        _set_members(row, resolved)
    log.info("pool_updated", pool_id=str(row.pk))
    return row


@transaction.atomic
def pool_delete(*, pool: Pool) -> None:
    """Delete a pool and its memberships. Refused (``409 conflict``) while a rule routes to it."""
    row: Pool = _locked(Pool, pool.pk)
    users = list(selectors.rules_using_pool(row.name).values_list("name", flat=True))
    if users:
        raise Conflict(
            f"Pool '{row.name}' is used by rule(s) {', '.join(users)}; change or delete them first.",
            details={"rules": users},
        )
    pool_id = str(row.pk)
    row.delete()
    log.info("pool_deleted", pool_id=pool_id)


# --- rules -----------------------------------------------------------------------------------


def _lock_pool_named(name: str) -> Pool | None:
    """The tenant's pool named ``name``, locked against rename and delete until commit."""
    return Pool.objects.select_for_update(no_key=True).filter(name=name).first()


def rule_validate(*, match: Any = UNSET, action: Any = UNSET) -> tuple[dict[str, Any], dict[str, Any]]:
    """Normalized ``match`` and ``action`` (``{}`` for those not given), checked for the tenant in context.

    The action's pool must be one of the tenant's pools (locked until commit)
    and its tier one the plan allows. Raises ``400 invalid`` naming the field.
    """
    clean_match: dict[str, Any] = {}
    clean_action: dict[str, Any] = {}
    with _field_errors():
        if match is not UNSET:
            clean_match = validate_match(match)
        if action is not UNSET:
            tiers = effective_entitlements(current_tenant()).allowed_tiers
            clean_action = validate_action(action, allowed_tiers=tiers)
    if "pool" in clean_action and _lock_pool_named(clean_action["pool"]) is None:
        raise invalid("action.pool", f"Unknown pool '{clean_action['pool']}'.")
    return clean_match, clean_action


@transaction.atomic
def rule_create(
    *, name: str, priority: int, action: dict[str, Any], match: Any = None, enabled: bool = True
) -> Rule:
    """Create a rule (``match`` defaults to matching every step). ``priority`` is unique per tenant."""
    enforce_ceiling("rules", Rule.objects.all())
    clean_match, clean_action = rule_validate(match={} if match is None else match, action=action)
    rule = Rule(name=name, priority=priority, enabled=enabled, match=clean_match, action=clean_action)
    _save(rule)
    log.info("rule_created", rule_id=str(rule.pk), priority=priority)
    return rule


@transaction.atomic
def rule_update(
    *,
    rule: Rule,
    name: str | _Unset = UNSET,
    priority: int | _Unset = UNSET,
    enabled: bool | _Unset = UNSET,
    match: Any = UNSET,
    action: Any = UNSET,
) -> Rule:
    """Change a rule; a given ``match`` or ``action`` is validated as on create."""
    # The pool is locked before the rule, in the order pool_update takes them (no deadlock).
    clean_match, clean_action = rule_validate(match=match, action=action)
    row: Rule = _locked(Rule, rule.pk)
    if name is not UNSET:
        row.name = name
    if priority is not UNSET:
        row.priority = priority
    if enabled is not UNSET:
        row.enabled = enabled
    if match is not UNSET:
        row.match = clean_match
    if action is not UNSET:
        row.action = clean_action
    _save(row)
    log.info("rule_updated", rule_id=str(row.pk))
    return row


@transaction.atomic
def rule_delete(*, rule: Rule) -> None:
    """Delete a rule."""
    rule_id = str(rule.pk)
    _locked(Rule, rule.pk).delete()
    log.info("rule_deleted", rule_id=rule_id)


# --- fairness keys ---------------------------------------------------------------------------


def _checked_key(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_FAIRNESS_KEY:
        raise invalid("key", f"A non-empty string of at most {MAX_FAIRNESS_KEY} characters.")
    return key


def _checked_weight(weight: Any) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_FAIRNESS_KEY_WEIGHT:
        raise invalid("weight", f"An integer from 1 to {MAX_FAIRNESS_KEY_WEIGHT}.")
    return weight


@transaction.atomic
def fairness_key_create(*, key: str, weight: int) -> FairnessKey:
    """Give one of the tenant's fairness keys a weight (other keys weigh 1): its backlogged work gets
    ``weight`` shares of the tenant's dispatches to one of a key of weight 1. The fair queue follows
    once the change commits (``scheduling.fairness_keys``)."""
    row = FairnessKey(key=_checked_key(key), weight=_checked_weight(weight))
    enforce_ceiling("fairness_keys", FairnessKey.objects.all())
    _save(row)
    log.info("fairness_key_created", fairness_key_id=str(row.pk), weight=row.weight)
    return row


@transaction.atomic
def fairness_key_update(*, fairness_key: FairnessKey, weight: int) -> FairnessKey:
    """Change a key's weight (a key itself is never renamed: delete it and create another)."""
    row: FairnessKey = _locked(FairnessKey, fairness_key.pk)
    row.weight = _checked_weight(weight)
    _save(row)
    log.info("fairness_key_updated", fairness_key_id=str(row.pk), weight=row.weight)
    return row


@transaction.atomic
def fairness_key_delete(*, fairness_key: FairnessKey) -> None:
    """The key weighs 1 again."""
    row: FairnessKey = _locked(FairnessKey, fairness_key.pk)
    row.delete()
    log.info("fairness_key_deleted", fairness_key_id=str(fairness_key.pk))


# --- routing ---------------------------------------------------------------------------------


def routing_explain(
    *,
    workflow: str,
    action: str,
    tags: Sequence[str] = (),
    input: Any = None,
    tier: str | None = None,
    pool: str | None = None,
) -> Explanation:
    """How a hypothetical step would be routed and admitted now. Consumes nothing: no slot, no
    rate token, no round-robin turn; writes nothing."""
    step = Step(
        workflow=workflow, action=action, tags=tuple(tags), input={} if input is None else input,
        tier=tier, pool=pool,
    )
    return explain(step)

"""Shapes of the routing API: what it reads and what it accepts.

Write serializers check types and ranges and refuse unknown fields; what needs
the tenant's data (a member's connection, a rule's pool, the plan's tiers,
uniqueness) or the stored row (a connection's config under a changed kind) is
checked by ``scheduling.services``. Errors name fields by their dotted path
from the request root: ``members[1].weight``, ``config.base_url``.

A connection's secret is write-only: reads show ``has_secret`` and never the
secret or its encrypted token.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ductor_project.core import capacity
from ductor_project.core.bounds import MAX_NAME_CHARS, MAX_REASON_CHARS, MAX_TAG_CHARS, MAX_TAGS
from ductor_project.core.errors import UnknownFields, flat_details
from ductor_project.core.openapi import ComponentJSONField, JSONValueField, component_ref
from scheduling.models import (
    MAX_FAIRNESS_KEY,
    MAX_FAIRNESS_KEY_WEIGHT,
    Connection,
    FairnessKey,
    Pool,
    PoolMember,
    Rule,
)
from scheduling.rules import MAX_GLOB_CHARS, MAX_PARTITION_KEY
from scheduling.services import MemberSpec
from scheduling.templates import (
    MAX_CONDITIONS,
    MAX_IN_VALUES,
    MAX_PATH_CHARS,
    MAX_PATH_SEGMENTS,
    MAX_VALUE_CHARS,
    MAX_VALUE_JSON_CHARS,
    OPERATORS,
)
from tenants.api import NameField, PatternField, StrictModelSerializer, StrictSerializer
from tenants.models import Tier

INT_MAX = 2**31 - 1
MAX_RATE_PER_S = capacity.MAX_RATE_PER_S
MAX_SECRET_CHARS = 8192
MAX_MEMBERS = 200
# Names of connections and pools are identifiers: members and rules refer to them.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,99}$"
NAME_HELP = "Letters, digits and '_.:-' (starting with a letter or digit), at most 100; unique per tenant."


def parse(
    serializer_class: type[serializers.Serializer], data: Any, *, partial: bool = False
) -> dict[str, Any]:
    """Validated data of a request body, or ``400`` naming every bad field by its dotted path.

    With ``partial`` (PATCH) only the fields given are returned; otherwise
    (POST, PUT) absent optional fields come back with their defaults.
    """
    serializer = serializer_class(data=data, partial=partial)
    if not serializer.is_valid():
        raise serializers.ValidationError(flat_details(serializer.errors))
    return dict(serializer.validated_data)


class LimitsWriteMixin(serializers.Serializer):
    """Optional concurrency and rate limits. A rate gets a burst (default 1); no rate means no burst."""

    max_concurrency = serializers.IntegerField(min_value=1, max_value=INT_MAX, allow_null=True, default=None)
    rate_per_s = serializers.FloatField(
        min_value=capacity.MIN_RATE_PER_S, max_value=MAX_RATE_PER_S, allow_null=True, default=None,
        help_text=f"Starts per second (GCRA); from {capacity.MIN_RATE_PER_S:g} to {MAX_RATE_PER_S:g}.",
    )
    burst = serializers.IntegerField(
        min_value=1, max_value=INT_MAX, allow_null=True, default=None,
        help_text="Starts allowed at once from idle; needs rate_per_s (default 1 when a rate is set).",
    )


# --- connections -----------------------------------------------------------------------------


class ConnectionSerializer(StrictModelSerializer):
    has_secret = serializers.BooleanField(read_only=True, help_text="Whether a secret is set (never shown).")

    class Meta:
        model = Connection
        fields = [
            "id", "name", "kind", "config", "has_secret", "max_concurrency", "rate_per_s", "burst",
            "created_at", "updated_at",
        ]
        read_only_fields = fields


class ConnectionConfigField(ComponentJSONField):
    """A connection's ``config``: an object (``scheduling.connection_config`` checks it for its kind)."""

    component = "ConnectionConfig"

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return {cls.component: {"type": "object", "additionalProperties": True,
                                "description": "The connection's settings, as its kind takes them."}}


class ConnectionWriteSerializer(LimitsWriteMixin, StrictSerializer):
    name = PatternField(NAME_PATTERN, max_length=100, rule=NAME_HELP)
    kind = serializers.ChoiceField(choices=Connection.Kind.choices)
    config = ConnectionConfigField(
        default=dict,
        help_text=(
            "http: {base_url (required), headers, timeout_s (default 10, at most 300), "
            "max_response_bytes (default 1 MiB, at most 50 MiB)}; celery: {queue (required), broker (default "
            "`default`)}, where a task node's attempt is sent; python: any object up to 64 KiB."
        ),
    )
    secret = serializers.CharField(
        write_only=True, required=False, allow_blank=True, trim_whitespace=False, max_length=MAX_SECRET_CHARS,
        help_text="Stored encrypted, never returned. Omitted: unchanged; empty string: removed.",
    )


class SecretSerializer(StrictSerializer):
    secret = serializers.CharField(write_only=True, trim_whitespace=False, max_length=MAX_SECRET_CHARS)


# --- pools -----------------------------------------------------------------------------------


class PoolMemberSerializer(StrictModelSerializer):
    connection = serializers.UUIDField(source="connection_id", read_only=True)
    connection_name = serializers.CharField(source="connection.name", read_only=True)

    class Meta:
        model = PoolMember
        fields = ["connection", "connection_name", "weight", "priority"]
        read_only_fields = fields


class PoolSerializer(StrictModelSerializer):
    members = PoolMemberSerializer(many=True, read_only=True)

    class Meta:
        model = Pool
        fields = [
            "id", "name", "strategy", "is_default", "max_concurrency", "rate_per_s", "burst", "members",
            "created_at", "updated_at",
        ]
        read_only_fields = fields


class PoolMemberWriteSerializer(StrictSerializer):
    connection = serializers.CharField(max_length=100, help_text="Id or name of one of your connections.")
    weight = serializers.IntegerField(min_value=0, max_value=1_000_000, default=1)
    priority = serializers.IntegerField(
        min_value=0, max_value=INT_MAX, default=0, help_text="Failover order: lower goes first."
    )

    def validate(self, attrs: dict[str, Any]) -> Any:
        # A member is whole even in a PATCH of its pool (where DRF would skip required fields).
        if "connection" not in attrs:
            raise serializers.ValidationError({"connection": ["This field is required."]})
        return MemberSpec(**attrs)


MEMBER_FIELDS = frozenset(PoolMemberWriteSerializer().fields)


class PoolWriteSerializer(LimitsWriteMixin, StrictSerializer):
    name = PatternField(NAME_PATTERN, max_length=100, rule=NAME_HELP)
    strategy = serializers.ChoiceField(choices=Pool.Strategy.choices, default=Pool.Strategy.ROUND_ROBIN)
    is_default = serializers.BooleanField(
        default=False, help_text="Route here when no rule matches; setting it unsets the previous default."
    )
    members = PoolMemberWriteSerializer(
        many=True, default=list, help_text=f"At most {MAX_MEMBERS}. Given: replaces the pool's members."
    )

    def validate_members(self, value: list[MemberSpec]) -> list[MemberSpec]:
        if len(value) > MAX_MEMBERS:
            raise serializers.ValidationError(f"At most {MAX_MEMBERS} members.")
        return value

    def to_internal_value(self, data: Any) -> Any:
        members = data.get("members") if isinstance(data, dict) else None
        if isinstance(members, list):
            unknown = [
                f"members[{index}].{key}"
                for index, member in enumerate(members) if isinstance(member, dict)
                for key in member if key not in MEMBER_FIELDS
            ]
            if unknown:
                raise UnknownFields(unknown)
        return super().to_internal_value(data)


# --- rules -----------------------------------------------------------------------------------

# One segment of a condition's path, as scheduling.templates reads it.
PATH_SEGMENT = r"[A-Za-z0-9_\-]+"


def condition_schema(path: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI schema of one condition of ``scheduling.templates`` whose path is ``path`` (at most
    ``MAX_PATH_CHARS`` characters, whatever its pattern)."""
    return {
        "type": "object",
        "description": "Holds when the value at `path` compares with `value` by `op`.",
        "required": ["path", "op"],
        "properties": {
            "path": {**path, "maxLength": MAX_PATH_CHARS},
            "op": {"type": "string", "enum": list(OPERATORS)},
            "value": {"description": f"Required but for `exists` (true or false; default true): a list of at most "
                                     f"{MAX_IN_VALUES} values for `in`, a number for `gt` and `lt`, a string for "
                                     f"`prefix`, any JSON for `eq` and `ne`. Each string in it (a key too) at most "
                                     f"{MAX_VALUE_CHARS} characters, the whole at most {MAX_VALUE_JSON_CHARS} "
                                     "characters as JSON."},
        },
        "additionalProperties": False,
    }


def condition_tree(
    names: tuple[str, str, str, str], description: str, path: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """A condition tree's components, by ``names`` (the tree, its ``all``, its ``any``, one condition):
    one condition, or ``all`` or ``any`` of a list of them, each condition's path ``path``."""
    tree, every, some, condition = names
    conditions = {"type": "array", "items": component_ref(condition), "minItems": 1, "maxItems": MAX_CONDITIONS}
    return {
        tree: {"description": description,
               "oneOf": [component_ref(condition), component_ref(every), component_ref(some)]},
        every: {"type": "object", "description": "Every condition holds.", "required": ["all"],
                "properties": {"all": conditions}, "additionalProperties": False},
        some: {"type": "object", "description": "At least one condition holds.", "required": ["any"],
               "properties": {"any": conditions}, "additionalProperties": False},
        condition: condition_schema(path),
    }


def rule_components() -> dict[str, dict[str, Any]]:
    """``RuleMatch``, ``RuleAction`` and their parts: what ``scheduling.rules`` validates. Pure."""
    glob = "A glob on the {} name: letters, digits, `._-:/` and the wildcards `*?[]!`."
    return {
        "RuleMatch": {
            "type": "object",
            "description": "What a step must be for the rule to apply; `{}` matches every step.",
            "properties": {
                "workflow": {"type": "string", "minLength": 1, "maxLength": MAX_GLOB_CHARS,
                             "description": glob.format("workflow")},
                "action": {"type": "string", "minLength": 1, "maxLength": MAX_GLOB_CHARS,
                           "description": glob.format("action")},
                "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": MAX_TAG_CHARS},
                         "maxItems": MAX_TAGS, "description": "Tags the step must all have."},
                "conditions": {"type": "array", "items": component_ref("RuleCondition"), "maxItems": MAX_CONDITIONS,
                               "description": "Conditions on the step that must all hold."},
            },
            "additionalProperties": False,
        },
        "RuleCondition": condition_schema({
            "type": "string", "pattern": rf"^{PATH_SEGMENT}(?:\.{PATH_SEGMENT}){{0,{MAX_PATH_SEGMENTS - 1}}}$",
            "description": "`input.<path>` (the step's input), `workflow` or `action`. A path without one of "
                           "these roots is read under `input.` (deprecated).",
        }),
        # RuleDeny first: a generated client takes the first alternative that parses, and every
        # property of RuleRoute is optional, so a deny would parse as an empty route.
        "RuleAction": {
            "description": "That a matching step is refused (`RuleDeny`), or where it goes (`RuleRoute`).",
            "oneOf": [component_ref("RuleDeny"), component_ref("RuleRoute")],
        },
        "RuleRoute": {
            "type": "object",
            "description": "Any of a pool, a tier, a partition key and a fairness key for the step; at least one.",
            "properties": {
                "pool": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS,
                         "description": "The name of one of your pools."},
                "tier": {"type": "string", "enum": list(Tier.values), "description": "A tier your plan allows."},
                "partition_key": {
                    "type": "string", "minLength": 1, "maxLength": MAX_PARTITION_KEY,
                    "description": f"A template of the routing language, at most {MAX_PARTITION_KEY} characters "
                                   "as sent, such as `customer-{{ $input.customer.id }}`.",
                },
                "fairness_key": {
                    "type": "string", "minLength": 1, "maxLength": MAX_PARTITION_KEY,
                    "description": "The step's fairness key inside your tenant, a template like `partition_key` "
                                   "(`{{ $input.customer_id }}`): your backlogged keys share your dispatches by "
                                   "weight.",
                },
            },
            "minProperties": 1,
            "additionalProperties": False,
        },
        "RuleDeny": {
            "type": "object",
            "description": "Refuse the step, for this reason.",
            "required": ["deny"],
            "properties": {"deny": {"type": "string", "minLength": 1, "maxLength": MAX_REASON_CHARS}},
            "additionalProperties": False,
        },
    }


class RuleMatchField(ComponentJSONField):
    """A rule's ``match``: a ``JSONField`` whose schema is ``RuleMatch``."""

    component = "RuleMatch"

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return rule_components()


class RuleActionField(ComponentJSONField):
    """A rule's ``action``: a ``JSONField`` whose schema is ``RuleAction``."""

    component = "RuleAction"

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return rule_components()


class RuleSerializer(StrictModelSerializer):
    match = RuleMatchField(read_only=True)
    action = RuleActionField(read_only=True)

    class Meta:
        model = Rule
        fields = ["id", "name", "priority", "enabled", "match", "action", "created_at", "updated_at"]
        read_only_fields = fields


class RuleWriteSerializer(StrictSerializer):
    name = NameField(max_length=100)
    priority = serializers.IntegerField(
        min_value=-INT_MAX, max_value=INT_MAX, help_text="Lower is evaluated first; unique per tenant."
    )
    enabled = serializers.BooleanField(default=True)
    match = RuleMatchField(
        default=dict,
        help_text=(
            'Any of {"workflow": glob, "action": glob, "tags": [...], "conditions": '
            '[{"path": "a.b", "op": "eq|ne|in|exists|prefix|gt|lt", "value": ...}]}; {} matches every step.'
        ),
    )
    action = RuleActionField(
        help_text='Any of {"pool": name, "tier": tier, "partition_key": template, "fairness_key": template}, or '
                  '{"deny": reason} alone.'
    )


# --- fairness keys ---------------------------------------------------------------------------


class FairnessKeySerializer(StrictModelSerializer):
    class Meta:
        model = FairnessKey
        fields = ["id", "key", "weight", "created_at", "updated_at"]
        read_only_fields = fields


class FairnessKeyWeightSerializer(StrictSerializer):
    weight = serializers.IntegerField(
        min_value=1, max_value=MAX_FAIRNESS_KEY_WEIGHT,
        help_text="Shares of the tenant's dispatches the key's backlogged work gets, to one of a key of weight 1.",
    )


class FairnessKeyWriteSerializer(FairnessKeyWeightSerializer):
    key = serializers.CharField(
        max_length=MAX_FAIRNESS_KEY, trim_whitespace=False,
        help_text="The fairness key, as runs carry it (given at their start or set by a rule).",
    )


# --- routing dry run -------------------------------------------------------------------------


# A string checked against the tiers (validate_tier words the refusal), typed as their enum.
@extend_schema_field({"type": "string", "enum": list(Tier.values)})
class TierNameField(serializers.CharField):
    """A tier's name."""


class ExplainSerializer(StrictSerializer):
    """A hypothetical step."""

    workflow = serializers.CharField(max_length=200)
    action = serializers.CharField(max_length=200)
    tags = serializers.ListField(  # as sent, spaces too, as a node's and a rule's are matched
        child=serializers.CharField(max_length=MAX_TAG_CHARS, trim_whitespace=False), max_length=MAX_TAGS,
        default=list,
    )
    input = JSONValueField(default=dict)
    tier = TierNameField(
        allow_null=True, default=None, help_text=f"One of {', '.join(Tier.values)}; the plan must allow it."
    )
    pool = serializers.CharField(
        max_length=100, allow_null=True, default=None, help_text="The step's pool hint (rules come first)."
    )

    def validate_tier(self, value: str | None) -> str | None:
        if value is not None and value not in Tier.values:
            raise serializers.ValidationError(f"Must be one of {', '.join(Tier.values)}.")
        return value


class CandidateSerializer(serializers.Serializer):
    connection_id = serializers.CharField()
    name = serializers.CharField()
    weight = serializers.IntegerField()
    priority = serializers.IntegerField()
    breaker = serializers.ChoiceField(choices=["closed", "open", "half_open"])
    in_flight = serializers.IntegerField()
    limit = serializers.IntegerField(allow_null=True)
    eligible = serializers.BooleanField()
    why = serializers.CharField()


class AdmissionSerializer(serializers.Serializer):
    """How the fair queue would admit an item of the pool now (nothing is taken by asking)."""

    admitted = serializers.BooleanField(help_text="A slot, a rate token and a connection are free now.")
    why = serializers.CharField(help_text="Why this connection, or what the item would wait for.")
    parked = serializers.BooleanField(help_text="It would wait for a slot of the pool or its connections.")
    retry_at_ms = serializers.IntegerField(
        allow_null=True, help_text="When a rate or a breaker would let it be looked at again (Unix ms)."
    )
    pool_in_flight = serializers.IntegerField()
    pool_limit = serializers.IntegerField(allow_null=True)


_TEXT = {"type": "string"}
TRACE_RULE, TRACE_MATCHED_RULE, TRACE_DEFAULT_RULE = "TraceRule", "TraceMatchedRule", "TraceDefaultRule"
TRACE_POOL, TRACE_CONNECTION = "TracePool", "TraceConnection"
POOL_STRATEGY = "StrategyEnum"  # a pool's strategy, as drf-spectacular names it (SPECTACULAR_SETTINGS)


def trace_components() -> dict[str, dict[str, Any]]:
    """The parts of a routing trace (``routing.RoutingDecision.trace()``) that are objects, each a named
    component: the dry run's trace and a step attempt's (``workflows.serializers.StepRouting``) refer to
    the same ones, so a generated client has one class for each. Pure."""
    named = {"type": "object", "required": ["id", "name"], "additionalProperties": True}
    return {
        TRACE_MATCHED_RULE: {**named, "required": ["id", "name", "priority"], "description": "The rule that matched.",
                             "properties": {"id": _TEXT, "name": _TEXT, "priority": {"type": "integer"}}},
        TRACE_DEFAULT_RULE: {"type": "string", "enum": ["default"], "description": "No rule matched."},
        TRACE_RULE: {"description": "The rule that matched, or `default` when none did.",
                     "oneOf": [component_ref(TRACE_MATCHED_RULE), component_ref(TRACE_DEFAULT_RULE)]},
        TRACE_POOL: {**named, "description": "The step's pool.",
                     "properties": {"id": _TEXT, "name": _TEXT, "strategy": component_ref(POOL_STRATEGY)}},
        TRACE_CONNECTION: {**named, "description": "A connection of the step's pool.",
                           "properties": {"id": _TEXT, "name": _TEXT}},
    }


class TraceRuleField(ComponentJSONField):
    """A trace's ``rule``."""

    component = TRACE_RULE

    @classmethod
    def components(cls) -> dict[str, dict[str, Any]]:
        return trace_components()


class TracePoolField(TraceRuleField):
    """A trace's ``pool`` (null: none)."""

    component = TRACE_POOL


class TraceConnectionField(TraceRuleField):
    """A trace's ``connection`` (null: none)."""

    component = TRACE_CONNECTION


class DecisionTraceSerializer(serializers.Serializer):
    """The routing decision and how admission would treat it now (``routing.Explanation.trace()``)."""

    allowed = serializers.BooleanField()
    reason = serializers.CharField()
    rule = TraceRuleField(help_text='{"id", "name", "priority"} of the rule that matched, or "default".')
    tier = serializers.ChoiceField(
        choices=list(Tier.values), help_text="The tier it would run in: a tier the plan allows, or the one refused."
    )
    partition_key = serializers.CharField(allow_null=True)
    fairness_key = serializers.CharField(allow_null=True)
    pool = TracePoolField(allow_null=True, help_text='{"id", "name", "strategy"} or null.')
    candidates = CandidateSerializer(many=True)
    connection = TraceConnectionField(
        allow_null=True, help_text='{"id", "name"} of the connection admission would choose now, or null.'
    )
    admission = AdmissionSerializer(allow_null=True, help_text="Null when the step has no pool or is refused.")


class TierQueueSerializer(serializers.Serializer):
    backlog = serializers.IntegerField(help_text="Items waiting, due or not.")
    due = serializers.IntegerField(help_text="Items waiting and due now.")
    in_flight = serializers.IntegerField()
    oldest_waiting_ms = serializers.IntegerField(help_text="Age of the oldest due item.")


class WorkShareSerializer(serializers.Serializer):
    """A tenant's share of the worker time of its queue shard over the last minute."""

    tenant_id = serializers.UUIDField()
    weight = serializers.IntegerField()
    work_ms = serializers.FloatField(help_text="The work its items did, as their workers measured it.")
    share = serializers.FloatField(help_text="Its fraction of all the customer work of the shard.")
    fair_share = serializers.FloatField(
        help_text="The fraction its weight entitles it to among the tenants that had work then.")


class KeyShareSerializer(serializers.Serializer):
    """One of the tenant's fairness keys' share of the tenant's worker time over the last minute."""

    key = serializers.CharField(help_text='The fairness key ("": work of no key).')
    weight = serializers.IntegerField()
    work_ms = serializers.FloatField(help_text="The work its items did, as their workers measured it.")
    share = serializers.FloatField(help_text="Its fraction of the tenant's work.")
    fair_share = serializers.FloatField(
        help_text="The fraction its weight entitles it to among the tenant's keys that had work then.")


class TenantWorkSerializer(WorkShareSerializer):
    keys = KeyShareSerializer(many=True, help_text="The tenant's fairness keys that did the most work, most "
                                                   "first (empty when none of its work had a key).")


class QueueStatsSerializer(serializers.Serializer):
    """The tenant's own queue; nothing of other tenants."""

    tiers = serializers.DictField(child=TierQueueSerializer())
    backlog = serializers.IntegerField()
    due = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    oldest_waiting_ms = serializers.IntegerField()
    work = TenantWorkSerializer(help_text="Its share of worker time over the last minute, and its keys'.")


class GlobalTierQueueSerializer(serializers.Serializer):
    ready_tenants = serializers.IntegerField()
    blocked_tenants = serializers.IntegerField()
    virtual_time = serializers.FloatField()


class GlobalQueueStatsSerializer(serializers.Serializer):
    shard = serializers.IntegerField()
    tiers = serializers.DictField(child=GlobalTierQueueSerializer())
    timers = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    expired_leases = serializers.IntegerField()
    worker_slots = serializers.DictField(child=serializers.IntegerField())
    busy = serializers.DictField(child=serializers.IntegerField())
    work_shares = WorkShareSerializer(many=True, help_text="The tenants that did the most work over the last "
                                                           "minute, with their shares of it, most first.")
    dispatchers = serializers.ListField(
        child=serializers.CharField(),
        help_text="The live dispatchers that serve this shard. Empty: none does, and its due items wait "
                  "until one does (a dispatcher died and its beat is not stale yet, or every dispatcher "
                  "runs with --shards that leave it out).")

"""Reads of the workflow engine. Lookups answer ``NotFound`` for other tenants' rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import (
    F,
    Func,
    IntegerField,
    JSONField,
    OuterRef,
    Prefetch,
    QuerySet,
    Subquery,
    TextField,
    prefetch_related_objects,
)
from django.db.models.functions import Cast, Coalesce

from tenants.selectors import first_or_404, parse_uuid
from workflows.engine.attempts import version_spec
from workflows.models import RunEvent, StepRun, WorkflowDefinition, WorkflowRun, WorkflowVersion


def workflow_list(*, archived: bool = False) -> QuerySet[WorkflowDefinition]:
    """The tenant's active (or archived) workflows by name, each with its latest spec (``latest_spec``):
    one query."""
    latest = WorkflowVersion.objects.filter(definition=OuterRef("pk")).order_by("-number").values("spec")[:1]
    return (WorkflowDefinition.objects.filter(archived_at__isnull=not archived)
            .annotate(latest_spec=Subquery(latest, output_field=JSONField())).order_by("name"))


def get_workflow_for_tenant(name: str) -> WorkflowDefinition:
    return first_or_404(WorkflowDefinition.objects.filter(name=name))


def version_list(definition: WorkflowDefinition) -> QuerySet[WorkflowVersion]:
    return WorkflowVersion.objects.filter(definition=definition).order_by("-number")


def run_list(filters: dict[str, Any]) -> QuerySet[WorkflowRun]:
    qs = WorkflowRun.objects.all()
    if filters.get("status"):
        qs = qs.filter(status=filters["status"])
    if filters.get("workflow"):
        qs = qs.filter(workflow_name=filters["workflow"])
    if filters.get("created_after"):
        qs = qs.filter(created_at__gte=filters["created_after"])
    if filters.get("created_before"):
        qs = qs.filter(created_at__lt=filters["created_before"])
    if filters.get("root_run_id"):
        qs = qs.filter(root_run_id=filters["root_run_id"])
    if filters.get("tag"):  # ``tags @> [...]``: every one
        qs = qs.filter(tags__contains=sorted(set(filters["tag"])))
    if filters.get("fairness_key"):
        qs = qs.filter(fairness_key=filters["fairness_key"])
    return qs


def with_version_numbers(runs: list[WorkflowRun]) -> list[WorkflowRun]:
    """``runs``, each with its version read (its number, not its spec) in one query for them all:
    a page of the run list shows each run's version, which read alone cost a query per run."""
    prefetch_related_objects(runs, Prefetch("workflow", queryset=WorkflowVersion.objects.only("tenant", "number")))
    return runs


def with_successors(runs: list[WorkflowRun]) -> list[WorkflowRun]:
    """``runs``, each that continued as new with the id of the run it continued as
    (``continued_as``), read in one query for them all: a page of the run list shows it."""
    continued = [run.pk for run in runs if run.status == WorkflowRun.Status.CONTINUED]
    found = dict(WorkflowRun.objects.filter(continued_from__in=continued).values_list("continued_from_id", "pk")
                 if continued else [])
    for run in runs:
        run.continued_as_id = found.get(run.pk)  # type: ignore[attr-defined]
    return runs


def continued_as(run: WorkflowRun) -> Any:
    """The id of the run ``run`` continued as (ContinueAsNew), or None: read once per run, unless
    ``with_successors`` read it for a page."""
    if run.status != WorkflowRun.Status.CONTINUED:
        return None
    if hasattr(run, "continued_as_id"):
        return run.continued_as_id
    return WorkflowRun.objects.filter(continued_from=run).values_list("pk", flat=True).first()


def get_run_for_tenant(run_id: Any) -> WorkflowRun:
    """A run of the tenant in context, or ``NotFound`` (also for another tenant's run)."""
    return first_or_404(
        WorkflowRun.objects.select_related("workflow").filter(pk=parse_uuid(run_id))
    )


def waited_on_by_parent(run: WorkflowRun) -> bool:
    """Whether ``run`` is a child whose parent's ``subworkflow`` node waits for it (``"wait": true``,
    the default), so that the child's end is its parent's: False for a root run, and for a child
    started with ``"wait": false``, which runs on by itself. A ContinueAsNew successor answers as
    the first run of its chain, whose parent and node it keeps."""
    if run.parent_run_id is None:
        return False
    parent = WorkflowRun.objects.filter(pk=run.parent_run_id).only("id", "workflow_id").first()
    if parent is None:
        return False
    nodes = version_spec(parent.workflow_id).get("nodes", [])
    node = next((node for node in nodes if node["id"] == run.parent_node_id), None)
    return node is None or bool(node.get("wait", True))


def run_steps(run: WorkflowRun) -> QuerySet[StepRun]:
    return StepRun.objects.filter(run=run).order_by("created_at", "id")


# What a step row costs a response besides its payloads: ids, statuses, times, keys.
STEP_ROW_BYTES = 400
PAYLOADS = ("input", "output", "error", "routing", "heartbeat_details")


class _OctetLength(Func):
    function = "octet_length"
    output_field = IntegerField()


def sized(steps: QuerySet[StepRun]) -> QuerySet[StepRun]:
    """``steps`` with the bytes each would take in a response (``response_bytes``), their payloads
    measured by the database and not loaded."""
    total: Any = STEP_ROW_BYTES
    for name in PAYLOADS:
        total = total + Coalesce(_OctetLength(Cast(F(name), TextField())), 0)
    return steps.defer(*PAYLOADS).annotate(response_bytes=total)


def within_bytes(rows: Sequence[StepRun], max_bytes: int, *, at_least_one: bool = False) -> int:
    """How many of ``rows`` (``sized``) fit in ``max_bytes``, in order."""
    used = 0
    for count, row in enumerate(rows):
        used += row.response_bytes  # type: ignore[attr-defined]
        if used > max_bytes:
            return max(count, 1) if at_least_one else count
    return len(rows)


def loaded(rows: Sequence[StepRun]) -> list[StepRun]:
    """The ``sized`` rows again, whole, in the same order (one query)."""
    whole = StepRun.objects.in_bulk([row.pk for row in rows])
    return [whole[row.pk] for row in rows]


@dataclass(frozen=True)
class StepsPreview:
    """The first steps of a run that fit a response, and how many it has in all."""

    steps: list[StepRun]
    total: int

    @property
    def truncated(self) -> bool:
        return len(self.steps) < self.total


def steps_preview(run: WorkflowRun, max_steps: int, max_bytes: int) -> StepsPreview:
    """The run's first steps, at most ``max_steps`` of them and ``max_bytes`` in all."""
    first = list(sized(run_steps(run))[:max_steps])
    kept = first[:within_bytes(first, max_bytes)]
    total = len(first) if len(first) < max_steps else run_steps(run).count()
    return StepsPreview(steps=loaded(kept), total=total)


def run_events(run: WorkflowRun) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(run=run).order_by("seq")


# A lineage answers its tree's first runs, this many at most, and this many levels deep (a child
# or a successor one level below its parent or predecessor): a ContinueAsNew loop makes a chain
# of thousands, each a level deeper, past what a JSON encoder or a client's parser nests.
MAX_LINEAGE_RUNS = 1000
MAX_LINEAGE_DEPTH = 64


def lineage(run: WorkflowRun) -> dict[str, Any]:
    """The tree of the run's root: children and ContinueAsNew successors, one tenant only; its
    first ``MAX_LINEAGE_RUNS`` runs, ``MAX_LINEAGE_DEPTH`` levels deep at most (``truncated`` says
    some are left out, ``runs`` counts them all; the run list's ``root_run_id`` filter has them)."""
    tree = WorkflowRun.objects.filter(root_run_id=run.root_run_id)
    rows = list(
        tree.order_by("created_at", "id")
        .values("id", "workflow_name", "status", "parent_run_id", "continued_from_id", "nesting_depth",
                "created_at")[:MAX_LINEAGE_RUNS + 1]
    )
    total = len(rows) if len(rows) <= MAX_LINEAGE_RUNS else tree.count()
    rows = rows[:MAX_LINEAGE_RUNS]
    fetched = {row["id"]: row for row in rows}

    def above_of(row: dict[str, Any]) -> Any:
        """The run it hangs under: the run it continued, else its parent, when that is in the tree."""
        return row["continued_from_id"] if row["continued_from_id"] in fetched else row["parent_run_id"]

    # Each run's level, from the links alone: its parent's or predecessor's row, written on another
    # host (a worker's clock behind the API's), may have an earlier ``created_at``.
    level: dict[Any, int] = {}
    for row in rows:
        path, at = [], row["id"]
        while at in fetched and at not in level:
            path.append(at)
            at = above_of(fetched[at])
        depth = level.get(at, -1)
        for each in reversed(path):
            depth += 1
            level[each] = depth
    nodes: dict[Any, dict[str, Any]] = {}
    roots = []
    for row in sorted(rows, key=lambda row: level[row["id"]]):  # a level at a time, each in creation order
        above, depth = above_of(row), level[row["id"]]
        if depth >= MAX_LINEAGE_DEPTH or (above in fetched and above not in nodes):
            continue  # left out, and so is everything below it
        node = nodes[row["id"]] = {**row, "children": [], "successor": None}
        if above not in nodes:
            roots.append(node)
        elif above == row["continued_from_id"]:
            nodes[above]["successor"] = node
        else:
            nodes[above]["children"].append(node)
    return {"root_run_id": str(run.root_run_id), "runs": total, "truncated": len(nodes) < total, "tree": roots}

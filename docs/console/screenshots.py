"""The screenshots of the run console in this folder: the run list, a run page (a retried step, a
child run) and the tenant page, rendered by headless Chromium from a real web server.

    .venv/bin/python docs/console/screenshots.py

- It runs on a data dir of its own (``.ductor/console-screenshots``), destroyed first and its
  servers stopped at the end: the embedded PostgreSQL and Redis, migrated.
- It seeds three tenants through the services (plans, workflows, connections, a pool and a rule,
  runs started for real, which wait in the fair queue since no worker runs) and writes the rows
  of a few finished and running runs with set times, as the engine would have: a run whose
  ``charge`` failed once and succeeded on its retry, while its ``ship`` waits for a child run.
  Their routing traces are real decisions of the seeded rule, with what admission adds.
- It starts the web server (``Stack.web``) on a free port and logs in through the admin's own
  login form, as a superuser and as a tenant's staff user, both made here with random passwords.
  Each page is saved as that user gets it, with a ``<base>`` naming the server (its CSS and
  scripts load from there), and ``chromium --headless --screenshot`` renders it. Nothing in the
  product changes for it: no login shortcut, no settings of its own.

Needs Debian's ``chromium`` package. Not a benchmark (``bench/run_all.py`` runs those).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
DATA_DIR = ROOT / ".ductor" / "console-screenshots"
WIDTH = 1400
MS = timedelta(milliseconds=1)

sys.path.insert(0, str(ROOT))

from bench._common import bench_stack, log  # noqa: E402


def setup() -> None:
    """Django on a fresh data dir of this script's own, with its embedded servers."""
    from ductor_project import embedded

    for name in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    embedded.destroy(DATA_DIR)
    os.environ["DUCTOR_DATA_DIR"] = str(DATA_DIR)
    os.environ.setdefault("DUCTOR_LOG_LEVEL", "WARNING")  # the seeding's and the server's logs are not the point
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ductor_project.settings")
    from bench._common import setup_django

    setup_django("console screenshots")


# --- seeding ------------------------------------------------------------------------------------

ORDERS = {"nodes": [
    {"id": "validate", "type": "action", "action": "echo"},
    {"id": "charge", "type": "action", "action": "echo", "tags": ["payments"], "depends_on": ["validate"],
     "retry": {"max_attempts": 3, "backoff_s": 1.0}},
    {"id": "ship", "type": "subworkflow", "workflow": "shipping", "depends_on": ["charge"]},
    {"id": "notify", "type": "action", "action": "echo", "depends_on": ["ship"]},
]}
SHIPPING = {"nodes": [
    {"id": "pack", "type": "action", "action": "echo"},
    {"id": "label", "type": "action", "action": "echo", "depends_on": ["pack"]},
]}
REPORT = {"nodes": [{"id": "aggregate", "type": "action", "action": "echo"}]}
IMPORT = {"nodes": [{"id": "item", "type": "action", "action": "echo"}]}


@dataclass
class Seeded:
    showcase: Any
    acme: Any
    staff: tuple[str, str]
    root: tuple[str, str]


def routing(connection: Any, admitted: str) -> dict[str, Any]:
    """The real decision of the seeded rule for a ``charge`` attempt, and what admission adds to it."""
    from scheduling.routing import route
    from scheduling.rules import Step

    trace = route(Step(workflow="orders", action="echo", tags=("payments",), input={"order": 1042})).trace()
    return {**trace, "connection": {"id": str(connection.pk), "name": connection.name}, "admitted": admitted}


def seed_routing() -> list[Any]:
    """Two payment connections in a failover pool, and the rule that sends payments there."""
    from scheduling import services as routing_services
    from scheduling.services import MemberSpec

    connections = [routing_services.connection_create(name=name, kind="http", config={"base_url": url})
                   for name, url in (("stripe-eu-1", "https://eu1.payments.example"),
                                     ("stripe-eu-2", "https://eu2.payments.example"))]
    routing_services.pool_create(name="payments", strategy="failover", members=[
        MemberSpec(connection="stripe-eu-1", priority=0), MemberSpec(connection="stripe-eu-2", priority=1)])
    routing_services.rule_create(name="eu payments", priority=10,
                                 match={"workflow": "orders", "tags": ["payments"]}, action={"pool": "payments"})
    return connections


def run_row(name: str, status: str, created: datetime, **fields: Any) -> Any:
    """A run's row (the tenant in context) as the engine leaves it, created at ``created``."""
    from workflows.models import WorkflowDefinition, WorkflowRun, WorkflowVersion

    definition = WorkflowDefinition.objects.get(name=name)
    version = WorkflowVersion.objects.get(definition=definition, number=definition.latest_version)
    run_id = uuid.uuid4()
    run = WorkflowRun.objects.create(id=run_id, root_run_id=fields.pop("root_run_id", run_id), workflow=version,
                                     workflow_name=name, status=status, **fields)
    WorkflowRun.objects.filter(pk=run.pk).update(created_at=created)
    run.refresh_from_db()
    return run


def step_row(run: Any, node_id: str, status: str, created: datetime, started: datetime | None,
             finished: datetime | None, attempt: int = 1, **fields: Any) -> Any:
    from workflows.models import StepRun

    kind = fields.pop("node_type", "action")
    step = StepRun.objects.create(run=run, node_id=node_id, node_type=kind, attempt=attempt, status=status,
                                  started_at=started, finished_at=finished, **fields)
    StepRun.objects.filter(pk=step.pk).update(created_at=created)
    return step


def seed_showcase(connections: list[Any], base: datetime) -> Any:
    """The run page's run: ``charge`` failed on stripe-eu-1, succeeded on its retry through
    stripe-eu-2 (failover), and ``ship`` waits for its child run, which is labelling."""
    eu1, eu2 = connections
    run = run_row("orders", "running", base, started_at=base + 2 * MS, idempotency_key="order-1042",
                  input={"order": 1042, "customer": {"id": 42, "region": "eu"}, "amount": 129.9}, tags=["eu"])
    step_row(run, "validate", "succeeded", base + 4 * MS, base + 6.2 * MS, base + 9.3 * MS,
             input={"order": 1042}, output={"order": 1042, "valid": True}, routing=routing_default())
    step_row(run, "charge", "failed", base + 11 * MS, base + 13.5 * MS, base + 25.9 * MS,
             input={"amount": 129.9, "customer": 42}, routing=routing(eu1, "failover: first available by priority (0)"),
             error={"code": "http_error", "message": "503 Service Unavailable from stripe-eu-1", "retryable": True})
    step_row(run, "charge", "succeeded", base + 26.5 * MS, base + 1029.8 * MS, base + 2232.8 * MS, attempt=2,
             scheduled_for=base + 1026.5 * MS, input={"amount": 129.9, "customer": 42},
             routing=routing(eu2, "failover: first available by priority (1)"),
             output={"charge_id": "ch_3Qx81", "status": "captured"})
    child = run_row("shipping", "running", base + 2236 * MS, started_at=base + 2238 * MS, parent_run=run,
                    parent_node_id="ship", root_run_id=run.pk, nesting_depth=1, input={"order": 1042})
    step_row(run, "ship", "waiting", base + 2234 * MS, base + 2235 * MS, None, node_type="subworkflow",
             input={"order": 1042}, child_run=child)
    step_row(child, "pack", "succeeded", base + 2240 * MS, base + 2241.5 * MS, base + 2286.9 * MS,
             input={"order": 1042}, output={"parcels": 2}, routing=routing_default())
    step_row(child, "label", "running", base + 2288 * MS, base + 2290.4 * MS, None, input={"parcels": 2},
             routing=routing_default())
    seed_events(run)
    return run


def seed_events(run: Any) -> None:
    """The showcase run's history, as the engine records it."""
    from workflows.models import RunEvent

    events = [("created", "", {}), ("started", "", {}), ("step_queued", "validate", {"attempt": 1}),
              ("step_succeeded", "validate", {"attempt": 1}), ("step_queued", "charge", {"attempt": 1}),
              ("step_failed", "charge", {"attempt": 1, "error": "http_error"}),
              ("step_retry_scheduled", "charge", {"attempt": 2, "delay_s": 1.0}),
              ("step_succeeded", "charge", {"attempt": 2}), ("child_started", "ship", {"attempt": 1})]
    for seq, (kind, node_id, data) in enumerate(events, start=1):
        RunEvent.objects.create(run=run, seq=seq, type=kind, node_id=node_id, data=data)


def routing_default() -> dict[str, Any]:
    from scheduling.routing import route
    from scheduling.rules import Step

    return route(Step(workflow="orders", action="echo")).trace()


def seed_history(now: datetime) -> None:
    """Runs finished in the last minutes, and a nightly report that continued as new."""
    for seconds, status, took_ms in ((20, "succeeded", 2310.4), (45, "succeeded", 1987.2), (70, "failed", 812.6),
                                     (130, "cancelled", 15400.0), (190, "succeeded", 2450.9)):
        created = now - timedelta(seconds=seconds)
        error = {"code": "step_failed", "node": "charge"} if status == "failed" else None
        run_row("orders", status, created, started_at=created + 2 * MS, error=error,
                finished_at=created + (2 + took_ms) * MS, idempotency_key=f"order-{1000 + seconds}")
    first = run_row("nightly-report", "continued", now - timedelta(hours=3), started_at=now - timedelta(hours=3),
                    finished_at=now - timedelta(hours=2, minutes=59))
    run_row("nightly-report", "running", now - timedelta(hours=2, minutes=59), continued_from=first,
            root_run_id=first.pk, started_at=now - timedelta(hours=2, minutes=59))


def seed_starts(now: datetime, count: int) -> None:
    """``count`` step starts in the last four minutes: the fairness share's material."""
    from workflows.models import StepRun

    run = run_row("catalog-import", "succeeded", now - timedelta(minutes=4), started_at=now - timedelta(minutes=4),
                  finished_at=now)
    step = timedelta(minutes=4) / count
    StepRun.objects.bulk_create([
        StepRun(run=run, node_id=f"item-{i}", node_type="action", attempt=1, status="succeeded",
                started_at=now - timedelta(minutes=4) + i * step,
                finished_at=now - timedelta(minutes=4) + i * step + 7 * MS)
        for i in range(count)
    ])


def seed_tenant(slug: str, plan: str, *, starts: int, queued: int) -> Any:
    """A tenant with its workflows, ``queued`` runs started for real, and ``starts`` recent step starts."""
    from django.utils import timezone

    from ductor_project.core.context import tenant_context
    from tenants import services as tenant_services
    from workflows import services

    tenant = tenant_services.tenant_create(slug=slug, name=slug.capitalize(), plan=plan)
    with tenant_context(tenant):
        for name, spec in (("orders", ORDERS), ("shipping", SHIPPING), ("nightly-report", REPORT),
                           ("catalog-import", IMPORT)):
            services.workflow_put(name=name, spec=spec)
        seed_starts(timezone.now(), starts)
        for i in range(queued):
            services.run_start(workflow="orders", input={"order": 2000 + i}, idempotency_key=f"order-{2000 + i}")
    return tenant


def seed() -> Seeded:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.utils import timezone

    from ductor_project.core.context import tenant_context
    from tenants.models import TenantMembership

    seed_tenant("globex", "free", starts=36, queued=2)
    seed_tenant("initech", "enterprise", starts=610, queued=0)
    acme = seed_tenant("acme", "pro", starts=170, queued=3)
    with tenant_context(acme):
        connections = seed_routing()
        seed_history(timezone.now())
        showcase = seed_showcase(connections, timezone.now() - timedelta(seconds=2.4))
    users = get_user_model().objects
    root = ("operator", secrets.token_urlsafe(18))
    users.create_superuser(root[0], "operator@example.com", root[1])
    staff = ("acme-admin", secrets.token_urlsafe(18))
    user = users.create_user(staff[0], "admin@acme.example", staff[1], is_staff=True)
    with tenant_context(acme):
        TenantMembership.objects.create(user=user, role=TenantMembership.Role.ADMIN)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows",
                                                         codename__startswith="view_"),
                              Permission.objects.get(codename="change_workflowrun"),
                              Permission.objects.get(codename="view_tenant"))
    return Seeded(showcase=showcase, acme=acme, staff=staff, root=root)


# --- the browser ------------------------------------------------------------------------------


def login(base: str, username: str, password: str) -> httpx.Client:
    """A session of ``username``, logged in through the admin's login form."""
    client = httpx.Client(base_url=base, timeout=30)
    form = client.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    if token is None:
        raise RuntimeError("the login page has no CSRF token")
    done = client.post("/admin/login/", data={"username": username, "password": password, "next": "/admin/",
                                              "csrfmiddlewaretoken": token[1]})
    if done.status_code != 302:
        raise RuntimeError(f"logging in as {username} failed ({done.status_code})")
    return client


def shoot(client: httpx.Client, path: str, name: str, height: int, work: Path) -> Path:
    """The page at ``path`` as ``client`` gets it, rendered to ``docs/console/<name>.png``."""
    response = client.get(path)
    response.raise_for_status()
    html = response.text.replace("<head>", f'<head><meta charset="utf-8"><base href="{client.base_url}">', 1)
    page = work / f"{name}.html"
    page.write_text(html)
    out = OUT / f"{name}.png"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs Debian's chromium package (apt-get install chromium)")
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--force-device-scale-factor=1", f"--window-size={WIDTH},{height}", f"--screenshot={out}", page.as_uri()]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)  # noqa: S603 - our own command line
    log(f"wrote {out.relative_to(ROOT)}")
    return out


def main() -> int:
    from django.urls import reverse

    from ductor_project.stack import free_port

    setup()
    stack = bench_stack("console-screenshots")
    try:
        web = stack.web(port=free_port(), workers=1)
        stack.wait_ready(web, timeout_s=120)
        seeded = seed()
        root, staff = login(str(web.url), *seeded.root), login(str(web.url), *seeded.staff)
        run_page = reverse("admin:workflows_workflowrun_change", args=[seeded.showcase.pk])
        with tempfile.TemporaryDirectory() as work:
            shoot(staff, run_page, "run-page", 2650, Path(work))
            shoot(root, reverse("admin:workflows_workflowrun_changelist"), "run-list", 1000, Path(work))
            shoot(staff, reverse("admin:workflows_tenant_console", args=[seeded.acme.pk]), "tenant-page", 1000,
                  Path(work))
            shoot(root, reverse("admin:workflows_tenant_console", args=[seeded.acme.pk]), "tenant-page-operator",
                  1000, Path(work))
    finally:
        stack.stop_all()
        from ductor_project import embedded

        embedded.stop(DATA_DIR)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

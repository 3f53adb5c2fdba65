"""``python manage.py demo``: bring the web server up on the embedded services and exercise the API.

Everything goes through the public HTTP API of a real gunicorn server. Each
check prints what was asked, what came back, and whether it matched.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from rich.console import Console
from rich.table import Table

from ductor_project.webserver import WebServer
from tenants import services
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Run the Ductor demo against a real web server on the embedded services."

    def handle(self, *args: Any, **options: Any) -> None:
        console = Console()
        console.rule("[bold]Ductor demo")
        console.print(f"data dir: {settings.DUCTOR_DATA_DIR}")
        server = WebServer(log_path=settings.DUCTOR_DATA_DIR / "demo-web.log")
        try:
            with console.status("starting the web server (gunicorn)..."):
                server.wait_ready()
            console.print(f"web server: {server.url}  (OpenAPI: {server.url}/api/docs/)")
            failures = _run_checks(console, server.url)
        finally:
            server.stop()
        if failures:
            raise CommandError(f"{failures} demo check(s) failed")
        console.print("[green]All demo checks passed; everything has been shut down.")


def _run_checks(console: Console, base: str) -> int:
    run = Tenant.objects.filter(slug__startswith="acme-").count() + 1
    key_row, platform_key = services.platform_key_create(name=f"demo-{uuid.uuid4().hex[:12]}")
    table = Table(title="API walkthrough", show_lines=False)
    for column in ("step", "request", "expected", "got", "ok"):
        table.add_column(column)
    failures = 0

    def call(step: str, method: str, path: str, key: str | None, expected: int,
             body: Any = None, raw: str | None = None) -> dict[str, Any]:
        nonlocal failures
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if raw is not None:
            headers["Content-Type"] = "application/json"
        response = httpx.request(method, f"{base}{path}", headers=headers, json=body,
                                 content=raw, timeout=10)
        ok = response.status_code == expected
        failures += 0 if ok else 1
        got = str(response.status_code)
        if response.status_code >= 400:
            got += f" {response.json().get('error', {}).get('code', '')}"
        table.add_row(step, f"{method} {path}", str(expected), got, "[green]yes" if ok else "[red]NO")
        return response.json() if response.content else {}

    acme = call("platform creates tenant (pro plan)", "POST", "/api/v1/tenants", platform_key, 201,
                {"slug": f"acme-{run}", "name": "Acme", "plan": "pro", "create_api_key": True})
    globex = call("platform creates tenant (free plan)", "POST", "/api/v1/tenants", platform_key, 201,
                  {"slug": f"globex-{run}", "name": "Globex", "create_api_key": True})
    a_key, g_key = acme["api_key"], globex["api_key"]
    call("acme reads its tenant", "GET", "/api/v1/tenant", a_key, 200)
    ent = call("acme reads its entitlements", "GET", "/api/v1/entitlements", a_key, 200)
    ro = call("acme creates a read-only key", "POST", "/api/v1/api-keys", a_key, 201,
              {"name": "dashboard", "scopes": ["read"]})
    call("read-only key lists keys", "GET", "/api/v1/api-keys", ro["api_key"], 200)
    call("read-only key cannot write", "POST", "/api/v1/api-keys", ro["api_key"], 403, {"name": "x"})
    call("globex cannot see acme's key", "GET", f"/api/v1/api-keys/{ro['id']}", g_key, 404)
    call("globex cannot revoke acme's key", "POST", f"/api/v1/api-keys/{ro['id']}/revoke", g_key, 404)
    call("tenant key cannot use platform API", "GET", "/api/v1/tenants", a_key, 404)
    call("malformed JSON is refused", "POST", "/api/v1/api-keys", a_key, 400, raw="{not json")
    call("unknown field is refused", "POST", "/api/v1/api-keys", a_key, 400, {"name": "k", "colour": "red"})
    call("acme revokes the read-only key", "POST", f"/api/v1/api-keys/{ro['id']}/revoke", a_key, 200)
    call("revoked key is refused", "GET", "/api/v1/tenant", ro["api_key"], 401)
    call("platform suspends globex", "POST", f"/api/v1/tenants/globex-{run}/suspend", platform_key, 200)
    call("suspended tenant is refused", "GET", "/api/v1/tenant", g_key, 403)
    call("no key is refused", "GET", "/api/v1/tenant", None, 401)
    key_row.revoked_at = timezone.now()
    key_row.save(update_fields=["revoked_at"])
    console.print(table)
    limits = ent.get("limits", {})
    console.print(
        "acme's plan: " + json.dumps({k: limits.get(k) for k in ("plan", "max_concurrency",
                                                                   "monthly_run_quota", "weight")})
    )
    return failures

"""``manage.py create_tenant``: a tenant on the plan asked for, its first key, and nothing on a refusal."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tenants.models import ApiKey, Tenant
from tests.conftest import api_client

pytestmark = pytest.mark.django_db


def create(*args: str) -> dict[str, str]:
    out = StringIO()
    call_command("create_tenant", *args, "--json", stdout=out)
    return dict(json.loads(out.getvalue()))


def test_a_tenant_is_created_on_the_plan_asked_for_with_a_key_that_works() -> None:
    free, pro = create("acme"), create("globex", "--plan", "pro", "--name", "Globex Inc")

    assert (free["tenant"], free["plan"], pro["tenant"], pro["plan"]) == ("acme", "free", "globex", "pro")
    assert Tenant.objects.get(slug="globex").name == "Globex Inc"
    response = api_client(pro["api_key"]).get("/api/v1/entitlements")
    assert response.status_code == 200, response.content
    assert response.json()["limits"]["plan"] == "pro"
    # Each key is its own tenant's.
    assert api_client(free["api_key"]).get("/api/v1/entitlements").json()["tenant"] == "acme"


@pytest.mark.parametrize(("args", "words"), [
    (("acme", "--plan", "platinum"), "Unknown plan 'platinum'"),
    (("Not A Slug",), "slug"),
])
def test_a_refused_tenant_is_a_clear_error_and_leaves_nothing(args: tuple[str, ...], words: str) -> None:
    with pytest.raises(CommandError, match=words):
        create(*args)
    assert not Tenant.objects.exclude(slug="system").exists()
    assert not ApiKey.all_tenants.exists()


def test_a_name_longer_than_a_tenant_may_have_is_a_clear_error_and_leaves_nothing() -> None:
    with pytest.raises(CommandError, match=r"--name: Ensure this field has no more than 200 characters"):
        create("acme", "--name", "x" * 201)
    assert not Tenant.objects.exclude(slug="system").exists()
    assert create("acme", "--name", "x" * 200)["tenant"] == "acme"


@pytest.mark.parametrize(("name", "kept"), [("  Globex Inc  ", "Globex Inc"), ("   ", "acme")])
def test_the_name_is_read_as_the_api_reads_it(name: str, kept: str) -> None:
    create("acme", "--name", name)
    assert Tenant.objects.get(slug="acme").name == kept


def test_a_name_with_a_control_character_is_refused_as_the_api_refuses_it() -> None:
    with pytest.raises(CommandError, match=r"--name: Must not contain control or invisible characters \(U\+000A\)"):
        create("acme", "--name", "Acme\nInc")
    assert not Tenant.objects.exclude(slug="system").exists()

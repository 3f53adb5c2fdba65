"""``manage.py create_platform_key``: a named platform key that works, and a clear refusal of a bad name."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tenants.models import PlatformKey
from tests.conftest import api_client

pytestmark = pytest.mark.django_db


def test_a_platform_key_is_created_with_its_name_and_works() -> None:
    out = StringIO()
    call_command("create_platform_key", " ops ", "--json", stdout=out)
    made = json.loads(out.getvalue())
    assert made["name"] == "ops"
    assert api_client(made["platform_key"]).get("/api/v1/plans").status_code == 200


@pytest.mark.parametrize(("name", "words"), [
    ("", "NAME is 1 to 100 characters"), ("   ", "NAME is 1 to 100 characters"),
    ("x" * 101, "NAME is 1 to 100 characters"), ("ops", "A platform key named 'ops' exists already"),
])
def test_a_bad_or_taken_name_is_a_clear_error_and_creates_nothing(name: str, words: str) -> None:
    call_command("create_platform_key", "ops", stdout=StringIO())
    with pytest.raises(CommandError, match=words):
        call_command("create_platform_key", name, stdout=StringIO())
    assert list(PlatformKey.objects.values_list("name", flat=True)) == ["ops"]

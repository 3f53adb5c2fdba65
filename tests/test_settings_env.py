"""Settings read from the environment: a bad value stops the process at start, naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from ductor_project import settings as project_settings
from ductor_project.settings import database_url, flag, listed, number, options, pairs

ROOT = Path(__file__).resolve().parent.parent



def refusal(monkeypatch: pytest.MonkeyPatch, raw: str, read: Callable[[str], object]) -> str:
    """What ``read("DUCTOR_PROBE")`` refuses the value ``raw`` with."""
    monkeypatch.setenv("DUCTOR_PROBE", raw)
    with pytest.raises(ImproperlyConfigured) as refused:
        read("DUCTOR_PROBE")
    return str(refused.value)


@pytest.mark.parametrize(("raw", "cast", "expected"), [
    ("", int, 30), ("  ", int, 30), ("1000", int, 1000), ("2_000", int, 2000), (" 5 ", int, 5),
    ("0.25", float, 0.25), ("3", float, 3.0),
])
def test_a_number_within_its_range_is_read(monkeypatch: pytest.MonkeyPatch, raw: str, cast: type, expected: float):
    monkeypatch.setenv("DUCTOR_PROBE", raw)
    value = number("DUCTOR_PROBE", 30, low=0, cast=cast)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(("raw", "cast", "message"), [
    ("abc", int, "DUCTOR_PROBE is an integer >= 1, not 'abc'"),
    ("-5", int, "DUCTOR_PROBE is an integer >= 1, not '-5'"),
    ("0", int, "DUCTOR_PROBE is an integer >= 1, not '0'"),
    ("1.5", int, "DUCTOR_PROBE is an integer >= 1, not '1.5'"),
    ("nan", float, "DUCTOR_PROBE is a number >= 1, not 'nan'"),
    ("inf", float, "DUCTOR_PROBE is a number >= 1, not 'inf'"),
    ("0.5", float, "DUCTOR_PROBE is a number >= 1, not '0.5'"),
])
def test_a_number_out_of_its_range_or_not_a_number_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, raw: str, cast: type, message: str
):
    assert refusal(monkeypatch, raw, lambda name: number(name, 30, low=1, cast=cast)) == message


@pytest.mark.parametrize(("raw", "read"), [("16", 16), ("17", None), ("1e9", None), ("0", None)])
def test_a_number_with_a_ceiling_is_refused_above_it_naming_both_bounds(monkeypatch: pytest.MonkeyPatch, raw: str,
                                                                        read: int | None):
    if read is not None:
        monkeypatch.setenv("DUCTOR_PROBE", raw)
        assert number("DUCTOR_PROBE", 1, low=1, high=16) == read
    else:
        message = refusal(monkeypatch, raw, lambda name: number(name, 1, low=1, high=16))
        assert message == f"DUCTOR_PROBE is an integer from 1 to 16, not {raw!r}"


@pytest.mark.parametrize(("raw", "expected"), [
    ("ductor.example.com, api.ductor.example.com", ["ductor.example.com", "api.ductor.example.com"]),
    (" a ,b,, c ", ["a", "b", "c"]), ("a", ["a"]), ("", []),
])
def test_a_list_is_read_without_the_spaces_around_its_items(monkeypatch: pytest.MonkeyPatch, raw: str,
                                                            expected: list[str]):
    """``ALLOWED_HOSTS=a.example, b.example`` kept " b.example", which no request's host is: every
    request to it was refused (400)."""
    monkeypatch.setenv("DUCTOR_PROBE", raw)
    assert listed("DUCTOR_PROBE", ["default"]) == expected


def test_a_list_that_is_not_set_is_its_default(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("DUCTOR_PROBE", raising=False)
    assert listed("DUCTOR_PROBE", ["default"]) == ["default"]


def test_the_hosts_and_origins_are_read_without_spaces(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DUCTOR_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="ductor_project.settings",
               ALLOWED_HOSTS="ductor.example.com, api.ductor.example.com",
               CSRF_TRUSTED_ORIGINS="https://ductor.example.com, https://api.ductor.example.com")
    code = ("import django; django.setup(); from django.conf import settings as s; "
            "print(s.ALLOWED_HOSTS + s.CSRF_TRUSTED_ORIGINS)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == str(["ductor.example.com", "api.ductor.example.com", "https://ductor.example.com",
                                       "https://api.ductor.example.com"])


@pytest.mark.parametrize(("read", "raw", "expected"), [
    (options, "", {}), (options, '{"visibility_timeout": 60}', {"visibility_timeout": 60}),  # a JSON object
    (pairs, "", {}), (pairs, "shop=8", {"shop": "8"}),  # name=value pairs
    (pairs, " shop = 8 , eu/billing=4,", {"shop": "8", "eu/billing": "4"}),
    (pairs, "shop=redis://shop-redis:6379/0?ssl_cert_reqs=none", {"shop": "redis://shop-redis:6379/0?ssl_cert_reqs=none"}),
])
def test_a_setting_of_many_values_is_read(monkeypatch: pytest.MonkeyPatch, read: Callable[[str], dict], raw: str,
                                          expected: dict):
    monkeypatch.setenv("DUCTOR_PROBE", raw)
    assert read("DUCTOR_PROBE") == expected


@pytest.mark.parametrize(("raw", "message"), [
    ("{bad", "DUCTOR_PROBE is a JSON object, and this is not JSON: Expecting property name enclosed in double quotes"),
    ("[1, 2]", "DUCTOR_PROBE is a JSON object, not list"),
    ("60", "DUCTOR_PROBE is a JSON object, not int"),
])
def test_options_that_are_not_a_json_object_are_refused_naming_them(monkeypatch: pytest.MonkeyPatch, raw: str,
                                                                    message: str):
    assert refusal(monkeypatch, raw, options).startswith(message)


@pytest.mark.parametrize(("raw", "expected"), [
    ("", True), ("1", True), ("TRUE", True), (" yes ", True), ("On", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_a_flag_is_read_in_any_of_its_spellings(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool):
    monkeypatch.setenv("DUCTOR_PROBE", raw)
    assert flag("DUCTOR_PROBE", True) is expected


def test_a_flag_that_is_neither_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch):
    assert refusal(monkeypatch, "maybe", lambda name: flag(name, False)) == (
        "DUCTOR_PROBE is one of 1/0, true/false, yes/no, on/off, not 'maybe'")


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("DUCTOR_LEASE_MS", "-5", "DUCTOR_LEASE_MS is an integer >= 1000, not '-5'"),
    ("DUCTOR_QUEUE_SHARDS", "16385", "DUCTOR_QUEUE_SHARDS is an integer from 1 to 16384, not '16385'"),
    ("DUCTOR_LOG_LEVEL", "loud", "DUCTOR_LOG_LEVEL is DEBUG, INFO, WARNING, ERROR or CRITICAL, not 'LOUD'"),
    ("DUCTOR_FAILED_ITEM_MAX_DELAY_MS", "10", "DUCTOR_FAILED_ITEM_DELAY_MS is >= 0 and at most"),
    ("DEBUG", "maybe", "DEBUG is one of 1/0, true/false, yes/no, on/off, not 'maybe'"),
    ("DATABASE_URL", "garbage",
     "DATABASE_URL is a PostgreSQL URL (postgresql://, postgres://, pgsql://), not 'garbage'"),
    ("DUCTOR_TASK_BROKERS", "shop", "DUCTOR_TASK_BROKERS is comma-separated name=value pairs; its item 1 is 'shop'"),
    ("CACHE_CLIENT_CLASS", "nope.Client", "CACHE_CLIENT_CLASS is the dotted path of a django-redis client class, "
                                          "not 'nope.Client': No module named 'nope'"),
    ("CACHE_CLIENT_CLASS", "django_redis.client.Nope", "CACHE_CLIENT_CLASS is the dotted path of a django-redis "
                                                       "client class, not 'django_redis.client.Nope'"),
    ("PROMETHEUS_MULTIPROC_DIR", "{tmp_path}/missing", "PROMETHEUS_MULTIPROC_DIR is a directory this process can "
                                                       "write its metrics in, not '{tmp_path}/missing'"),
    ("PROMETHEUS_MULTIPROC_DIR", "{tmp_path}/file", "PROMETHEUS_MULTIPROC_DIR is a directory this process can "
                                                    "write its metrics in, not '{tmp_path}/file'"),
])
def test_a_process_with_a_bad_setting_does_not_start(tmp_path: Path, setting: str, value: str, message: str):
    (tmp_path / "file").touch()  # a file, not a directory
    value, message = value.format(tmp_path=tmp_path), message.format(tmp_path=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DUCTOR_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="ductor_project.settings", **{setting: value})
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode != 0
    assert f"manage.py: the configuration is wrong: {message}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("raw", "message"), [
    ("shop", "DUCTOR_PROBE is comma-separated name=value pairs; its item 1 is 'shop'"),
    ("shop=8,eu=", "DUCTOR_PROBE is comma-separated name=value pairs; its item 2 is 'eu='"),
    ("=8", "DUCTOR_PROBE is comma-separated name=value pairs; its item 1 is '=8'"),
    ("redis://:secret@shop-redis:6379/0", "DUCTOR_PROBE is comma-separated name=value pairs; its item 1 is "
                                          "'redis://:***@shop-redis:6379/0'"),
])
def test_an_item_that_is_not_a_pair_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, raw: str,
                                                                   message: str):
    assert refusal(monkeypatch, raw, pairs) == message


@pytest.mark.parametrize("url", ["postgresql://ductor_app:pw@db:5432/ductor", "postgres://u@db/d",
                                 "pgsql://u@/d?host=/run/pg"])
def test_a_postgresql_url_is_read(url: str):
    assert database_url("DATABASE_URL", url)["ENGINE"] == "django.db.backends.postgresql"


@pytest.mark.parametrize(("url", "shown"), [
    ("garbage", "'garbage'"), ("", "''"), ("mysql://u:secret@db/d", "'mysql://u:***@db/d'"),
    ("sqlite:///ductor.db", "'sqlite:///ductor.db'"), ("postgresql", "'postgresql'"),
])
def test_a_database_url_that_is_not_postgresql_is_refused_naming_the_setting(url: str, shown: str):
    with pytest.raises(ImproperlyConfigured) as refused:
        database_url("DATABASE_OWNER_URL", url)
    assert str(refused.value) == (f"DATABASE_OWNER_URL is a PostgreSQL URL (postgresql://, postgres://, pgsql://), "
                                  f"not {shown}")


def test_the_generated_secret_key_is_created_readable_by_its_owner_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Created 0600 from the start: written first and restricted after, it was readable by every
    user of the host (the umask's 0644) until the chmod, and two processes starting at once could
    each write a key of their own, signing sessions the other refused."""
    monkeypatch.delenv("SECRET_KEY", raising=False)
    monkeypatch.setattr(project_settings, "DUCTOR_DATA_DIR", tmp_path)
    monkeypatch.setattr(Path, "chmod", lambda *args, **kwargs: None)  # only the creation's own mode counts
    previous = os.umask(0o022)
    try:
        key = project_settings._secret_key()
    finally:
        os.umask(previous)

    path = tmp_path / "secret_key"
    assert path.stat().st_mode & 0o777 == 0o600
    assert len(key) >= 50
    assert project_settings._secret_key() == key == path.read_text().strip()

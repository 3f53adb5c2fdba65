"""Test settings: the product settings plus a small scoped app that exercises the scoping layer."""

from ductor_project.settings import *  # noqa: F403
from ductor_project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.scoped"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

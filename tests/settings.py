"""Test settings: the product settings plus a small scoped app that exercises the scoping layer.

The test run is one of the entry points that start the embedded servers (the
product settings only read where they are), so this boots them first: a no-op
in the workers the tests start, whose environment names the servers. With no
``DUCTOR_DATA_DIR``, they are the servers under ``.ductor/test``, as in ``make test``.

Under pytest-xdist every test process (``gw0``, ``gw1``…) has a database of its own on the same
PostgreSQL (pytest-django's suffix) and Redis databases of its own on the same Redis
(``redis_database``): its queue, broker, cache and scratch databases never meet another's.
"""

import os
from urllib.parse import urlsplit

from ductor_project import embedded

# Each test process takes two Redis databases: its own, and the next one for the demo's scratch.
REDIS_DATABASES_PER_PROCESS = 2


def redis_database(url: str, worker: str) -> str:
    """``url`` on the Redis database of the pytest-xdist process ``worker`` (``gw<n>``)."""
    parts = urlsplit(url)
    base = int(parts.path.lstrip("/") or 0)
    database = base + REDIS_DATABASES_PER_PROCESS * int(worker.removeprefix("gw"))
    return parts._replace(path=f"/{database}").geturl()


# Tests flush the Redis they use: run directly rather than through ``make test``, they still take
# embedded servers of their own (``.ductor/test``, as the Makefile names), never those of ``make up``
# or the demo (``.ductor``).
os.environ.setdefault("DUCTOR_DATA_DIR", str(embedded.PROJECT_ROOT / ".ductor" / "test"))
_services = embedded.boot()
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker and not os.environ.get("DUCTOR_TEST_PROCESS_REDIS"):
    # Once per test process (its children inherit the environment, and service_env names the URL).
    _url = os.environ.get("REDIS_URL") or (_services.redis_url if _services else "")
    os.environ["REDIS_URL"] = redis_database(_url, _worker)
    os.environ["DUCTOR_TEST_PROCESS_REDIS"] = "1"

from ductor_project.settings import *  # noqa: E402, F403
from ductor_project.settings import INSTALLED_APPS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "tests.scoped"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Every test client builds the middleware stack anew, and WhiteNoise's scans every static file the
# finders know at that (about 70 ms, thousands of times in the suite). Looking files up per request
# instead serves the same files; tests/test_static.py checks the production mode too.
WHITENOISE_AUTOREFRESH = True

"""Test settings: the product settings plus a small scoped app that exercises the scoping layer.

The test run is one of the entry points that start the embedded servers (the
product settings only read where they are), so this boots them first: a no-op
in the workers the tests start, whose environment names the servers.
"""

from ductor_project import embedded

embedded.boot()

from ductor_project.settings import *  # noqa: E402, F403
from ductor_project.settings import INSTALLED_APPS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "tests.scoped"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Every test client builds the middleware stack anew, and WhiteNoise's scans every static file the
# finders know at that (about 70 ms, thousands of times in the suite). Looking files up per request
# instead serves the same files; tests/test_static.py checks the production mode too.
WHITENOISE_AUTOREFRESH = True

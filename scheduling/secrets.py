"""Connection secrets, encrypted at rest with Fernet.

Keys come from ``DUCTOR_SECRET_KEYS`` (comma-separated Fernet keys; the first
encrypts, all decrypt, so keys can be rotated). Without it, one key is
generated once into ``<data dir>/fernet.key`` (mode 0600).
"""

from __future__ import annotations

import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from ductor_project.core.private_files import create_private


class SecretError(RuntimeError):
    """A stored secret could not be decrypted with any configured key."""


@functools.cache
def _fernet() -> MultiFernet:
    configured = [k.strip() for k in settings.DUCTOR_SECRET_KEYS if k.strip()]
    if not configured:
        path = settings.DUCTOR_DATA_DIR / "fernet.key"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            create_private(path, Fernet.generate_key().decode())  # another process's, if it was first
        configured = [path.read_text().strip()]
    return MultiFernet([Fernet(key.encode()) for key in configured])


def key_problem() -> str | None:
    """What is wrong with ``DUCTOR_SECRET_KEYS``, or None: a key that is not a Fernet key, named by its
    place in the list, never by its value (unchecked, the first secret saved answered 500)."""
    for place, key in enumerate((k.strip() for k in settings.DUCTOR_SECRET_KEYS if k.strip()), 1):
        try:
            Fernet(key.encode())
        except ValueError:
            return (f"DUCTOR_SECRET_KEYS: key {place} is not a Fernet key (32 url-safe base64-encoded bytes, as "
                    f"Fernet.generate_key() makes)")
    return None


def encrypt(plaintext: str) -> str:
    """A Fernet token of ``plaintext`` (authenticated encryption; a new token every call)."""
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    """The plaintext of a token. Raises ``SecretError`` if no configured key opens it."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise SecretError("secret cannot be decrypted with the configured keys") from exc

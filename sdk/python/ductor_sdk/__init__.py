"""Ductor's Python SDK: the API client, workflows as code, and (``ductor_sdk.worker``) helpers for
the Celery workers that run ``task`` nodes. Importing it needs httpx only, never Celery."""

from ductor_sdk.aio import AsyncClient
from ductor_sdk.client import Client
from ductor_sdk.errors import (
    AuthenticationError,
    BadRequest,
    Conflict,
    DuctorError,
    NotFound,
    PermissionDenied,
    RateLimited,
    ServerError,
    TransportError,
    WaitTimeout,
)
from ductor_sdk.models import Page
from ductor_sdk.transport import RetryPolicy
from ductor_sdk.version import __version__
from ductor_sdk.webhooks import WebhookSignatureError
from ductor_sdk.workflow import Input, Ref, Retry, RootRunId, RunId, StepRef, Workflow, all_of, any_of

__all__ = [
    "AsyncClient",
    "AuthenticationError",
    "BadRequest",
    "Client",
    "Conflict",
    "DuctorError",
    "Input",
    "NotFound",
    "Page",
    "PermissionDenied",
    "RateLimited",
    "Ref",
    "Retry",
    "RetryPolicy",
    "RootRunId",
    "RunId",
    "ServerError",
    "StepRef",
    "TransportError",
    "WaitTimeout",
    "WebhookSignatureError",
    "Workflow",
    "__version__",
    "all_of",
    "any_of",
]

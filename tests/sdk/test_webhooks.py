"""The SDK's webhooks: ``ductor_sdk.webhooks.verify`` against the server's own signing, and the
``webhooks`` resource of both clients against a live server (runs finish inline there: their one
node is skipped)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac

import pytest
from ductor_sdk import AsyncClient, BadRequest, Client, Input, NotFound, WebhookSignatureError, Workflow
from ductor_sdk.webhooks import sign, verify

from workflows.triggers.webhook_delivery import signed_headers

SECRET = "whsec_test-secret"
BODY = b'{"id":"d-1","type":"run.succeeded","data":{"run":{"id":"r-1"}}}'
NOW = 1_800_000_000
PUBLIC = "https://93.184.216.34/hooks/ductor"


def header(body: bytes = BODY, *secrets: str, timestamp: int = NOW) -> str:
    """The Ductor-Signature header the server sends (its own signing code)."""
    return signed_headers("d-1", body, secrets or (SECRET,), timestamp=timestamp)["Ductor-Signature"]


# --- verify ---------------------------------------------------------------------------------------------


def test_the_server_s_signature_verifies_and_is_hmac_sha256_of_the_timestamp_and_the_body() -> None:
    signature = header()

    verify(BODY, signature, SECRET, now=NOW)

    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert signature == f"t={NOW},v1={expected}"
    assert sign(BODY, SECRET, NOW) == expected


def test_any_of_several_signatures_verifies_during_a_rotation() -> None:
    both = header(BODY, "whsec_new", SECRET)

    verify(BODY, both, "whsec_new", now=NOW)
    verify(BODY, both, SECRET, now=NOW)
    with pytest.raises(WebhookSignatureError, match="no signature"):
        verify(BODY, both, "whsec_other", now=NOW)


@pytest.mark.parametrize(("body", "signature", "secret"), [
    (BODY + b" ", header(), SECRET),  # a body changed on the way
    (BODY, header(), "whsec_wrong"),
    (BODY, header().replace(f"t={NOW}", f"t={NOW + 1}"), SECRET),  # the timestamp is signed too
    (BODY, f"t={NOW},v1=" + "0" * 64, SECRET),
    (BODY, f"t={NOW},v1=é", SECRET),  # not even hex
])
def test_a_wrong_signature_is_refused(body: bytes, signature: str, secret: str) -> None:
    with pytest.raises(WebhookSignatureError):
        verify(body, signature, secret, now=NOW)


@pytest.mark.parametrize("signature", ["", "v1=abc", f"t={NOW}", "t=yesterday,v1=abc", "nonsense",
                                       "t=\u00b2,v1=abc", "t=" + "9" * 5000 + ",v1=abc"])
def test_a_malformed_header_is_refused(signature: str) -> None:
    with pytest.raises(WebhookSignatureError):
        verify(BODY, signature, SECRET, now=NOW)


def test_a_signature_older_or_further_ahead_than_the_tolerance_is_refused() -> None:
    verify(BODY, header(), SECRET, now=NOW + 300)
    verify(BODY, header(), SECRET, now=NOW - 300)
    with pytest.raises(WebhookSignatureError, match="300 s"):
        verify(BODY, header(), SECRET, now=NOW + 301)  # replayed later
    with pytest.raises(WebhookSignatureError):
        verify(BODY, header(), SECRET, now=NOW - 301)
    verify(BODY, header(), SECRET, tolerance_s=3600, now=NOW + 3000)


def test_verify_with_the_clock_s_time() -> None:
    import time

    now = int(time.time())
    verify(BODY, header(timestamp=now), SECRET)


# --- the resource ---------------------------------------------------------------------------------------


pytest_live = pytest.mark.django_db(transaction=True)


def quiet() -> Workflow:
    """Its one node is skipped unless ``input.go``: its runs succeed inline."""
    wf = Workflow("quiet")
    wf.action("n", "noop", when=Input["go"].eq(True))
    return wf


@pytest_live
def test_an_endpoint_is_created_rotated_changed_and_its_deliveries_read_and_hidden_from_others(
    sdk: Client, other: Client
) -> None:
    sdk.workflows.apply(quiet())
    made = sdk.webhooks.create(PUBLIC, ["run.succeeded"], workflows=["quiet"], description="ops")
    assert made.secret is not None
    assert made.secret.startswith("whsec_")
    assert (made.events, made.workflows, made.enabled) == (("run.succeeded",), ("quiet",), True)
    assert sdk.webhooks.get(made.id).secret is None
    assert [endpoint.id for endpoint in sdk.webhooks.iter()] == [made.id]

    run = sdk.runs.start("quiet")
    [delivery] = sdk.webhooks.iter_deliveries(made.id)
    assert (delivery.run, delivery.type, delivery.status, delivery.body) == (run.id, "run.succeeded", "pending", None)
    read = sdk.webhooks.delivery(made.id, delivery.id)
    assert read.body is not None
    assert read.body["data"]["run"]["id"] == run.id
    assert sdk.webhooks.redeliver(made.id, delivery.id).attempts[-1]["note"] == "redelivery requested"

    rotated = sdk.webhooks.rotate(made.id, grace_s=60)
    assert rotated.secret not in (None, made.secret)
    assert rotated.previous_secret_expires_at is not None
    assert sdk.webhooks.update(made.id, enabled=False).enabled is False
    with pytest.raises(BadRequest) as refused:
        sdk.webhooks.update(made.id, events=["run.exploded"])
    assert refused.value.field == "events"

    for call in (lambda: other.webhooks.get(made.id), lambda: other.webhooks.rotate(made.id),
                 lambda: other.webhooks.update(made.id, enabled=True), lambda: other.webhooks.delete(made.id),
                 lambda: other.webhooks.deliveries(made.id), lambda: other.webhooks.delivery(made.id, delivery.id),
                 lambda: other.webhooks.redeliver(made.id, delivery.id)):
        with pytest.raises(NotFound):
            call()
    assert list(other.webhooks.iter()) == []
    sdk.webhooks.delete(made.id)
    with pytest.raises(NotFound):
        sdk.webhooks.get(made.id)


@pytest_live
def test_the_async_client_s_webhooks_resource_works_like_the_sync_one(server_url: str, make_tenant) -> None:
    _, key = make_tenant("sdk-async-hooks")

    async def go() -> tuple[str | None, list[str], int]:
        async with AsyncClient(server_url, key, timeout=20.0) as client:
            made = await client.webhooks.create(PUBLIC, ["run.failed", "step.failed"])
            listed = [endpoint.id async for endpoint in client.webhooks.iter()]
            page = await client.webhooks.deliveries(made.id)
            rotated = await client.webhooks.rotate(made.id, grace_s=0)
            assert rotated.previous_secret_expires_at is None
            await client.webhooks.delete(made.id)
            return made.secret, [*listed, made.id], len(page.items)

    secret, ids, count = asyncio.run(go())
    assert secret is not None
    assert ids[0] == ids[1]
    assert count == 0

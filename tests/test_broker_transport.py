"""Ductor's Redis transport for Celery (``ductor_project/broker_transport.py``), on the real broker:
one Redis client serves a channel's commands, and every message still lands. The worker's side
(late acks, redelivery) runs through it in every end-to-end test."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings
from redis import Redis

from ductor_project.broker_transport import Channel, Transport
from ductor_project.celery import app


@pytest.fixture
def queue() -> Any:
    name = f"test-transport-{uuid.uuid4().hex[:8]}"
    broker = Redis.from_url(settings.CELERY_BROKER_URL)
    yield name, broker
    broker.delete(name)


def test_ductors_celery_app_publishes_through_it():
    assert settings.CELERY_BROKER_TRANSPORT == "ductor_project.broker_transport:Transport"
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)


def test_one_client_serves_a_channels_publishes_and_every_message_lands(queue, monkeypatch):
    name, broker = queue
    built: list[tuple[int, bool]] = []
    create = Channel._create_client

    def counted(self: Channel, asynchronous: bool = False) -> Any:
        built.append((id(self), asynchronous))
        return create(self, asynchronous)

    monkeypatch.setattr(Channel, "_create_client", counted)
    with app.connection_for_write() as connection, connection.Producer() as producer:  # a channel of its own
        for n in range(5):
            app.send_task("test.transport", args=[n], queue=name, producer=producer)
    assert broker.llen(name) == 5
    # One client for the commands of each channel (kombu's own channel builds one per publish).
    commands = [channel for channel, asynchronous in built if not asynchronous]
    assert 1 <= len(commands) == len(set(commands)) < 5


def test_a_named_task_broker_publishes_through_it_too(queue, settings):
    from workflows.engine import brokers

    name, broker = queue
    settings.DUCTOR_TASK_BROKERS = {"team": settings.CELERY_BROKER_URL}
    brokers._named_broker.cache_clear()
    try:
        team = brokers.broker_app("team")
        with team.connection_for_write() as connection:
            assert isinstance(connection.transport, Transport)
        team.send_task("team.noop", queue=name)
        assert broker.llen(name) == 1
    finally:
        brokers._named_broker.cache_clear()


def test_a_held_message_is_not_copied_to_redis_and_comes_back_flagged_as_redelivered(queue):
    name, broker = queue
    app.send_task("test.transport", args=[1], queue=name)
    with app.connection_for_read() as connection:
        channel = connection.channel()
        held = channel.basic_get(name)
        assert held is not None
        assert not held.delivery_info.get("redelivered")
        assert not broker.exists("unacked")  # no emulated ack: the worker keeps it in memory
        held.reject(requeue=True)  # as a worker whose pool process died does
        assert broker.llen(name) == 1
        again = channel.basic_get(name)
        # Where Celery reads it (``request.delivery_info``): the worker then checks the item's lease.
        assert again.delivery_info["redelivered"] is True
        assert again.headers["redelivered"] is True
        assert again.decode()[0] == [1]
        again.ack()
    assert broker.llen(name) == 0
    assert not broker.exists("unacked")


def test_the_transport_options_turn_the_emulated_acks_back_on(queue):
    name, broker = queue
    app.send_task("test.transport", args=[2], queue=name)
    with app.connection_for_read(transport_options={"ack_emulation": True}) as connection:
        channel = connection.channel()
        held = channel.basic_get(name)
        assert broker.hlen("unacked") == 1
        held.reject(requeue=True)
        assert broker.llen(name) == 1
        assert broker.hlen("unacked") == 0
        again = channel.basic_get(name)
        assert again.delivery_info["redelivered"] is True
        again.ack()

"""Two facts about noida-db 0.2's consumer groups that together let a transactional copier
commit copies twice, which Apache Kafka prevents (NOIDA_JOIN in the group-mode test):

- it drops a member whose join it held longer than the member's ``session.timeout.ms`` (the
  group waiting for another member's revoke) right after it tells the member its assignment:
  the member copies its partitions until its next heartbeat tells it, while the group's next
  generation hands them to another member;
- it accepts a transaction's offsets sent with an earlier generation's group metadata (Kafka
  2.5 and later refuse them, KIP-447), so that member's copies commit.

Each test fails once noida-db behaves as Kafka does; then the copiers of the group-mode test
can keep a short session timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.support import Broker, Kafka, unique, wait_until

SESSION_MS = 6000
"""The joining member's session timeout in the first test (the shortest noida-db takes)."""


def member(kafka: Kafka, group: str, **extra: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **extra,
        }
    )


@contextmanager
def members(*consumers: Consumer) -> Iterator[None]:
    try:
        yield
    finally:
        for consumer in consumers:
            consumer.close()


def numbers(partitions: list[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in partitions)


def only_noida(broker: Broker) -> None:
    if broker.name != "noida":
        pytest.skip(f"a fact about noida-db ({broker.name} is not)")


def test_noida_drops_a_member_it_held_in_a_join_past_its_session_timeout(
    kafka: Kafka, broker: Broker
) -> None:
    """A member joins a group whose only member does not rejoin for longer than the
    joining member's session timeout (a long revoke). Kafka waits, then gives the joining
    member its share for good; noida-db gives it its share and drops it at once: its next
    heartbeat reports it unknown, and it loses the partitions it was told it has."""
    only_noida(broker)
    topic = kafka.create_topic(2)
    group = unique("held")
    events: list[tuple[str, list[int]]] = []
    first = member(kafka, group)
    joining = member(
        kafka, group, **{"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 1000}
    )
    with members(first, joining):
        first.subscribe([topic])
        wait_until(lambda: first.poll(0.1) is None and first.assignment(), what="first member")
        joining.subscribe(
            [topic],
            on_assign=lambda _, tps: events.append(("assigned", numbers(tps))),
            on_lost=lambda _, tps: events.append(("lost", numbers(tps))),
        )
        held = time.monotonic() + SESSION_MS / 1000 + 1.5
        while time.monotonic() < held:  # the first member does not poll: no rejoin yet
            joining.poll(0.1)
        settled = time.monotonic() + 4
        while time.monotonic() < settled:
            first.poll(0.05)
            joining.poll(0.05)
    assert events and events[0][0] == "assigned" and events[0][1], events
    assert ("lost", events[0][1]) in events, (
        f"noida-db kept a member it held in a join past its session timeout ({events}): the "
        "quirk this test documents is gone"
    )


def test_noida_accepts_a_transactions_offsets_from_an_earlier_generation(
    kafka: Kafka, broker: Broker
) -> None:
    """A member's group metadata is taken, a second member joins (a new generation), and a
    transaction sends offsets with the first member's old metadata. Kafka refuses them
    (ILLEGAL_GENERATION: the transaction must abort); noida-db commits them."""
    only_noida(broker)
    topic = kafka.create_topic(2)
    group = unique("generation")
    first, second = member(kafka, group), member(kafka, group)
    with members(first, second):
        first.subscribe([topic])
        wait_until(lambda: first.poll(0.1) is None and first.assignment(), what="first member")
        earlier = first.consumer_group_metadata()
        second.subscribe([topic])

        def rebalanced() -> bool:
            first.poll(0.05)
            second.poll(0.05)
            return len(first.assignment()) == 1 and len(second.assignment()) == 1

        wait_until(rebalanced, what="a new generation with both members")
        producer = kafka.producer(**{"transactional.id": unique("generation")})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, value=b"copy", partition=0)
        try:
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], earlier, 30)
            producer.commit_transaction(30)
        except KafkaException as exc:
            pytest.fail(
                f"noida-db refused offsets of an earlier generation ({exc}): the quirk this "
                "test documents is gone"
            )
        committed = second.committed([TopicPartition(topic, 0)], timeout=10)
    assert committed[0].offset == 7, committed

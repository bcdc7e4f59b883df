"""Facts about noida-db 0.2's consumer groups. The first two together let a transactional
copier commit copies twice, which Apache Kafka prevents (NOIDA_JOIN in the group-mode test):

- it drops a member whose join it held longer than the member's ``session.timeout.ms`` (the
  group waiting for another member's revoke) right after it tells the member its assignment:
  the member copies its partitions until its next heartbeat tells it, while the group's next
  generation hands them to another member;
- it accepts a transaction's offsets sent with an earlier generation's group metadata (Kafka
  2.5 and later refuse them, KIP-447), so that member's copies commit.

The last two stall a group for good (``ends_every_round``), no member assigned anything
again: a round of rebalancing that members leave during never ends (the rebalance storm of
the fault scenarios stops a dependent only once its group has settled there), and sometimes
neither does the first round of members joining a group together (the group-mode copy test
starts its copiers one after the other there).

The first two tests fail once noida-db behaves as Kafka does (the last two, races, then skip,
saying so); then the copiers of the group-mode test can keep a short session timeout and
start together, and the storm can stop dependents at any time.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.support import Broker, Kafka, describe_group, unique, wait_until

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


def left_during_a_round(kafka: Kafka) -> tuple[list[int], str]:
    """A group's only member holds every partition; a second member joins and is given a
    share; a third joins, and both newcomers close as soon as the first member is revoked for
    the round the third started. Returns what the first member holds a session timeout (and
    3 s) later, and the group's state at the broker then."""
    topic = kafka.create_topic(4)
    group = unique("left")
    session = {"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 1000}
    held: list[int] = []
    rounds = [0]

    def assigned(_: Consumer, tps: list[TopicPartition]) -> None:
        held[:] = numbers(tps)

    def revoked(_: Consumer, tps: list[TopicPartition]) -> None:
        held.clear()
        rounds[0] += 1

    second_holds: list[TopicPartition] = []

    def ignored(_: Consumer, tps: list[TopicPartition]) -> None:
        pass

    first, second, third = (member(kafka, group, **session) for _ in range(3))
    with members(first):
        first.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)
        wait_until(lambda: first.poll(0.1) is None and len(held) == 4, what="first member")
        second.subscribe(
            [topic], on_assign=lambda _, tps: second_holds.extend(tps), on_revoke=ignored,
            on_lost=ignored,
        )  # fmt: skip
        wait_until(lambda: first.poll(0.01) or second.poll(0.01) or second_holds, what="second")
        before = rounds[0]
        third.subscribe([topic], on_assign=ignored, on_revoke=ignored, on_lost=ignored)
        wait_until(lambda: first.poll(0.01) or third.poll(0.01) or rounds[0] > before, what="round")
        closing = [threading.Thread(target=consumer.close) for consumer in (second, third)]
        for thread in closing:
            thread.start()
        while any(thread.is_alive() for thread in closing):
            first.poll(0.05)
        settled = time.monotonic() + SESSION_MS / 1000 + 3  # past any session of theirs
        while time.monotonic() < settled and len(held) != 4:
            first.poll(0.05)
        found = list(held)
        state = describe_group(kafka.bootstrap, group).state
    return found, state.name


def test_noida_never_ends_a_rebalance_that_members_left_during(
    kafka: Kafka, broker: Broker
) -> None:
    """Two members leave a group while the round of rebalancing the second's joining started
    is under way (see left_during_a_round). Kafka ends the round without them and gives the
    first member every partition again (so does Tansu); noida-db keeps the group preparing
    that round for good, and the first member holds nothing.

    Whether the leaves reach noida-db before the round ends is a race: about half the tries
    on an idle machine, fewer on a loaded one. Up to twelve tries; none stalling skips the
    test, saying so (a broker without the quirk would skip too: run it alone to tell)."""
    only_noida(broker)
    tries = []
    for _ in range(12):
        held, state = left_during_a_round(kafka)
        tries.append(state)
        if len(held) != 4:  # the round never ended: the group still prepares it
            assert state == "PREPARING_REBALANCING", (held, state)
            return
    pytest.skip(
        f"noida-db ended the round in each of {len(tries)} tries ({tries}): the leaves may "
        "never have landed during one (a race this machine's load decides), or noida-db no "
        "longer has the quirk"
    )


def joined_together(kafka: Kafka, chance: random.Random) -> tuple[int, str]:
    """Three members subscribe to a new group a random 0..0.6 s apart, each polling from its
    own thread. Returns how many of the topic's 4 partitions they hold once every one is
    assigned (or 30 s have passed), and the group's state at the broker then."""
    topic = kafka.create_topic(4)
    group = unique("together")
    held: dict[int, list[int]] = {}
    done = threading.Event()
    stopping = threading.Event()

    def run(index: int) -> None:
        consumer = member(
            kafka, group, **{"session.timeout.ms": 30_000, "heartbeat.interval.ms": 1000}
        )

        def assigned(_: Consumer, tps: list[TopicPartition]) -> None:
            held[index] = numbers(tps)
            if sum(len(partitions) for partitions in held.values()) == 4:
                done.set()

        def revoked(_: Consumer, tps: list[TopicPartition]) -> None:
            held[index] = []

        with members(consumer):
            consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)
            while not stopping.is_set():
                consumer.poll(0.05)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(3)]
    try:
        for thread in threads:
            thread.start()
            time.sleep(chance.uniform(0.0, 0.6))
        done.wait(30)
        state = describe_group(kafka.bootstrap, group).state
        return sum(len(partitions) for partitions in held.values()), state.name
    finally:
        stopping.set()
        for thread in threads:
            thread.join(30)


def test_noida_sometimes_never_ends_the_round_members_joining_together_start(
    kafka: Kafka, broker: Broker
) -> None:
    """Three members join a new group within a second (see joined_together). Kafka hands
    out the partitions once they have joined, whatever the timing (Tansu within about 16 s
    here, every time); in about one try in ten noida-db never does (it answers the others
    within a second): every member waits for its join's answer and the group prepares its
    first round for good (the group-mode copy test starts its copiers one after the other
    there: NOIDA_ROUNDS). The members heartbeat every second: at librdkafka's default of
    3 s the stall is rarer on an idle machine (none in 25 tries here).

    Up to thirty tries; none stalling skips the test, saying so (a broker without the quirk
    would skip too: run it alone to tell)."""
    only_noida(broker)
    chance = random.Random()
    tries = []
    for _ in range(30):
        holding, state = joined_together(kafka, chance)
        tries.append(holding)
        if holding == 0:  # nobody was ever assigned anything
            assert state == "PREPARING_REBALANCING", (holding, state)
            return
    pytest.skip(
        f"noida-db ended the first round in each of {len(tries)} tries: the joins may never "
        "have met the timing that stalls it (a race), or noida-db no longer has the quirk"
    )

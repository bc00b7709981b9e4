"""Offsets committed without waiting stay pending until the broker accepts them
(`processors/offset_commits.py`): merged newest-first, sent for owned partitions only, dropped by
an acceptance that covers them, kept by a refusal, forgotten for a partition given up."""

from __future__ import annotations

from confluent_kafka import KafkaError, TopicPartition

from lapse.processors.offset_commits import PendingCommits

A, B = ("t", 0), ("t", 1)


def _sent(pending: PendingCommits, owned=frozenset({A, B})) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): tp.offset for tp in pending.to_send(set(owned))}


def test_offsets_merge_and_go_for_owned_partitions_only():
    pending = PendingCommits()
    pending.merge([TopicPartition(*A, 10), TopicPartition(*B, 4)])
    pending.merge([TopicPartition(*A, 7)])  # an older one never moves a partition back
    assert _sent(pending) == {A: 10, B: 4}
    assert _sent(pending, owned={A}) == {A: 10}


def test_a_refused_commit_is_sent_again_and_an_accepted_one_is_done():
    pending = PendingCommits(resend_after_s=0)
    pending.merge([TopicPartition(*A, 10), TopicPartition(*B, 4)])
    offsets = pending.to_send({A, B})
    pending.answered(KafkaError(KafkaError._WAIT_COORD), offsets)
    assert pending.due() and _sent(pending) == {A: 10, B: 4}
    pending.merge([TopicPartition(*A, 12)])
    pending.answered(None, [TopicPartition(*A, 10), TopicPartition(*B, 4)])  # the older commit's answer
    assert _sent(pending) == {A: 12}  # B is done; A's newer offset still waits
    pending.answered(None, [TopicPartition(*A, 12)])
    assert not pending.due() and _sent(pending) == {}


def test_a_partition_given_up_is_never_sent():
    pending = PendingCommits(resend_after_s=0)
    pending.merge([TopicPartition(*A, 10), TopicPartition(*B, 4)])
    pending.forget([B])
    assert _sent(pending) == {A: 10}


def test_nothing_is_due_while_a_commit_is_unanswered():
    pending = PendingCommits(resend_after_s=60)
    pending.merge([TopicPartition(*A, 10)])
    pending.to_send({A})
    assert not pending.due()


def test_commits_stall_when_refused_or_unanswered_and_not_once_accepted():
    pending = PendingCommits()
    assert not pending.stalled()
    pending.merge([TopicPartition(*A, 10)])
    offsets = pending.to_send({A})
    assert not pending.stalled(after_s=60) and pending.stalled(after_s=0)  # unanswered for long enough
    pending.answered(KafkaError(KafkaError._WAIT_COORD), offsets)
    assert pending.stalled(after_s=60)  # refused: at once
    pending.answered(None, offsets)
    assert not pending.stalled(after_s=0)


def test_offsets_set_aside_for_a_lost_partition_come_back_with_it_once():
    pending = PendingCommits()
    pending.set_aside({A: 10, B: 4})
    assert pending.given_back({A}) == {A: 10}
    assert pending.given_back({A}) == {}
    assert pending.given_back({A, B}) == {B: 4}


def test_commits_answered_one_by_one_never_stall_a_steady_stream():
    """Each batch's commit is answered while newer offsets are pending: no stall."""
    pending = PendingCommits()
    for offset in range(10, 100, 10):
        pending.merge([TopicPartition(*A, offset)])
        sent = pending.to_send({A})
        pending.merge([TopicPartition(*A, offset + 5)])  # the next batch's, before the answer
        pending.answered(None, sent)
        assert not pending.stalled(after_s=0)


def test_nothing_sent_awaits_no_answer():
    """A send with no owned partition's offset awaits no answer: it never makes commits stall
    (nor shifts which answer is taken for which commit)."""
    pending = PendingCommits()
    pending.merge([TopicPartition(*A, 10)])
    assert pending.to_send({B}) == []
    assert not pending.stalled(after_s=0)
    offsets = pending.to_send({A})
    pending.answered(None, offsets)
    assert not pending.stalled(after_s=0) and _sent(pending) == {}


def test_an_older_commit_accepted_after_a_newer_one_sends_the_newer_again():
    """While the coordinator moves, commits queued before may reach the new one after newer ones
    (seen in the coordinator-kill test: 2440 written, then 1471 and 1971): the broker keeps the last
    it wrote, so the newest offset is pending until it is accepted after the older ones."""
    pending = PendingCommits(resend_after_s=0)
    pending.merge([TopicPartition(*A, 1471)])
    older = pending.to_send({A})
    pending.merge([TopicPartition(*A, 2440), TopicPartition(*B, 9)])
    newer = pending.to_send({A, B})
    pending.answered(None, newer)
    assert _sent(pending) == {}
    pending.answered(None, older)  # written after the newer one: the group's offset went back
    assert pending.moved_back == 1 and pending.due() and _sent(pending) == {A: 2440}
    pending.answered(None, [TopicPartition(*A, 2440)])
    assert _sent(pending) == {}


def test_a_partition_given_up_forgets_what_the_broker_accepted():
    """The next owner's commits are its own: given back later, an older acceptance is no regression."""
    pending = PendingCommits()
    pending.merge([TopicPartition(*A, 50)])
    pending.answered(None, pending.to_send({A}))
    pending.forget([A])
    pending.merge([TopicPartition(*A, 20)])  # read again from the group's offset after a rebalance
    pending.answered(None, pending.to_send({A}))
    assert _sent(pending) == {}

"""The cloud bridge's pure parts: topic rules, the outbox, sequence numbers, its config."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.app.config import parse_config
from gateway.app.runtime import ConfigError, RuntimeConfig
from gateway.bridge.outbox import DONE, INFLIGHT, PENDING, Entry, Outbox
from gateway.bridge.rules import Mapped, explain, map_in, map_out, rule_errors
from gateway.bridge.sequence import BLOCK, META_KEY, Sequence
from gateway.bridge.settings import (
    DROP_NEWEST,
    DROP_OLDEST,
    REFUSE,
    OutboxSettings,
    RuleSettings,
)
from gateway.broker.journal import Op, PutOutbox, RemoveOutbox, SetMeta
from gateway.store.settings import OUTBOX_ENTRY_OVERHEAD

# ---------------------------------------------------------------------- rules

RULES = (
    RuleSettings("sensors/#", "out", 1, "ledge/gw1/", "site1/gw1/"),  # replace
    RuleSettings("alerts/+", "out", 0, "", "site1/"),  # add
    RuleSettings("#", "both", 2, "shared/", "", "strip"),  # strip
    RuleSettings("cmd/#", "in", 1, "local/", "devices/gw1/"),
)


@pytest.mark.parametrize(
    ("topic", "qos", "retain", "expected"),
    [
        ("ledge/gw1/sensors/t", 1, False, Mapped(0, "site1/gw1/sensors/t", 1, False)),
        ("ledge/gw1/sensors/t", 2, True, Mapped(0, "site1/gw1/sensors/t", 1, True)),
        ("alerts/boiler", 1, False, Mapped(1, "site1/alerts/boiler", 0, False)),
        ("shared/a/b", 2, True, Mapped(2, "a/b", 2, False)),
        ("alerts/boiler/extra", 1, False, None),
        ("ledge/gw2/sensors/t", 1, False, None),
        ("local/cmd/x", 1, False, None),  # inbound only
    ],
)
def test_outbound_mapping_adds_replaces_and_strips_prefixes(
    topic: str, qos: int, retain: bool, expected: Mapped | None
) -> None:
    assert map_out(RULES, topic, qos, retain) == expected


def test_inbound_mapping_and_the_first_matching_rule_wins() -> None:
    # rule 3 ("#" both, local "shared/") comes before rule 4 and takes every remote topic
    assert map_in(RULES, "devices/gw1/cmd/reboot", 2, True) == Mapped(
        2, "shared/devices/gw1/cmd/reboot", 2, False
    )
    assert map_in(RULES[3:], "devices/gw1/cmd/reboot", 2, True) == Mapped(
        0, "local/cmd/reboot", 1, True
    )
    assert map_in(RULES[3:], "cmd/x", 1, False) is None
    assert map_in(RULES[:2], "site1/gw1/sensors/t", 1, False) is None  # outbound only


def test_leading_wildcards_never_carry_dollar_topics() -> None:
    rules = (RuleSettings("#", "out"),)
    assert map_out(rules, "$SYS/broker/uptime", 0, False) is None
    assert map_out(rules, "a", 0, False) == Mapped(0, "a", 0, False)


def test_a_prefix_equal_to_the_topic_leaves_nothing_to_send() -> None:
    rules = (RuleSettings("#", "out", 1, "a/", ""),)
    assert map_out(rules, "a/", 1, False) is None  # would be the empty topic
    assert "empty" in explain(rules, "a/")[0]


def test_explain_says_why_and_why_not() -> None:
    lines = explain(RULES, "ledge/gw1/sensors/t")
    assert lines[0].startswith("rule 1 (out 'sensors/#'")
    assert "yes -> remote topic 'site1/gw1/sensors/t', QoS at most 1, retain kept" in lines[0]
    assert all("not consulted" in line for line in lines[1:])
    lines = explain(RULES, "alerts/a/b")
    assert "does not start with the prefix 'ledge/gw1/'" in lines[0]
    assert "'alerts/a/b' does not match the filter 'alerts/+'" in lines[1]
    assert "only brings remote topics in" in lines[3]
    lines = explain(RULES, "devices/gw1/cmd/x", outbound=False)
    assert "only sends local topics out" in lines[0]
    assert "yes -> local topic 'shared/devices/gw1/cmd/x'" in lines[2]


def test_explain_writes_each_rules_line_whole() -> None:
    rules = (
        RuleSettings("a/#", "out", 1),
        RuleSettings("b/#", "out", 0, "", "up/", "strip"),
        RuleSettings("#", "in", 1, "down/", ""),
        RuleSettings("#", "out", 2),
    )
    assert explain(rules, "b/x") == [
        "rule 1 (out 'a/#'): no, 'b/x' does not match the filter 'a/#'",
        "rule 2 (out 'b/#', local '' <-> remote 'up/'): yes -> remote topic 'up/b/x', "
        "QoS at most 0, retain stripped",
        "rule 3 (in '#', local 'down/' <-> remote ''): not consulted, an earlier rule matched",
        "rule 4 (out '#'): not consulted, an earlier rule matched",
    ]
    assert explain(rules, "c", outbound=False) == [
        "rule 1 (out 'a/#'): no, it only sends local topics out",
        "rule 2 (out 'b/#', local '' <-> remote 'up/'): no, it only sends local topics out",
        "rule 3 (in '#', local 'down/' <-> remote ''): yes -> local topic 'down/c', "
        "QoS at most 1, retain kept",
        "rule 4 (out '#'): not consulted, an earlier rule matched",
    ]


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        (RuleSettings("a/#/b"), "filter: '#' must be the last level"),
        (RuleSettings("$share/g/a"), "shared subscriptions cannot be bridged"),
        (RuleSettings("a", local_prefix="x/+/"), "local_prefix: must not contain wildcards"),
        (RuleSettings("a", direction="sideways"), "direction"),  # type: ignore[arg-type]
    ],
)
def test_bad_rules_are_named(rule: RuleSettings, problem: str) -> None:
    assert any(problem in p for p in rule_errors(rule))


# ---------------------------------------------------------------------- outbox


def entry(seq: int, size: int = 10, qos: int = 1, expires: float | None = None) -> Entry:
    return Entry(0, seq, f"t/{seq}", b"x" * size, qos, False, b"", 100.0 + seq, expires)


def make_outbox(
    when_full: str = DROP_OLDEST,
    max_messages: int = 1000,
    max_bytes: int = 10**9,
    memory_bytes: int = 10**9,
    durable: bool = True,
) -> tuple[Outbox, list[Op]]:
    ops: list[Op] = []
    box = Outbox(
        "cloud",
        OutboxSettings(max_bytes, max_messages, when_full, memory_bytes),  # type: ignore[arg-type]
        ops.append if durable else None,
    )
    return box, ops


def stored(row: PutOutbox) -> Entry:
    """The entry the store gives back for a row it was told to put."""
    return Entry(
        row.pos,
        row.seq,
        row.topic,
        row.payload,
        row.qos,
        bool(row.retain),
        row.properties,
        row.created,
        row.expires,
    )


def drain(box: Outbox, wall: float = 0.0) -> list[Entry]:
    out = []
    while (e := box.next_ready(wall)) is not None:
        out.append(e)
    return out


def test_entries_leave_in_order_and_only_when_acknowledged() -> None:
    box, ops = make_outbox()
    for i in range(1, 6):
        assert box.put(entry(i))
    assert [type(op) for op in ops] == [PutOutbox] * 5
    assert [op.pos for op in ops if isinstance(op, PutOutbox)] == [1, 2, 3, 4, 5]  # contiguous
    sent = drain(box)
    assert [e.seq for e in sent] == [1, 2, 3, 4, 5]
    assert all(e.state == INFLIGHT for e in sent)
    assert box.count == 5  # nothing left before the remote acknowledged
    ops.clear()
    box.acknowledged(sent[2])  # out of order: remembered, not yet removed from disk
    assert ops == [] and box.count == 5
    box.acknowledged(sent[0])
    assert ops == [RemoveOutbox("cloud", 1)]
    box.acknowledged(sent[1])
    assert ops[1:] == [RemoveOutbox("cloud", 2), RemoveOutbox("cloud", 3)]
    assert box.count == 2
    assert box.stats.acknowledged == 3 and box.stats.sent == 5


def test_a_dropped_link_resends_everything_unacknowledged_in_order() -> None:
    box, _ = make_outbox()
    for i in range(1, 5):
        box.put(entry(i))
    first = drain(box)
    box.acknowledged(first[1])
    assert box.rewind() == 3
    again = drain(box)
    assert [e.seq for e in again] == [1, 3, 4]


def test_drop_oldest_makes_room_and_counts() -> None:
    box, ops = make_outbox(DROP_OLDEST, max_messages=3)
    for i in range(1, 6):
        assert box.put(entry(i))
    assert [e.seq for e in box.mem] == [3, 4, 5]
    assert box.stats.dropped_full == 2 and box.count == 3
    assert RemoveOutbox("cloud", 1) in ops and RemoveOutbox("cloud", 2) in ops


def test_drop_newest_keeps_the_oldest_and_counts() -> None:
    box, _ = make_outbox(DROP_NEWEST, max_messages=3)
    results = [box.put(entry(i)) for i in range(1, 6)]
    assert results == [True, True, True, False, False]
    assert [e.seq for e in box.mem] == [1, 2, 3]
    assert box.stats.dropped_full == 2


def test_the_byte_bound_counts_topic_payload_and_overhead() -> None:
    one = entry(1, size=100).size
    box, _ = make_outbox(DROP_NEWEST, max_bytes=one * 2)
    assert box.put(entry(1, 100)) and box.put(entry(2, 100))
    assert not box.put(entry(3, 100))
    assert box.bytes == 2 * one
    huge, _ = make_outbox(DROP_OLDEST, max_bytes=50)
    assert not huge.put(entry(1, 100))  # larger than the whole outbox: never fits
    assert huge.stats.dropped_full == 1


def test_the_refuse_policy_only_reports_fullness() -> None:
    box, _ = make_outbox(REFUSE, max_messages=2)
    box.put(entry(1))
    assert not box.would_overflow(10)
    box.put(entry(2))
    assert box.would_overflow(10)
    assert not box.put(entry(3))  # in-process publishers cannot be refused: dropped, counted
    assert box.stats.dropped_full == 1


def test_expired_entries_are_dropped_when_their_turn_comes() -> None:
    box, ops = make_outbox()
    box.put(entry(1, expires=50.0))
    box.put(entry(2))
    sent = drain(box, wall=60.0)
    assert [e.seq for e in sent] == [2]
    assert box.stats.dropped_expired == 1
    assert RemoveOutbox("cloud", 1) in ops


def test_nothing_goes_up_before_its_store_batch_is_committed() -> None:
    box, _ = make_outbox()
    e = entry(1)
    e.batch = 7
    box.put(e)
    assert box.next_ready(0.0) is None
    box.commit(6)
    assert box.next_ready(0.0) is None
    box.commit(7)
    assert box.next_ready(0.0) is e


def test_beyond_memory_bytes_entries_wait_on_disk_and_are_paged_back() -> None:
    one = entry(1).size
    box, ops = make_outbox(memory_bytes=one * 3)
    for i in range(1, 11):
        box.put(entry(i))
    assert [e.seq for e in box.mem] == [1, 2, 3]
    assert box.spilled == 7 and box.count == 10
    rows = {op.pos: op for op in ops if isinstance(op, PutOutbox)}  # what the store would hold

    def read(first: int, count: int) -> list[Entry]:
        return [stored(rows[p]) for p in range(first, first + count) if p in rows]

    got: list[int] = []
    while box.count:
        for e in drain(box):
            got.append(e.seq)
            box.acknowledged(e)
        request = box.refill_request()
        if request is not None:
            assert request[0] == box.mem[-1].pos + 1 if box.mem else True
            box.refilled(read(*request))
    assert got == list(range(1, 11))
    assert box.spilled == 0 and box.mem_bytes == 0


def test_paging_skips_rows_dropped_meanwhile_and_waits_for_uncommitted_ones() -> None:
    one = entry(1).size
    box, ops = make_outbox(max_messages=5, memory_bytes=2 * one)
    for i in range(1, 6):
        box.put(entry(i))
    assert [e.pos for e in box.mem] == [1, 2] and box.spilled == 3
    assert box.refill_request() is None  # memory is full
    (e1, _e2) = drain(box)
    box.acknowledged(e1)
    assert box.refill_request() == (3, 1)  # a page of half the memory budget
    rows = {op.pos: op for op in ops if isinstance(op, PutOutbox)}

    def page(*positions: int) -> list[Entry]:
        return [stored(rows[p]) for p in positions]

    box.put(entry(6))
    box.put(entry(7))  # drop-oldest: 2 (in flight, from memory)
    box.put(entry(8))  # ... and 3 (from disk) while the page was being read
    assert box.stats.dropped_full == 2
    assert box.refilled(page(3)) == 0  # 3 is gone: skipped
    assert box.refill_request() == (4, 1)
    assert box.refilled(page(5)) == 0  # 4 not committed yet: stop at the gap
    assert box.refill_request() == (4, 1)
    assert box.refilled(page(4, 5)) == 2
    assert [e.pos for e in box.mem] == [4, 5] and box.spilled == 3


def test_dropping_the_oldest_on_disk_tells_the_store_which_row() -> None:
    one = entry(1).size
    box, ops = make_outbox(max_messages=2, memory_bytes=one)
    box.put(entry(1))  # in memory
    box.put(entry(2))  # on disk
    (e1,) = drain(box)
    box.acknowledged(e1)
    assert box.refill_request() == (2, 1)
    box.put(entry(3))
    box.put(entry(4))  # drop-oldest: 2, on disk, while its page is read
    assert box.stats.dropped_full == 1
    assert ops.count(RemoveOutbox("cloud", 2)) == 1
    rows = {op.pos: op for op in ops if isinstance(op, PutOutbox)}
    assert box.refilled([stored(rows[2]), stored(rows[3])]) == 1  # 2 is gone: skipped
    assert [e.seq for e in box.mem] == [3] and box.spilled == 1


def test_dropping_the_oldest_while_three_are_in_flight_sends_the_next_once() -> None:
    box, _ = make_outbox(max_messages=4)
    for i in range(1, 5):
        box.put(entry(i))
    sent = [box.next_ready(0.0) for _ in range(3)]
    assert [e.seq for e in sent if e is not None] == [1, 2, 3]
    box.put(entry(5))  # drop-oldest: 1, in flight
    assert [e.seq for e in drain(box)] == [4, 5]


def test_thousands_on_disk_come_back_in_order() -> None:
    """Beyond 4,096 entries read back from disk the outbox compacts its record of them;
    the order and every entry survive it."""
    one = entry(1).size
    box, ops = make_outbox(max_messages=10**6, memory_bytes=one)
    n = 4200
    for i in range(1, n + 1):
        box.put(entry(i))
    rows = {op.pos: op for op in ops if isinstance(op, PutOutbox)}
    got: list[int] = []
    while box.count:
        for e in drain(box):
            got.append(e.seq)
            box.acknowledged(e)
        request = box.refill_request()
        if request is not None:
            first, count = request
            box.refilled([stored(rows[p]) for p in range(first, first + count)])
    assert got == list(range(1, n + 1))


def test_an_acknowledgement_after_a_drop_is_ignored() -> None:
    box, _ = make_outbox(max_messages=1)
    box.put(entry(1))
    (e1,) = drain(box)
    box.put(entry(2))  # drops e1 while in flight
    box.acknowledged(e1)
    assert box.stats.acknowledged == 0 and box.count == 1


def test_restore_puts_everything_on_disk_first() -> None:
    box, _ = make_outbox()
    box.restore([(5, 100, 10.0), (6, 100, 11.0), (7, 100, 12.0)])
    assert box.count == 3 and box.bytes == 300 and box.next_pos == 8
    assert box.oldest_age(20.0) == 10.0
    assert box.refill_request() == (5, 3)


def test_memory_only_outbox_never_spills() -> None:
    one = entry(1).size
    box, ops = make_outbox(memory_bytes=one, durable=False)
    for i in range(1, 5):
        box.put(entry(i))
    assert len(box.mem) == 4 and box.spilled == 0 and ops == []


def test_an_entry_of_exactly_max_bytes_fits_and_one_byte_more_does_not() -> None:
    one = entry(1, size=100).size
    box, _ = make_outbox(DROP_OLDEST, max_bytes=one)
    assert box.put(entry(1, 100))
    assert not box.put(entry(2, 101))
    assert box.stats.dropped_full == 1 and box.stats.queued == 1
    assert [e.seq for e in box.mem] == [1]  # the oversized one displaced nothing


def test_an_entry_expires_at_its_expiry_instant() -> None:
    box, _ = make_outbox()
    box.put(entry(1, expires=60.0))
    assert drain(box, wall=60.0) == []
    assert box.stats.dropped_expired == 1 and box.count == 0 and box.bytes == 0


def test_the_oldest_age_is_the_head_in_memory_then_on_disk_never_negative() -> None:
    one = entry(1).size
    box, _ = make_outbox(memory_bytes=one)
    assert box.oldest_age(500.0) == 0.0  # empty
    box.put(entry(1))  # created 101.0, in memory
    box.put(entry(2))  # created 102.0, on disk
    assert box.oldest_age(150.0) == 49.0
    assert box.oldest_age(50.0) == 0.0  # a clock stepped back
    (e1,) = drain(box)
    box.acknowledged(e1)
    assert box.oldest_age(150.0) == 48.0  # the head is now on disk
    assert box.oldest_age(50.0) == 0.0


def test_a_wall_clock_step_moves_every_entrys_times_with_it() -> None:
    """The system clock set forward (or back): each entry's creation and expiry move by
    the step, in memory and on disk, so ages and remaining lifetimes stay; an entry
    without expiry keeps none; pages from disk wait for the batch storing the moved
    times."""
    one = entry(1).size
    box, _ = make_outbox(memory_bytes=one * 2)
    box.put(entry(1, expires=200.0))  # created 101, in memory
    box.put(entry(2))  # created 102, in memory, no expiry
    box.put(entry(3, expires=300.0))  # created 103, on disk
    box.commit(5)
    box.shift_wall(1000.0, 7)
    box.shift_wall(-10.0, 6)
    assert box.wall_steps == 2
    e1, e2 = box.mem
    assert (e1.created, e1.expires) == (1091.0, 1190.0)
    assert (e2.created, e2.expires) == (1092.0, None)
    assert box.oldest_age(1100.0) == 9.0
    for e in drain(box, 1100.0):
        box.acknowledged(e)
    assert box.oldest_age(1100.0) == 7.0  # the entry on disk: created 103 + 990
    assert box.refill_request() is None  # batch 7 (the larger) is not committed yet
    box.commit(6)
    assert box.refill_request() is None
    box.commit(7)
    assert box.refill_request() == (3, 1)


def test_dropping_the_oldest_while_in_flight_keeps_the_next_to_send() -> None:
    box, _ = make_outbox(DROP_OLDEST, max_messages=3)
    for i in range(1, 4):
        box.put(entry(i))
    assert [e.seq for e in drain(box)] == [1, 2, 3]
    box.put(entry(4))  # drops 1, in flight
    box.put(entry(5))  # drops 2, in flight
    assert [e.seq for e in drain(box)] == [4, 5]


def test_a_page_is_half_the_memory_budget_and_skips_what_was_dropped_meanwhile() -> None:
    one = entry(1).size
    box, ops = make_outbox(DROP_OLDEST, max_messages=6, memory_bytes=4 * one)
    for i in range(1, 7):
        box.put(entry(i))
    for e in drain(box):
        box.acknowledged(e)
    assert box.refill_request() == (5, 2)  # two entries are half of memory_bytes
    assert box.refill_request() is None  # one read at a time
    store = _StoreModel(ops)
    store.sync()
    page = store.page(5, 2)  # read now, handed over later
    for i in range(7, 12):
        box.put(entry(i))  # the last one drops the oldest: 5, on disk, meanwhile
    assert box.stats.dropped_full == 1
    assert box.refilled(page) == 1  # 5 skipped, 6 taken
    assert [e.seq for e in box.mem] == [6]
    assert box.refill_request() == (7, 2)


class _StoreModel:
    """What the store would hold for the outbox, from the operations it emitted."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.seen = 0
        self.rows: dict[int, PutOutbox] = {}
        self.puts = 0

    def sync(self) -> None:
        for op in self.ops[self.seen :]:
            if isinstance(op, PutOutbox):
                assert op.pos not in self.rows
                self.rows[op.pos] = op
                self.puts += 1
            else:
                assert isinstance(op, RemoveOutbox)
                del self.rows[op.pos]  # removed once, and only what was put
        self.seen = len(self.ops)

    def size(self, row: PutOutbox) -> int:
        return len(row.topic) + len(row.payload) + len(row.properties) + OUTBOX_ENTRY_OVERHEAD

    def page(self, first: int, count: int) -> list[Entry]:
        return [
            stored(row) for pos, row in sorted(self.rows.items()) if first <= pos < first + count
        ]


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["put", "send", "ack", "rewind", "page", "refilled", "expire"]),
            st.integers(0, 60),
        ),
        max_size=80,
    ),
    policy=st.sampled_from([DROP_OLDEST, DROP_NEWEST]),
)
# Found by a run: drop-oldest dropping the message in flight at the head, with the one
# behind it already acknowledged, counted that one as dropped too.
@example(
    steps=[("put", n) for n in (0, 20, 32, 44, 44, 44, 48, 48)]
    + [("send", 0), ("ack", 1), ("put", 40)],
    policy=DROP_OLDEST,
)
def test_counts_bytes_and_the_store_agree_through_every_path(
    steps: list[tuple[str, int]], policy: str
) -> None:
    """Every operation keeps the outbox's count, bytes, memory bytes and statistics
    equal to what its store operations say, sends each accepted entry at most once per
    link (all of them, in order, unless dropped) and writes each entry's fields."""
    one = entry(1, size=0).size
    memory = one * 3
    box, ops = make_outbox(policy, max_messages=12, max_bytes=one * 10 + 200, memory_bytes=memory)
    store = _StoreModel(ops)
    page: list[Entry] | None = None
    accepted: dict[int, Entry] = {}  # seq -> entry as put
    refused = 0
    inflight: list[Entry] = []
    sent_this_link: list[int] = []
    wall = 0.0
    seq = 0
    for action, n in steps:
        if action in {"put", "expire"}:
            seq += 1
            expires = wall + n % 2 if action == "expire" else None
            e = entry(seq, size=n, qos=1 + n % 2, expires=expires)
            e.retain = bool(n % 3 == 0)
            e.properties = b"\x01\x01" if n % 4 == 0 else b""
            if box.put(e):
                accepted[seq] = e
                row = ops[-1] if isinstance(ops[-1], PutOutbox) else None
                assert row is not None and row.seq == seq
                assert (
                    row.bridge,
                    row.pos,
                    row.topic,
                    row.payload,
                    row.qos,
                    row.retain,
                    row.properties,
                    row.created,
                    row.expires,
                ) == (
                    "cloud",
                    e.pos,
                    e.topic,
                    e.payload,
                    e.qos,
                    int(e.retain),
                    e.properties,
                    e.created,
                    e.expires,
                )
            else:
                refused += 1
        elif action == "send":
            wall += n % 3  # time passes: some entries expire on their turn
            while (ready := box.next_ready(wall)) is not None:
                e = ready
                assert e.seq not in sent_this_link, "sent twice on one link"
                assert not sent_this_link or e.seq > sent_this_link[-1], "out of order"
                sent_this_link.append(e.seq)
                inflight.append(e)
            # Nothing in memory was skipped: all of it is in flight or done.
            assert all(e.state != PENDING for e in box.mem)
        elif action == "ack" and inflight:
            box.acknowledged(inflight.pop(n % len(inflight)))
        elif action == "rewind":
            box.rewind()
            inflight.clear()
            sent_this_link.clear()
        elif action == "page" and page is None:
            # The store reads the page now; it arrives at a later step, and entries
            # dropped meanwhile must be skipped.
            request = box.refill_request()
            if request is not None:
                store.sync()
                page = store.page(*request)
        elif action == "refilled" and page is not None:
            box.refilled(page)
            page = None
            # A page is at most half the memory budget (plus the entry that crosses it).
            assert box.mem_bytes < memory * 3 // 2 + one + 60 + 2
        store.sync()
        assert box.count == len(store.rows) == len(box.mem) + box.spilled
        assert box.bytes == sum(store.size(r) for r in store.rows.values())
        assert box.mem_bytes == sum(e.size for e in box.mem)
        assert box.stats.queued == store.puts == len(accepted)
        removed = store.puts - len(store.rows)
        # Removed from the store: acknowledged, expired or dropped, once released
        # from the head (an entry done out of order waits for those before it).
        waiting = sum(e.state == DONE for e in box.mem)
        stats = box.stats
        done = stats.acknowledged + stats.dropped_expired + stats.dropped_full - refused
        assert removed == done - waiting
    # The last link: everything left goes up, in order, each once.
    if page is not None:
        box.refilled(page)
    box.rewind()
    left: list[int] = []
    for _ in range(1000):
        while (ready := box.next_ready(wall)) is not None:
            left.append(ready.seq)
            box.acknowledged(ready)
        request = box.refill_request()
        if request is None and not box.spilled:
            break
        if request is not None:
            store.sync()
            box.refilled(store.page(*request))
    store.sync()
    assert left == sorted(left) and len(set(left)) == len(left)
    assert box.count == 0 and box.bytes == 0 and box.mem_bytes == 0 and store.rows == {}


# ---------------------------------------------------------------------- sequence


def test_sequence_numbers_grow_and_reserve_ahead_in_the_store() -> None:
    seq, reserve = Sequence.resume(stored_reserved=0, highest_used=0)
    assert (seq.next, reserve, seq.limit) == (1, 1 + BLOCK, 1 + BLOCK)
    ops: list[Op] = []
    numbers = [seq.take(1, ops) for _ in range(BLOCK // 2 + 2)]
    assert numbers == list(range(1, BLOCK // 2 + 3))
    assert ops == [SetMeta(META_KEY, str(1 + 2 * BLOCK))]
    assert seq.limit == 1 + BLOCK  # the new block counts only once committed
    seq.commit(1)
    assert seq.limit == 1 + 2 * BLOCK


def test_after_a_restart_numbering_resumes_above_everything_used() -> None:
    seq, reserve = Sequence.resume(stored_reserved=3 * BLOCK, highest_used=5)
    assert seq.next == 3 * BLOCK and reserve == 4 * BLOCK
    seq, _ = Sequence.resume(stored_reserved=10, highest_used=50)
    assert seq.next == 51


def test_bridges_handed_the_same_message_share_its_number() -> None:
    seq = Sequence(100)
    a, b = object(), object()
    assert seq.for_message(a, 0, None) == 100
    assert seq.for_message(a, 0, None) == 100
    assert seq.for_message(b, 0, None) == 101


# ---------------------------------------------------------------------- config

BRIDGE = """
[gateway]
id = "gw1"
[[bridges]]
name = "cloud"
address = "broker.example:8883"
addresses = ["backup.example"]
protocol = "3.1.1"
envelope = true
tls = {{ enabled = true }}
outbox = {{ when_full = "refuse", max_bytes = 2048 }}
{extra}
[[bridges.rules]]
filter = "sensors/#"
local_prefix = "ledge/gw1/"
remote_prefix = "site1/"
"""


def test_bridge_config_becomes_runtime_settings_and_survives_json() -> None:
    config = parse_config(BRIDGE.format(extra=""))
    runtime = config.to_runtime()
    (bridge,) = runtime.bridges
    assert bridge.addresses == (("broker.example", 8883), ("backup.example", 8883))
    assert bridge.version == 4 and bridge.envelope and bridge.tls.enabled
    assert bridge.outbox.when_full == "refuse" and bridge.outbox.max_bytes == 2048
    assert bridge.rules[0].local_filter == "ledge/gw1/sensors/#"
    assert RuntimeConfig.from_json(runtime.to_json()) == runtime


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[[bridges]]\nname = "c"\n[[bridges.rules]]\nfilter = "a"\n',
            "bridges[0] (line 1): Value error, give the remote broker as address",
        ),
        (
            '[[bridges]]\nname = "c"\naddress = "h:99999"\n[[bridges.rules]]\nfilter = "a"\n',
            "port '99999' is not 1..65535",
        ),
        (
            '[[bridges]]\nname = "c"\naddress = "h"\n[[bridges.rules]]\nfilter = "a/#/b"\n',
            "bridges[0].rules[0] (line 4): Value error, filter: '#' must be the last level",
        ),
        (
            '[[bridges]]\nname = "c"\naddress = "h"\nrules = []\n',
            "bridges[0].rules (line 4): List should have at least 1 item",
        ),
        (
            '[[bridges]]\nname = "c/d"\naddress = "h"\n[[bridges.rules]]\nfilter = "a"\n',
            "bridges[0].name (line 2)",
        ),
        (
            '[[bridges]]\nname = "c"\naddress = "h"\n'
            'tls = { enabled = true, ca_file = "/nonexistent/ca.pem" }\n'
            '[[bridges.rules]]\nfilter = "a"\n',
            "ca_file: no such file: /nonexistent/ca.pem",
        ),
    ],
)
def test_bridge_config_errors_name_the_key(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "b.toml")
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_cert_without_key_is_refused(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    text = BRIDGE.format(extra="").replace(
        "tls = { enabled = true }", f'tls = {{ enabled = true, cert_file = "{cert}" }}'
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert any("cert_file and key_file go together" in p for p in info.value.problems)


def test_two_bridges_cannot_share_a_name() -> None:
    one = '[[bridges]]\nname = "c"\naddress = "h"\n[[bridges.rules]]\nfilter = "a"\n'
    with pytest.raises(ConfigError) as info:
        parse_config(one + one)
    assert any("two bridges are named 'c'" in p for p in info.value.problems)


# ---------------------------------------------------------------------- marks on the wire


def test_upstream_properties_are_the_codecs_bytes_with_the_marks() -> None:
    from gateway.bridge.link import Bridge
    from gateway.bridge.settings import BridgeSettings
    from gateway.mqtt.properties import Properties, encode_properties
    from tests.support.harness import Harness

    h = Harness()
    settings = BridgeSettings("cloud", (("127.0.0.1", 1),), (RuleSettings("#"),))
    bridge = Bridge(settings, gateway="gw1", prefix="ledge", broker=h.broker, sequence=Sequence(1))
    marks = (("ledge-gateway", "gw1"), ("ledge-seq", "42"))
    plain = Entry(1, 42, "t", b"p", 1, False, b"", 0.0)
    assert bridge._properties(plain, True).pack() == encode_properties(
        Properties(user_properties=marks)
    )
    assert bridge._properties(plain, False).pack() == b"\x00"
    own = Properties(content_type="text/plain", user_properties=(("site", "n"),))
    rich = Entry(1, 42, "t", b"p", 1, False, encode_properties(own), 0.0, time.time() + 100)
    packed = bridge._properties(rich, True).pack()
    from gateway.mqtt.properties import Where, decode_properties

    got, _ = decode_properties(packed, 0, len(packed), Where.PUBLISH)
    assert got.content_type == "text/plain"
    assert got.user_properties == (("site", "n"), *marks)
    assert got.message_expiry_interval in (99, 100)  # what is left of it


# ---------------------------------------------------------------------- reload


def test_a_changed_bridge_carries_on_with_the_outbox_and_the_new_rules() -> None:
    """``successor``: what was queued stays queued, as mapped under the old rules; the
    local subscriptions are the new rules' from the same moment; the counters go on."""
    import asyncio

    from gateway.bridge.link import Bridge
    from gateway.bridge.settings import BridgeSettings
    from tests.support.harness import Harness

    h = Harness()
    closed = (("127.0.0.1", 1),)  # nothing listens: the link never comes up
    old_settings = BridgeSettings("cloud", closed, (RuleSettings("t/#", remote_prefix="old/"),))
    new_settings = BridgeSettings("cloud", closed, (RuleSettings("u/#", remote_prefix="new/"),))

    async def run() -> None:
        old = Bridge(
            old_settings, gateway="gw1", prefix="ledge", broker=h.broker, sequence=Sequence(1)
        )
        old.start()
        h.broker.publish_local("t/1", b"a", h.now, qos=1)
        old.stats.connects = 3
        await old.stop()
        h.broker.publish_local("t/2", b"b", h.now, qos=1)  # the link is down, not the outbox
        new = old.successor(new_settings)
        new.start()
        assert new.outbox is old.outbox and new.stats.connects == 3
        h.broker.publish_local("t/3", b"c", h.now, qos=1)  # no rule takes t/ any more
        h.broker.publish_local("u/1", b"d", h.now, qos=1)
        assert [e.topic for e in new.outbox.mem] == ["old/t/1", "old/t/2", "new/u/1"]
        # One in-process client of that name, the new one; the old one is gone.
        assert h.broker.sessions["ledge-bridge-cloud"] is new.local.session
        assert Bridge.local_ids >= {"ledge-bridge-cloud"}
        await new.stop()
        new.detach()
        assert "ledge-bridge-cloud" not in h.broker.sessions
        assert "ledge-bridge-cloud" not in Bridge.local_ids

    asyncio.run(run())


def test_a_page_of_the_outbox_cancelled_by_a_stop_is_read_again_after_a_change(
    tmp_path: Path,
) -> None:
    """A bridge stopped (a reload changed it) while it was reading a page of its outbox
    from the store: its successor asks for that page again rather than wait forever."""
    import asyncio

    from gateway.bridge.link import Bridge
    from gateway.bridge.settings import BridgeSettings
    from gateway.store.sqlite import Store
    from tests.support.harness import Harness

    h = Harness()
    store = Store(tmp_path)
    store.open()
    settings = BridgeSettings("cloud", (("127.0.0.1", 1),), (RuleSettings("t/#"),))

    async def run() -> None:
        old = Bridge(
            settings, gateway="gw1", prefix="ledge", broker=h.broker, sequence=Sequence(1),
            store=store,
        )  # fmt: skip
        old.outbox.restore([(1, 100, 0.0), (2, 100, 0.0)])  # on disk, not yet in memory
        old._refill()  # what the sender does; the read has not started
        assert old.outbox.refilling
        await old.stop()  # cancels it
        new = old.successor(settings)
        assert not new.outbox.refilling
        new._refill()
        assert new.outbox.refilling  # asked again
        await asyncio.gather(*new._loads)
        await new.stop()
        new.detach()

    try:
        asyncio.run(run())
    finally:
        store.close()

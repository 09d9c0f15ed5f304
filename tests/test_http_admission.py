"""The HTTP listener's slot table (``gateway.net.http_admission``), pure: who is admitted,
who is closed to make room and why, with time as an argument. The same rules over
real sockets are in ``tests/test_http.py``; here every step and the table's
invariants under any sequence of events."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.net.http_admission import (
    ADDRESS_FULL,
    LISTENER_FULL,
    UNFINISHED_FULL,
    Admission,
    Budgets,
    Phase,
    Verdict,
)

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def table(
    max_connections: int = 8, share: float = 0.5, per_address: int = 3, grace: float = 1.0
) -> Admission[int]:
    return Admission(Budgets(max_connections, share, per_address, grace))


def evicted(verdict: Verdict[int]) -> list[tuple[int, str]]:
    return [(e.key, e.reason) for e in verdict.evicted]


def test_an_address_at_its_budget_loses_its_own_oldest_waiting_connection() -> None:
    t = table()
    for key in (1, 2, 3):
        assert t.admit(key, A, 0.0).refused is None
    t.admit(10, B, 0.0)
    # No grace for the address budget: even a connection just opened goes.
    verdict = t.admit(4, A, 0.0)
    assert verdict.refused is None and evicted(verdict) == [(1, ADDRESS_FULL)]
    assert t.per_address == {A: 3, B: 1} and 10 in t.slots


def test_an_address_whose_connections_are_all_answered_is_refused() -> None:
    t = table()
    for key in (1, 2, 3):
        t.admit(key, A, 0.0)
        t.answering(key)
    verdict = t.admit(4, A, 5.0)
    assert verdict.refused == ADDRESS_FULL and not verdict.evicted
    assert t.admit(5, B, 5.0).refused is None  # other addresses are not concerned


def test_idle_connections_count_and_go_when_their_address_needs_the_room() -> None:
    t = table()
    t.admit(1, A, 0.0)
    t.answering(1)
    t.idle(1, 1.0)  # answered; keep-alive
    t.admit(2, A, 2.0)
    t.admit(3, A, 3.0)
    assert evicted(t.admit(4, A, 3.0)) == [(1, ADDRESS_FULL)]


def test_unfinished_connections_hold_their_share_once_past_the_grace() -> None:
    t = table(max_connections=8, share=0.5, per_address=8)
    for key in range(4):  # the share: 4 slots
        t.admit(key, f"10.1.0.{key}", 0.0)
    # Within the grace and with free slots, a burst is admitted past the share...
    verdict = t.admit(4, B, 0.5)
    assert verdict.refused is None and not verdict.evicted
    assert t.unfinished == 5
    # ... and once the oldest had its grace, a newcomer costs it its slot.
    assert evicted(t.admit(5, C, 1.0)) == [(0, UNFINISHED_FULL)]


def test_a_full_listener_closes_the_oldest_unfinished_then_the_oldest_idle() -> None:
    t = table(max_connections=4, share=1.0, per_address=4, grace=100.0)
    t.admit(1, A, 0.0)
    t.answering(1)
    t.idle(1, 0.5)  # the oldest, but idle: a proven client
    t.admit(2, B, 1.0)  # unfinished
    t.admit(3, C, 2.0)
    t.answering(3)  # being answered: never closed
    t.admit(4, "10.0.0.4", 3.0)
    assert t.full
    assert evicted(t.admit(5, "10.0.0.5", 3.0)) == [(2, LISTENER_FULL)]
    t.answering(4)
    t.answering(5)
    assert evicted(t.admit(6, "10.0.0.6", 3.0)) == [(1, LISTENER_FULL)]
    t.answering(6)
    # Every connection is being answered: nothing to close, the newcomer is refused.
    verdict = t.admit(7, "10.0.0.7", 3.0)
    assert verdict.refused == LISTENER_FULL and not verdict.evicted
    assert len(t) == 4


def test_a_new_request_on_a_keep_alive_connection_is_unfinished_from_its_first_byte() -> None:
    t = table(max_connections=4, share=0.5, per_address=4, grace=0.0)
    t.admit(1, A, 0.0)
    t.answering(1)
    t.idle(1, 1.0)
    t.admit(2, B, 2.0)
    t.request_started(1, 3.0)  # now the younger unfinished one
    assert t.slots[1].phase is Phase.UNFINISHED and t.unfinished == 2
    assert evicted(t.admit(3, C, 4.0)) == [(2, UNFINISHED_FULL)]


def test_leaving_frees_the_slot_and_the_address_budget() -> None:
    t = table(per_address=1)
    t.admit(1, A, 0.0)
    assert t.leave(1) is not None and t.leave(1) is None
    assert t.per_address == {} and len(t) == 0
    verdict = t.admit(2, A, 0.0)
    assert verdict.refused is None and not verdict.evicted


# ----------------------------------------------------------------------------- laws

events = st.lists(
    st.tuples(
        st.sampled_from(["admit", "answering", "idle", "started", "leave"]),
        st.integers(0, 30),  # a connection
        st.sampled_from([A, B, C, "10.0.0.4"]),
        st.floats(0, 2),  # time passing
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(events, st.integers(1, 6), st.sampled_from([0.25, 0.5, 1.0]), st.integers(1, 4))
def test_the_table_holds_its_bounds_and_never_closes_an_answer_in_progress(
    script: list[tuple[str, int, str, float]], size: int, share: float, per_address: int
) -> None:
    t = table(size, share, per_address, grace=1.0)
    now = 0.0
    for op, key, address, dt in script:
        now += dt
        if op == "admit":
            if key in t.slots:
                continue
            before = {k: s.phase for k, s in t.slots.items()}
            verdict = t.admit(key, address, now)
            for e in verdict.evicted:
                assert before[e.key] is not Phase.ANSWERING
                assert e.key not in t.slots
            if verdict.refused is None:
                assert t.slots[key].phase is Phase.UNFINISHED
            elif verdict.refused == LISTENER_FULL:
                # Refused only when nothing was left to close.
                assert all(s.phase is Phase.ANSWERING for s in t.slots.values())
        elif key in t.slots:
            if op == "answering":
                t.answering(key)
            elif op == "idle":
                t.idle(key, now)
            elif op == "started":
                t.request_started(key, now)
            else:
                t.leave(key)
        assert len(t) <= size
        assert all(n <= per_address for n in t.per_address.values())
        assert sum(t.per_address.values()) == len(t)
        assert t.unfinished == sum(s.phase is Phase.UNFINISHED for s in t.slots.values())

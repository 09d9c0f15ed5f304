"""SubTree laws (the mqttd seed), checked with hypothesis against the one-line oracle.

- merge is associative, with the empty tree as identity;
- from_items(flatten(t)) == t;
- find(topic) agrees with ``matches(filter, topic)`` for every stored filter,
  including topics generated to match a given filter;
- match_filter (retained lookups) agrees with the same oracle;
- removal prunes: a tree emptied by removals has no nodes left.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.broker.router import SubscriptionIndex
from gateway.broker.state import Session, Subscription
from gateway.broker.subtree import SubTree
from gateway.mqtt.topics import filter_error, matches, subsumes

LEVEL_WORDS = ["a", "b", "c", "", "$SYS", "$x", "dev", "temp"]
level = st.sampled_from(LEVEL_WORDS)
topic = st.lists(level, min_size=1, max_size=5).map("/".join).filter(bool)


@st.composite
def topic_filter(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.one_of(level, st.just("+")), min_size=1, max_size=5))
    if draw(st.booleans()):
        levels.append("#")
    text = "/".join(levels)
    return text if text and filter_error(text) is None else "#"


@st.composite
def topic_matching(draw: st.DrawFn, flt: str) -> str:
    """A topic that ``flt`` must match (the generator the SubTree seed asks for)."""
    out: list[str] = []
    for i, lv in enumerate(flt.split("/")):
        if lv == "#":
            # "a/#" also matches "a"; but a topic is never empty, so "/#" needs a level
            at_least = 0 if "/".join(out) else 1
            out.extend(
                draw(st.lists(st.sampled_from(["a", "b", "x"]), min_size=at_least, max_size=3))
            )
            break
        if lv == "+":
            choices = ["a", "b", "", "x"] if i else ["a", "b", "x"]
            out.append(draw(st.sampled_from(choices)))
        else:
            out.append(lv)
    text = "/".join(out)
    assert text, flt
    return text


values = st.frozensets(st.integers(0, 5), min_size=1, max_size=3)
trees = st.lists(st.tuples(topic_filter(), values), max_size=12).map(SubTree.from_items)


def union(a: frozenset[int], b: frozenset[int]) -> frozenset[int]:
    return a | b


@given(trees, trees, trees)
def test_merge_is_associative(
    a: SubTree[frozenset[int]], b: SubTree[frozenset[int]], c: SubTree[frozenset[int]]
) -> None:
    assert a.merge(b, union).merge(c, union) == a.merge(b.merge(c, union), union)


@given(trees)
def test_empty_tree_is_identity_of_merge(t: SubTree[frozenset[int]]) -> None:
    empty: SubTree[frozenset[int]] = SubTree()
    assert t.merge(empty, union) == t
    assert empty.merge(t, union) == t


@given(trees)
def test_from_items_flatten_round_trips(t: SubTree[frozenset[int]]) -> None:
    assert SubTree.from_items(t.flatten()) == t
    assert len(SubTree.from_items(t.flatten())) == len(t)


@given(trees)
def test_map_values_identity_and_composition(t: SubTree[frozenset[int]]) -> None:
    assert t.map_values(lambda v: v) == t
    f = lambda v: frozenset(x + 1 for x in v)  # noqa: E731
    g = lambda v: frozenset(x * 2 for x in v)  # noqa: E731
    assert t.map_values(f).map_values(g) == t.map_values(lambda v: g(f(v)))


@given(st.lists(topic_filter(), min_size=1, max_size=12, unique=True), topic)
def test_find_agrees_with_oracle(filters: list[str], t: str) -> None:
    tree = SubTree.from_items((f, f) for f in filters)
    assert sorted(tree.find(t)) == sorted(f for f in filters if matches(f, t))


@given(st.data())
def test_find_with_topics_generated_to_match(data: st.DataObject) -> None:
    flt = data.draw(topic_filter())
    t = data.draw(topic_matching(flt))
    if t.startswith("$") and flt[:1] in ("+", "#"):
        assert not matches(flt, t)  # MQTT-4.7.2-1
        return
    assert matches(flt, t), (flt, t)
    tree = SubTree.from_items([(flt, 1)])
    assert tree.find(t) == [1]


@given(st.lists(topic, min_size=1, max_size=15, unique=True), topic_filter())
def test_match_filter_agrees_with_oracle(topics: list[str], flt: str) -> None:
    """Retained messages: a tree keyed by topic, looked up by filter."""
    tree = SubTree.from_items((t, t) for t in topics)
    got = sorted(k for k, _v in tree.match_filter(flt))
    assert got == sorted(t for t in topics if matches(flt, t))


@given(st.lists(st.tuples(topic_filter(), st.integers()), max_size=20))
def test_removing_everything_prunes_every_node(items: list[tuple[str, int]]) -> None:
    tree = SubTree.from_items(items)
    for key, _ in items:
        tree.remove(key)
    assert len(tree) == 0
    assert tree.node_count() == 0


@given(st.lists(topic_filter(), min_size=1, max_size=10), topic)
def test_subscription_index_agrees_with_oracle(filters: list[str], t: str) -> None:
    """Exact hash index + wildcard tree + shared groups together equal the oracle."""
    index = SubscriptionIndex()
    sessions = []
    for i, f in enumerate(filters):
        s = Session(f"c{i}")
        sessions.append(s)
        index.add(s, Subscription(f, 0))
        index.add(s, Subscription(f, 0, share_name="g"))
    route = index.route(t)
    got = sorted(s.client_id for s, _subs in route.direct)
    expected = sorted(f"c{i}" for i, f in enumerate(filters) if matches(f, t))
    assert got == expected
    shared_filters = sorted(g.topic_filter for g in route.shared)
    assert shared_filters == sorted({f for f in filters if matches(f, t)})
    # the cached answer is the same, and removal invalidates it
    assert index.route(t) is route
    for i, f in enumerate(filters):
        index.remove(sessions[i], Subscription(f, 0))
        index.remove(sessions[i], Subscription(f, 0, share_name="g"))
    assert index.route(t).direct == []
    assert index.count == 0


@settings(max_examples=300)
@given(topic_filter(), topic_filter(), topic)
def test_subsumes_is_sound(general: str, specific: str, t: str) -> None:
    """If ``general`` subsumes ``specific``, every topic ``specific`` matches, it matches too."""
    if subsumes(general, specific) and matches(specific, t):
        assert matches(general, t)


def test_find_examples_from_the_specification() -> None:
    """MQTT 5.0 section 4.7.1.2 and 4.7.1.3 examples."""
    tree = SubTree.from_items(
        [("sport/tennis/player1/#", 1), ("sport/#", 2), ("sport/+", 3), ("+/+", 4), ("/+", 5)]
    )
    assert sorted(tree.find("sport/tennis/player1")) == [1, 2]
    assert sorted(tree.find("sport/tennis/player1/ranking")) == [1, 2]
    assert sorted(tree.find("sport")) == [2]
    assert sorted(tree.find("sport/")) == [2, 3, 4]
    assert sorted(tree.find("/finance")) == [4, 5]
    assert tree.find("$SYS/x") == []


def test_modify_and_get() -> None:
    tree: SubTree[int] = SubTree()
    tree.modify("a/b", lambda old: (old or 0) + 1)
    tree.modify("a/b", lambda old: (old or 0) + 1)
    assert tree.get("a/b") == 2
    tree.modify("a/b", lambda old: None)
    assert tree.get("a/b") is None
    assert tree.node_count() == 0

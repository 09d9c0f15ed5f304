"""Subscription index: who gets a message published to a topic.

Wildcard filters live in a SubTree; wildcard-free filters live in a hash index
beside it (the mosquitto-hash / EMQX route-table idea), since most device
subscriptions are exact. Shared subscriptions have their own tree of groups.
Topic -> route results are cached and invalidated on subscription change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.broker.subtree import SubTree
from gateway.mqtt.topics import has_wildcard, matches

if TYPE_CHECKING:
    from gateway.broker.state import Session, Subscription

Entry = tuple["Session", "Subscription"]


class SharedGroup:
    """``$share/{name}/{filter}``: each message goes to one member, round robin."""

    __slots__ = ("_next", "_order", "members", "name", "topic_filter")

    def __init__(self, name: str, topic_filter: str) -> None:
        self.name = name
        self.topic_filter = topic_filter
        self.members: dict[str, Entry] = {}
        self._order: list[str] = []
        self._next = 0

    def __repr__(self) -> str:
        return f"SharedGroup({self.name!r}, {self.topic_filter!r}, {self._order})"

    def add(self, session: Session, sub: Subscription) -> None:
        if session.client_id not in self.members:
            self._order.append(session.client_id)
        self.members[session.client_id] = (session, sub)

    def remove(self, client_id: str) -> None:
        if self.members.pop(client_id, None) is not None:
            self._order.remove(client_id)

    def pick(self, topic: str) -> Entry | None:
        """The next member that may read ``topic``; connected members first, then any
        (the message queues)."""
        order = self._order
        n = len(order)
        if not n:
            return None
        start = self._next % n
        fallback: Entry | None = None
        for step in range(n):
            client_id = order[(start + step) % n]
            entry = self.members[client_id]
            rules = entry[0].rules
            if rules is not None and not rules.can_read(topic):
                continue
            conn = entry[0].conn
            if (conn is not None and conn.writable) or entry[0].sink is not None:
                self._next = start + step + 1
                return entry
            if fallback is None:
                fallback = entry
        self._next = start + 1
        return fallback


class Route:
    """Everything that receives a message on one topic."""

    __slots__ = ("direct", "shared")

    def __init__(
        self, direct: list[tuple[Session, tuple[Subscription, ...]]], shared: list[SharedGroup]
    ) -> None:
        self.direct = direct
        self.shared = shared


class SubscriptionIndex:
    """Subscriptions of every session, organised for lookup by topic."""

    __slots__ = ("_cache", "acl", "cache_size", "count", "exact", "shared", "tree")

    def __init__(self, cache_size: int = 4096) -> None:
        self.tree: SubTree[dict[str, Entry]] = SubTree()
        self.exact: dict[str, dict[str, Entry]] = {}
        self.shared: SubTree[dict[str, SharedGroup]] = SubTree()
        self._cache: dict[str, Route] = {}
        self.cache_size = cache_size
        self.count = 0
        #: Some session has ACL rules: routes leave out sessions that may not read.
        self.acl = False

    # ------------------------------------------------------------------ changes

    def clear_cache(self) -> None:
        """Forget every cached route (who may read what changed)."""
        self._cache.clear()

    def _invalidate(self, topic_filter: str) -> None:
        cache = self._cache
        if not cache:
            return
        if not has_wildcard(topic_filter):
            cache.pop(topic_filter, None)
            return
        for topic in [t for t in cache if matches(topic_filter, t)]:
            del cache[topic]

    def add(self, session: Session, sub: Subscription) -> None:
        """Add or replace ``sub`` for ``session``."""
        self._invalidate(sub.topic_filter)
        client_id = session.client_id
        if sub.share_name is not None:
            groups = self.shared.get(sub.topic_filter)
            if groups is None:
                groups = {}
                self.shared.add(sub.topic_filter, groups)
            group = groups.get(sub.share_name)
            if group is None:
                group = groups[sub.share_name] = SharedGroup(sub.share_name, sub.topic_filter)
            if client_id not in group.members:
                self.count += 1
            group.add(session, sub)
            return
        if has_wildcard(sub.topic_filter):
            bucket = self.tree.get(sub.topic_filter)
            if bucket is None:
                bucket = {}
                self.tree.add(sub.topic_filter, bucket)
        else:
            bucket = self.exact.get(sub.topic_filter)
            if bucket is None:
                bucket = self.exact[sub.topic_filter] = {}
        if client_id not in bucket:
            self.count += 1
        bucket[client_id] = (session, sub)

    def remove(self, session: Session, sub: Subscription) -> None:
        self._invalidate(sub.topic_filter)
        client_id = session.client_id
        if sub.share_name is not None:
            groups = self.shared.get(sub.topic_filter)
            if groups is None:
                return
            group = groups.get(sub.share_name)
            if group is None or client_id not in group.members:
                return
            group.remove(client_id)
            self.count -= 1
            if not group.members:
                del groups[sub.share_name]
                if not groups:
                    self.shared.remove(sub.topic_filter)
            return
        wild = has_wildcard(sub.topic_filter)
        bucket = self.tree.get(sub.topic_filter) if wild else self.exact.get(sub.topic_filter)
        if bucket is None or bucket.pop(client_id, None) is None:
            return
        self.count -= 1
        if not bucket:
            if wild:
                self.tree.remove(sub.topic_filter)
            else:
                del self.exact[sub.topic_filter]

    # ------------------------------------------------------------------ lookup

    def route(self, topic: str) -> Route:
        route = self._cache.get(topic)
        if route is None:
            route = self._compute(topic)
            cache = self._cache
            if len(cache) >= self.cache_size:
                cache.clear()
            cache[topic] = route
        return route

    def _compute(self, topic: str) -> Route:
        buckets = self.tree.find(topic)
        exact = self.exact.get(topic)
        if exact:
            buckets.append(exact)
        direct: list[tuple[Session, tuple[Subscription, ...]]]
        if len(buckets) == 1:
            direct = [(session, (sub,)) for session, sub in buckets[0].values()]
        else:
            merged: dict[str, tuple[Session, list[Subscription]]] = {}
            for bucket in buckets:
                for client_id, (session, sub) in bucket.items():
                    have = merged.get(client_id)
                    if have is None:
                        merged[client_id] = (session, [sub])
                    else:
                        have[1].append(sub)
            direct = [(session, tuple(subs)) for session, subs in merged.values()]
        if self.acl:
            # The ACL decides per (client, topic); cached routes carry the decision.
            direct = [
                (session, subs)
                for session, subs in direct
                if session.rules is None or session.rules.can_read(topic)
            ]
        shared: list[SharedGroup] = []
        if self.shared:
            for groups in self.shared.find(topic):
                shared.extend(groups.values())
        return Route(direct, shared)

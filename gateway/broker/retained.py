"""Retained messages: their own SubTree keyed by topic, looked up by filter."""

from __future__ import annotations

from gateway.broker.message import Message
from gateway.broker.subtree import SubTree


class RetainedStore:
    """The last retained message per topic, bounded by count and bytes."""

    __slots__ = ("bytes", "max_bytes", "max_messages", "refused", "tree")

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.tree: SubTree[Message] = SubTree()
        self.bytes = 0
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        #: Retained messages not stored because a bound was hit (policy: refuse new).
        self.refused = 0

    def __len__(self) -> int:
        return len(self.tree)

    def has_room(self, msg: Message) -> bool:
        """Would ``store(msg)`` keep it?"""
        old = self.tree.get(msg.topic)
        if old is None and len(self.tree) >= self.max_messages:
            return False
        freed = old.size if old is not None else 0
        return self.bytes - freed + msg.size <= self.max_bytes

    def store(self, msg: Message) -> bool:
        """Keep ``msg`` as the topic's retained message; empty payload deletes (MQTT-3.3.1-6).

        Returns False when a bound refuses a new topic (replacing one always fits if
        the new message is no larger than the bound allows).
        """
        if not msg.payload:
            self.delete(msg.topic)
            return True
        if not self.has_room(msg):
            self.refused += 1
            return False
        old = self.tree.get(msg.topic)
        freed = old.size if old is not None else 0
        self.tree.add(msg.topic, msg)
        self.bytes += msg.size - freed
        return True

    def delete(self, topic: str) -> None:
        old = self.tree.remove(topic)
        if old is not None:
            self.bytes -= old.size

    def matching(self, topic_filter: str, now: float) -> list[Message]:
        """Unexpired retained messages whose topic ``topic_filter`` matches."""
        out: list[Message] = []
        for topic, msg in self.tree.match_filter(topic_filter):
            if msg.expired(now):
                self.delete(topic)
            else:
                out.append(msg)
        return out

    def purge_expired(self, now: float) -> int:
        expired = [topic for topic, msg in self.tree.items() if msg.expired(now)]
        for topic in expired:
            self.delete(topic)
        return len(expired)

"""SubTree: a tree keyed by '/'-separated topic levels, generic over its values.

The same structure holds subscriptions (keyed by filter, looked up by topic with
``find``), shared-subscription groups, and retained messages (keyed by topic,
looked up by filter with ``match_filter``). Nodes are pruned when their last
value goes, so subscription churn leaves nothing behind.

Laws (tested): ``merge`` is associative with the empty tree as identity when the
combining function is; ``SubTree.from_items(t.items()) == t``; ``find`` and
``match_filter`` agree with ``gateway.mqtt.topics.matches``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from gateway.mqtt.topics import matches

V = TypeVar("V")
W = TypeVar("W")


class _Node(Generic[V]):
    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Node[V]] = {}
        self.value: V | None = None


class SubTree(Generic[V]):
    """A mutable tree from topic keys to values of type ``V`` (never None)."""

    __slots__ = ("_root", "_size")

    def __init__(self) -> None:
        self._root: _Node[V] = _Node()
        self._size = 0

    # ------------------------------------------------------------------ basics

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    __hash__ = None  # type: ignore[assignment]  # mutable container

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SubTree):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return f"SubTree({dict(self.items())!r})"

    def get(self, key: str) -> V | None:
        node: _Node[V] | None = self._root
        for level in key.split("/"):
            assert node is not None
            node = node.children.get(level)
            if node is None:
                return None
        assert node is not None
        return node.value

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def add(self, key: str, value: V) -> None:
        """Set the value at ``key`` (replacing any value there)."""
        node = self._root
        for level in key.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if node.value is None:
            self._size += 1
        node.value = value

    def modify(self, key: str, fn: Callable[[V | None], V | None]) -> V | None:
        """Replace the value at ``key`` by ``fn(old)``; None removes it. Returns the new value."""
        new = fn(self.get(key))
        if new is None:
            self.remove(key)
        else:
            self.add(key, new)
        return new

    def remove(self, key: str) -> V | None:
        """Remove ``key``; prunes nodes left without value or children. Returns the old value."""
        path: list[tuple[_Node[V], str]] = []
        node = self._root
        for level in key.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            path.append((node, level))
            node = child
        old = node.value
        if old is None:
            return None
        node.value = None
        self._size -= 1
        # Prune bottom-up (the mosquitto habit): no empty branches survive.
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.value is not None or child.children:
                break
            del parent.children[level]
        return old

    def node_count(self) -> int:
        """Nodes below the root; pruning keeps this proportional to ``len``."""
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count

    # ------------------------------------------------------------------ lookups

    def find(self, topic: str) -> list[V]:
        """Values at every filter key that matches ``topic`` (MQTT matching rules)."""
        out: list[V] = []
        levels = topic.split("/")
        self._find(self._root, levels, 0, len(levels), out, topic.startswith("$"))
        return out

    def _find(
        self, node: _Node[V], levels: list[str], i: int, n: int, out: list[V], dollar: bool
    ) -> None:
        while True:
            children = node.children
            if i == n:
                if node.value is not None:
                    out.append(node.value)
                hash_node = children.get("#")
                if hash_node is not None and hash_node.value is not None:
                    out.append(hash_node.value)  # "a/#" matches "a"
                return
            if not children:
                return
            if not (dollar and i == 0):  # MQTT-4.7.2-1
                hash_node = children.get("#")
                if hash_node is not None and hash_node.value is not None:
                    out.append(hash_node.value)
                plus = children.get("+")
                if plus is not None:
                    self._find(plus, levels, i + 1, n, out, dollar)
            nxt = children.get(levels[i])
            if nxt is None:
                return
            node = nxt
            i += 1

    def find_items(self, topic: str) -> list[tuple[str, V]]:
        """``(filter, value)`` for every filter key matching ``topic``."""
        return [(k, v) for k, v in self.items() if matches(k, topic)]

    def match_filter(self, topic_filter: str) -> list[tuple[str, V]]:
        """``(topic, value)`` for every topic key matched by ``topic_filter``."""
        out: list[tuple[str, V]] = []
        self._match(self._root, topic_filter.split("/"), 0, [], out)
        return out

    def _match(
        self,
        node: _Node[V],
        levels: list[str],
        i: int,
        path: list[str],
        out: list[tuple[str, V]],
    ) -> None:
        if i == len(levels):
            if node.value is not None:
                out.append(("/".join(path), node.value))
            return
        level = levels[i]
        if level == "#":
            if i > 0 and node.value is not None:
                out.append(("/".join(path), node.value))  # "a/#" matches "a"
            for key, child in node.children.items():
                if i == 0 and key.startswith("$"):
                    continue
                self._collect(child, [*path, key], out)
        elif level == "+":
            for key, child in node.children.items():
                if i == 0 and key.startswith("$"):
                    continue
                self._match(child, levels, i + 1, [*path, key], out)
        else:
            exact = node.children.get(level)
            if exact is not None:
                self._match(exact, levels, i + 1, [*path, level], out)

    def _collect(self, node: _Node[V], path: list[str], out: list[tuple[str, V]]) -> None:
        if node.value is not None:
            out.append(("/".join(path), node.value))
        for key, child in node.children.items():
            self._collect(child, [*path, key], out)

    # ------------------------------------------------------------------ whole trees

    def items(self) -> Iterator[tuple[str, V]]:
        """Every ``(key, value)`` (the tree flattened)."""
        stack: list[tuple[_Node[V], list[str]]] = [
            (child, [key]) for key, child in self._root.children.items()
        ]
        while stack:
            node, path = stack.pop()
            if node.value is not None:
                yield "/".join(path), node.value
            for key, child in node.children.items():
                stack.append((child, [*path, key]))

    def flatten(self) -> list[tuple[str, V]]:
        return sorted(self.items(), key=lambda kv: kv[0])

    def values(self) -> Iterator[V]:
        for _key, value in self.items():
            yield value

    @classmethod
    def from_items(cls, items: Iterable[tuple[str, V]]) -> SubTree[V]:
        tree: SubTree[V] = cls()
        for key, value in items:
            tree.add(key, value)
        return tree

    def map_values(self, fn: Callable[[V], W | None]) -> SubTree[W]:
        """A new tree with ``fn`` applied to every value (None drops the key)."""
        out: SubTree[W] = SubTree()
        for key, value in self.items():
            new = fn(value)
            if new is not None:
                out.add(key, new)
        return out

    def merge(self, other: SubTree[V], combine: Callable[[V, V], V]) -> SubTree[V]:
        """A new tree holding both; values under the same key are ``combine``d."""
        out: SubTree[V] = SubTree()
        for key, value in self.items():
            out.add(key, value)
        for key, value in other.items():
            mine = out.get(key)
            out.add(key, value if mine is None else combine(mine, value))
        return out

    def clear(self) -> None:
        self._root = _Node()
        self._size = 0

"""Authorization: access control lists in mosquitto's ``acl_file`` syntax, and the
broker-wide list of denied subscriptions. Pure: text in, decisions out.

The file, line by line (mosquitto.conf(5), ``acl_file``)::

    # a comment
    topic [read|write|readwrite|deny] TOPIC     before any user line: anonymous clients
    user USERNAME                               the lines below are for USERNAME
    topic [read|write|readwrite|deny] TOPIC
    pattern [read|write|readwrite|deny] TOPIC   every client; %c = its client id,
                                                %u = its user name (whole levels only)

The access word may be left out (``readwrite``). ``TOPIC`` is a topic filter and may
contain spaces. Decisions follow mosquitto 2: a client's own entries (its user's, or the
anonymous ones) are consulted before the patterns, and within each group ``deny``
entries come first; the first entry whose filter matches the topic decides -- ``deny``
denies, an entry granting the access allows, and when nothing decides the access is
denied. A topic beginning with ``$`` is only matched by entries whose filter begins with
``$`` (a leading wildcard never matches it). A client whose user name or client id
contains ``+`` or ``#`` gets no access through patterns.

Ledge applies the result to PUBLISH (write), to every message before it is delivered
and to retained messages sent on subscription (read), to wills (write, at CONNECT and
again when the will is published), and to SUBSCRIBE: a filter is refused when no entry
granting ``read`` overlaps it, or when a ``deny`` entry covering the whole filter comes
before every such grant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from gateway.mqtt.topics import filter_error, matches, subsumes

#: Access bits (mosquitto's MOSQ_ACL_READ / MOSQ_ACL_WRITE; DENY is MOSQ_ACL_NONE).
DENY: Final = 0
READ: Final = 1
WRITE: Final = 2
READWRITE: Final = READ | WRITE

_ACCESS: Final = {"read": READ, "write": WRITE, "readwrite": READWRITE, "deny": DENY}

#: Decisions remembered per client and direction; when full the cache starts afresh
#: (policy: clear when full, as the route cache does).
DECISION_CACHE_SIZE: Final = 1024

#: Stands for "every topic, ``$`` topics included" in a compiled rule list.
_EVERYTHING: Final = ""


class AclFileError(ValueError):
    """A line the ACL parser cannot use; ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True, slots=True)
class AclEntry:
    topic: str
    access: int


def _grouped(entries: list[AclEntry]) -> tuple[AclEntry, ...]:
    """Deny entries first, the rest in file order (mosquitto puts denials at the front)."""
    return tuple([e for e in entries if e.access == DENY] + [e for e in entries if e.access])


class Acl:
    """One parsed ACL file."""

    __slots__ = ("anonymous", "patterns", "users")

    def __init__(
        self,
        users: dict[str, list[AclEntry]] | None = None,
        anonymous: list[AclEntry] | None = None,
        patterns: list[AclEntry] | None = None,
    ) -> None:
        self.users = {name: _grouped(entries) for name, entries in (users or {}).items()}
        self.anonymous = _grouped(anonymous or [])
        self.patterns = _grouped(patterns or [])

    def rules_for(self, username: str | None, client_id: str) -> Rules:
        """The ordered rules that decide for one client."""
        own = self.anonymous if username is None else self.users.get(username, ())
        compiled: list[tuple[str, int]] = [(e.topic, e.access) for e in own]
        if self.patterns:
            if set("+#") & set(client_id) or (username is not None and set("+#") & set(username)):
                # A wildcard in an identity would turn a pattern into a wildcard.
                compiled.append((_EVERYTHING, DENY))
            else:
                for entry in self.patterns:
                    topic = _substitute(entry.topic, client_id, username)
                    if topic is not None:
                        compiled.append((topic, entry.access))
        return Rules(tuple(compiled))


def _substitute(pattern: str, client_id: str, username: str | None) -> str | None:
    """``pattern`` with whole ``%c``/``%u`` levels replaced, or None when it can match
    nothing for this client (no user name for ``%u``, an identity that is not one level)."""
    levels = pattern.split("/")
    for i, level in enumerate(levels):
        if level == "%c":
            value: str | None = client_id
        elif level == "%u":
            value = username
        else:
            continue
        if not value or "/" in value:
            return None
        levels[i] = value
    return "/".join(levels)


class Rules:
    """The ACL as it applies to one client: first match decides, decisions cached."""

    __slots__ = ("_read", "_write", "entries")

    def __init__(self, entries: tuple[tuple[str, int], ...]) -> None:
        self.entries = entries
        self._read: dict[str, bool] = {}
        self._write: dict[str, bool] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rules) and other.entries == self.entries

    def __hash__(self) -> int:
        return hash(self.entries)

    def __repr__(self) -> str:
        return f"Rules({self.entries!r})"

    def _decide(self, topic: str, access: int) -> bool:
        for topic_filter, granted in self.entries:
            if not topic_filter or matches(topic_filter, topic):
                if granted == DENY:
                    return False
                if granted & access:
                    return True
        return False

    def can_read(self, topic: str) -> bool:
        cache = self._read
        verdict = cache.get(topic)
        if verdict is None:
            verdict = self._decide(topic, READ)
            if len(cache) >= DECISION_CACHE_SIZE:
                cache.clear()
            cache[topic] = verdict
        return verdict

    def can_write(self, topic: str) -> bool:
        cache = self._write
        verdict = cache.get(topic)
        if verdict is None:
            verdict = self._decide(topic, WRITE)
            if len(cache) >= DECISION_CACHE_SIZE:
                cache.clear()
            cache[topic] = verdict
        return verdict

    def can_subscribe(self, topic_filter: str) -> bool:
        """Could a message on some topic of ``topic_filter`` ever be delivered?

        The first entry that is a ``deny`` covering the whole filter or a ``read``
        grant overlapping it decides.
        """
        for entry_filter, granted in self.entries:
            if granted == DENY:
                if not entry_filter or subsumes(entry_filter, topic_filter):
                    return False
            elif granted & READ and overlaps(entry_filter, topic_filter):
                return True
        return False


def overlaps(a: str, b: str) -> bool:
    """Is there a topic that both filters match?"""
    la = a.split("/")
    lb = b.split("/")
    # A leading wildcard never matches a '$' topic (MQTT-4.7.2-1).
    if (la[0] in ("+", "#") and lb[0][:1] == "$") or (lb[0] in ("+", "#") and la[0][:1] == "$"):
        return False
    for x, y in zip(la, lb, strict=False):
        if x == "#" or y == "#":
            return True
        if x != y and "+" not in (x, y):
            return False
    if len(la) == len(lb):
        return True
    longer = la if len(la) > len(lb) else lb
    return longer[min(len(la), len(lb)) :] == ["#"]  # "a/#" also matches "a"


def parse_acl_file(text: str) -> Acl:
    """An ``Acl`` from mosquitto ``acl_file`` text; raises ``AclFileError`` naming the line."""
    users: dict[str, list[AclEntry]] = {}
    anonymous: list[AclEntry] = []
    patterns: list[AclEntry] = []
    current: list[AclEntry] = anonymous
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        rest = rest.strip()
        if keyword == "user":
            if not rest:
                raise AclFileError(number, "user without a user name")
            current = users.setdefault(rest, [])
            continue
        if keyword not in ("topic", "pattern"):
            raise AclFileError(
                number, f"unknown keyword {_quoted(keyword)}(expected topic, pattern or user)"
            )
        if not rest:
            raise AclFileError(number, f"{keyword} without a topic")
        word, _, topic = rest.partition(" ")
        topic = topic.strip()
        if topic:
            access = _ACCESS.get(word)
            if access is None:
                raise AclFileError(
                    number,
                    f"unknown access {_quoted(word)}(expected read, write, readwrite or deny)",
                )
        else:  # "topic TOPIC": read and write
            topic, access = word, READWRITE
        error = filter_error(topic)
        if error:
            raise AclFileError(number, f"topic {topic!r}: {error}")
        entry = AclEntry(topic, access)
        (patterns if keyword == "pattern" else current).append(entry)
    return Acl(users, anonymous, patterns)


def _quoted(word: str) -> str:
    """``word`` quoted for an error message when it looks like a word, else nothing:
    a file given by mistake (a password file, a key) must not end up in a log."""
    return f"{word!r} " if word.isidentifier() and len(word) <= 32 else ""


def denied_by(deny_subscriptions: Iterable[str], topic_filter: str) -> str | None:
    """The entry of the broker's ``deny_subscriptions`` list that covers ``topic_filter``."""
    for denied in deny_subscriptions:
        if subsumes(denied, topic_filter):
            return denied
    return None

"""Authentication decisions and the password file format (mosquitto_passwd compatible).

A password file holds ``user:hash`` lines. Hashes in mosquitto 2's formats are
read as they are, so users migrate by copying the file:

- ``$7$<iterations>$<salt b64>$<hash b64>``: PBKDF2-HMAC-SHA512 (mosquitto 2 default)
- ``$6$<salt b64>$<hash b64>``: SHA-512 over password then salt (mosquitto 1.x)

Computing a hash is the slow part of a login, on purpose: the core does not compute it
but hands the shell a ``PasswordCheck`` to run off the event loop (see ``Broker.verifier``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.mqtt.reason_codes import ReasonCode

if TYPE_CHECKING:
    from gateway.broker.acl import Acl

#: PBKDF2-SHA512 iterations of hashes Ledge writes (mosquitto_passwd writes 101). One
#: verification costs about 8 ms on a desktop core and 30 ms on a Raspberry Pi 4; it
#: runs in a worker thread, never on the event loop.
DEFAULT_ITERATIONS = 10_000


class Authenticator(Protocol):
    """Decides whether a CONNECT may proceed."""

    def check(
        self, client_id: str, username: str | None, password: bytes | None
    ) -> int | PasswordCheck:
        """``ReasonCode.SUCCESS``, the refusal, or a password hash still to verify."""
        ...


@dataclass(frozen=True, slots=True)
class PasswordHash:
    scheme: str  # "7" (PBKDF2-SHA512) or "6" (salted SHA-512)
    salt: bytes = field(repr=False)  # hashes stay out of logs
    digest: bytes = field(repr=False)
    iterations: int = 0

    def verify(self, password: bytes) -> bool:
        # Imported here: the hashing libraries cost ~1 MiB of resident memory that a
        # gateway without a password file does not need.
        import hashlib
        import hmac

        if self.scheme == "7":
            got = hashlib.pbkdf2_hmac(
                "sha512", password, self.salt, self.iterations, len(self.digest)
            )
        else:
            got = hashlib.sha512(password + self.salt).digest()
        return hmac.compare_digest(got, self.digest)

    def encode(self) -> str:
        import base64

        salt = base64.b64encode(self.salt).decode()
        digest = base64.b64encode(self.digest).decode()
        if self.scheme == "7":
            return f"$7${self.iterations}${salt}${digest}"
        return f"$6${salt}${digest}"


def hash_password(password: str, iterations: int = DEFAULT_ITERATIONS) -> PasswordHash:
    import hashlib

    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return PasswordHash("7", salt, digest, iterations)


class PasswordFileError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


def parse_hash(text: str) -> PasswordHash:
    import base64
    import binascii

    parts = text.split("$")
    try:
        if len(parts) == 5 and parts[0] == "" and parts[1] == "7":
            iterations = int(parts[2])
            if iterations < 1:
                raise ValueError("iteration count must be positive")
            return PasswordHash(
                "7",
                base64.b64decode(parts[3], validate=True),
                base64.b64decode(parts[4], validate=True),
                iterations,
            )
        if len(parts) == 4 and parts[0] == "" and parts[1] == "6":
            return PasswordHash(
                "6",
                base64.b64decode(parts[2], validate=True),
                base64.b64decode(parts[3], validate=True),
            )
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"unreadable hash: {exc}") from None
    raise ValueError("unknown hash format (expected $7$... or $6$...)")


def parse_password_file(
    text: str, skipped: list[PasswordFileError] | None = None
) -> dict[str, PasswordHash]:
    """``user -> hash`` from a password file; blank lines and ``#`` comments skipped.

    A line that is not ``user:hash`` with a readable hash is skipped -- that user cannot
    log in -- and reported in ``skipped`` (its line number and what is wrong, never the
    hash): one typo must not lock every other user out, nor keep the gateway down
    (Mosquitto skips such lines too).
    """
    users: dict[str, PasswordHash] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        problem: PasswordFileError | None = None
        if not sep or not user:
            problem = PasswordFileError(number, "expected user:hash")
        else:
            try:
                users[user] = parse_hash(hashed)
            except ValueError as exc:
                problem = PasswordFileError(number, f"user {user!r}: {exc}")
        if problem is not None and skipped is not None:
            skipped.append(problem)
    return users


class PasswordCheck:
    """A password to verify against a hash: the slow step of a login, run by whoever
    the core hands it to. ``expected`` is False for a user name that does not exist:
    the check then runs against a dummy hash, so that the time a refusal takes does not
    tell which user names exist."""

    __slots__ = ("expected", "hash", "password")

    def __init__(self, hashed: PasswordHash, password: bytes, expected: bool = True) -> None:
        self.hash = hashed
        self.password = password
        self.expected = expected

    def __repr__(self) -> str:
        return "PasswordCheck(...)"  # never show the password

    def run(self) -> bool:
        return self.hash.verify(self.password) and self.expected


_DUMMY: list[PasswordHash] = []


def _dummy_hash() -> PasswordHash:
    if not _DUMMY:
        _DUMMY.append(hash_password(os.urandom(16).hex()))
    return _DUMMY[0]


class PasswordAuthenticator:
    """Anonymous policy plus an optional password file (mosquitto's model)."""

    __slots__ = ("allow_anonymous", "users")

    def __init__(
        self, allow_anonymous: bool = True, users: dict[str, PasswordHash] | None = None
    ) -> None:
        self.allow_anonymous = allow_anonymous
        self.users = users

    def check(
        self, client_id: str, username: str | None, password: bytes | None
    ) -> int | PasswordCheck:
        if username is None or self.users is None:
            return ReasonCode.SUCCESS if self.allow_anonymous else ReasonCode.NOT_AUTHORIZED
        entry = self.users.get(username)
        if entry is None or not password:
            # A zero-length password counts as none (as Mosquitto counts it): a file
            # line whose hash is of the empty string lets no one in.
            return PasswordCheck(_dummy_hash(), password or b"", expected=False)
        return PasswordCheck(entry, password)

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> int:
        """``check`` with the hash computed here (for callers that may block)."""
        verdict = self.check(client_id, username, password)
        if isinstance(verdict, PasswordCheck):
            ok = verdict.run()
            return ReasonCode.SUCCESS if ok else ReasonCode.BAD_USER_NAME_OR_PASSWORD
        return verdict


class ListenerPolicy:
    """Who may connect through one listener and what they may touch there."""

    __slots__ = ("acl", "authenticator", "max_connections", "use_identity_as_username")

    def __init__(
        self,
        authenticator: Authenticator,
        acl: Acl | None = None,
        max_connections: int = 0,
        use_identity_as_username: bool = False,
    ) -> None:
        self.authenticator = authenticator
        self.acl = acl
        #: Connections this listener may have open at once (0: only the broker's limit).
        self.max_connections = max_connections
        #: Take the user name from the TLS client certificate's CN; no password check.
        self.use_identity_as_username = use_identity_as_username

"""AES-CCM with a 4-byte tag, as BTHome v2 and MiBeacon v4/v5 encrypt adverts. Pure.

The cipher comes from ``cryptography`` (wheels for x86-64 and aarch64), imported
only when a device with a bindkey is configured: a gateway without encrypted
devices never loads it.
"""

from __future__ import annotations

from typing import Any

#: BTHome v2 and MiBeacon v4/v5 both use a 4-byte message integrity check.
TAG_LENGTH = 4


class Cipher:
    """One bindkey, ready to open adverts (the key schedule is computed once)."""

    __slots__ = ("_aead", "_invalid", "key")

    def __init__(self, key: bytes) -> None:
        if len(key) != 16:
            raise ValueError(f"a bindkey is 16 bytes (32 hex digits), not {len(key)}")
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESCCM

        self.key = key
        self._aead: Any = AESCCM(key, tag_length=TAG_LENGTH)
        self._invalid: type[Exception] = InvalidTag

    def open(self, nonce: bytes, sealed: bytes, associated: bytes | None) -> bytes | None:
        """The plaintext of ``sealed`` (ciphertext + tag), or None when the tag does not
        match: a wrong key, or bytes changed on the way."""
        try:
            plain: bytes = self._aead.decrypt(nonce, sealed, associated)
        except self._invalid:
            return None
        return plain

    def seal(self, nonce: bytes, plain: bytes, associated: bytes | None) -> bytes:
        """Ciphertext + tag (what a sensor sends); used by ``ledge ble`` tooling and tests."""
        sealed: bytes = self._aead.encrypt(nonce, plain, associated)
        return sealed


def parse_key(text: str) -> bytes:
    """A bindkey written as 32 hex digits; ValueError naming what is wrong."""
    cleaned = text.strip().replace(" ", "").replace(":", "")
    if len(cleaned) != 32:
        raise ValueError(f"a bindkey is 32 hex digits, got {len(cleaned)}")
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        raise ValueError("a bindkey is 32 hex digits (0-9, a-f)") from None

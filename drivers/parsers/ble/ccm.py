"""AES-CCM with a 4-byte tag, as BTHome v2 and MiBeacon v4/v5 encrypt adverts. Pure.

AES-128 (FIPS 197) and CCM (NIST SP 800-38C, RFC 3610) in plain Python: a sensor's
advert is a block or two, so the four to six block encryptions it takes cost tens of
microseconds here, and the gateway carries no cryptography library for them (loading
one costs about 9 MiB of resident memory on the device).

Only the forward cipher is needed: CCM encrypts with the counter mode and
authenticates with CBC-MAC, both with AES encryption. The table-driven round ("T
tables") is the classic software AES; its lookups depend on the key and the data, so
timing is not constant. That matters where an attacker can time many decryptions
with one key; here a decryption is one radio advert at a time and the tag comparison
itself does not stop at the first difference.
"""

from __future__ import annotations

from typing import Final

#: BTHome v2 and MiBeacon v4/v5 both use a 4-byte message integrity check.
TAG_LENGTH = 4

BLOCK: Final = 16


def _xtime(a: int) -> int:
    """Multiplication by x (that is, by 2) in AES's GF(2^8)."""
    a <<= 1
    return a ^ 0x11B if a & 0x100 else a


def _sbox() -> list[int]:
    """FIPS 197, 5.1.1: the multiplicative inverse in GF(2^8), then the affine map."""
    exp = [0] * 255
    log = [0] * 256
    x = 1
    for i in range(255):  # 3 generates the multiplicative group
        exp[i] = x
        log[x] = i
        x ^= _xtime(x)
    box = []
    for a in range(256):
        b = 0 if a == 0 else exp[(255 - log[a]) % 255]
        s = b
        for shift in (1, 2, 3, 4):
            s ^= ((b << shift) | (b >> (8 - shift))) & 0xFF
        box.append(s ^ 0x63)
    return box


SBOX: Final = _sbox()

# The round's SubBytes, ShiftRows and MixColumns for one byte of a column, as a column
# word (most significant byte = row 0); T1..T3 are T0 rotated by one byte each.
_T0: Final = [(_xtime(s) << 24) | (s << 16) | (s << 8) | (_xtime(s) ^ s) for s in SBOX]
_T1: Final = [(t >> 8) | ((t & 0xFF) << 24) for t in _T0]
_T2: Final = [(t >> 8) | ((t & 0xFF) << 24) for t in _T1]
_T3: Final = [(t >> 8) | ((t & 0xFF) << 24) for t in _T2]


def expand_key(key: bytes) -> tuple[int, ...]:
    """The 44 round-key words of an AES-128 key (FIPS 197, 5.2)."""
    if len(key) != 16:
        raise ValueError(f"an AES-128 key is 16 bytes, not {len(key)}")
    w = [int.from_bytes(key[i : i + 4], "big") for i in range(0, 16, 4)]
    rcon = 1
    sbox = SBOX
    for i in range(4, 44):
        t = w[i - 1]
        if i % 4 == 0:
            t = (
                (sbox[(t >> 16) & 0xFF] << 24)
                | (sbox[(t >> 8) & 0xFF] << 16)
                | (sbox[t & 0xFF] << 8)
                | sbox[t >> 24]
            ) ^ (rcon << 24)
            rcon = _xtime(rcon)
        w.append(w[i - 4] ^ t)
    return tuple(w)


def encrypt_block(rk: tuple[int, ...], block: int) -> int:
    """One AES-128 encryption of a block given as a 128-bit big-endian integer."""
    t0, t1, t2, t3 = _T0, _T1, _T2, _T3
    s0 = (block >> 96) ^ rk[0]
    s1 = ((block >> 64) & 0xFFFFFFFF) ^ rk[1]
    s2 = ((block >> 32) & 0xFFFFFFFF) ^ rk[2]
    s3 = (block & 0xFFFFFFFF) ^ rk[3]
    for r in range(4, 40, 4):
        s0, s1, s2, s3 = (
            t0[s0 >> 24] ^ t1[(s1 >> 16) & 0xFF] ^ t2[(s2 >> 8) & 0xFF] ^ t3[s3 & 0xFF] ^ rk[r],
            t0[s1 >> 24] ^ t1[(s2 >> 16) & 0xFF] ^ t2[(s3 >> 8) & 0xFF] ^ t3[s0 & 0xFF]
            ^ rk[r + 1],
            t0[s2 >> 24] ^ t1[(s3 >> 16) & 0xFF] ^ t2[(s0 >> 8) & 0xFF] ^ t3[s1 & 0xFF]
            ^ rk[r + 2],
            t0[s3 >> 24] ^ t1[(s0 >> 16) & 0xFF] ^ t2[(s1 >> 8) & 0xFF] ^ t3[s2 & 0xFF]
            ^ rk[r + 3],
        )  # fmt: skip
    sb = SBOX
    o0 = ((sb[s0 >> 24] << 24) | (sb[(s1 >> 16) & 0xFF] << 16)
          | (sb[(s2 >> 8) & 0xFF] << 8) | sb[s3 & 0xFF]) ^ rk[40]  # fmt: skip
    o1 = ((sb[s1 >> 24] << 24) | (sb[(s2 >> 16) & 0xFF] << 16)
          | (sb[(s3 >> 8) & 0xFF] << 8) | sb[s0 & 0xFF]) ^ rk[41]  # fmt: skip
    o2 = ((sb[s2 >> 24] << 24) | (sb[(s3 >> 16) & 0xFF] << 16)
          | (sb[(s0 >> 8) & 0xFF] << 8) | sb[s1 & 0xFF]) ^ rk[42]  # fmt: skip
    o3 = ((sb[s3 >> 24] << 24) | (sb[(s0 >> 16) & 0xFF] << 16)
          | (sb[(s1 >> 8) & 0xFF] << 8) | sb[s2 & 0xFF]) ^ rk[43]  # fmt: skip
    return (o0 << 96) | (o1 << 64) | (o2 << 32) | o3


class Cipher:
    """One bindkey, ready to open adverts (the key schedule is computed once).

    AES-CCM as NIST SP 800-38C and RFC 3610 define it, with a ``tag_length``-byte tag
    (4, 6, ..., 16) and a 7- to 13-byte nonce."""

    __slots__ = ("_rk", "key", "tag_length")

    def __init__(self, key: bytes, tag_length: int = TAG_LENGTH) -> None:
        if len(key) != 16:
            raise ValueError(f"a bindkey is 16 bytes (32 hex digits), not {len(key)}")
        if tag_length not in (4, 6, 8, 10, 12, 14, 16):
            raise ValueError(f"a CCM tag is 4, 6, ..., 16 bytes, not {tag_length}")
        self.key = key
        self.tag_length = tag_length
        self._rk = expand_key(key)

    def _length_field(self, nonce: bytes, size: int) -> int:
        """Bytes of the message-length field (RFC 3610's L) for this nonce."""
        n = len(nonce)
        if not 7 <= n <= 13:
            raise ValueError(f"a CCM nonce is 7 to 13 bytes, not {n}")
        q = 15 - n
        if size >= 1 << (8 * q):
            raise ValueError(f"{size} bytes do not fit a {q}-byte CCM length")
        return q

    def _mac(self, nonce: bytes, q: int, plain: bytes, associated: bytes | None) -> int:
        """CBC-MAC over B0, the encoded associated data and the message (SP 800-38C
        A.2): the last block, as an integer."""
        rk = self._rk
        encrypt = encrypt_block
        from_bytes = int.from_bytes
        flags = (0x40 if associated else 0) | ((self.tag_length - 2) // 2) << 3 | (q - 1)
        x = encrypt(rk, from_bytes(bytes([flags]) + nonce + len(plain).to_bytes(q, "big")))
        blocks = b""
        if associated:
            a = len(associated)
            if a < 0xFF00:
                head = a.to_bytes(2, "big")
            elif a < 1 << 32:
                head = b"\xff\xfe" + a.to_bytes(4, "big")
            else:
                raise ValueError("associated data of 4 GiB or more")
            blocks = head + associated
            blocks += bytes(-len(blocks) % BLOCK)
        blocks += plain + bytes(-len(plain) % BLOCK)
        for i in range(0, len(blocks), BLOCK):
            x = encrypt(rk, x ^ from_bytes(blocks[i : i + BLOCK], "big"))
        return x

    def _ctr(self, nonce: bytes, q: int, size: int) -> tuple[int, int]:
        """S0 (which masks the tag) and ``size`` bytes of key stream S1, S2, ... as an
        integer: counter blocks A_i = flags || nonce || i (SP 800-38C A.3)."""
        rk = self._rk
        prefix = int.from_bytes(bytes([q - 1]) + nonce + bytes(q), "big")
        s0 = encrypt_block(rk, prefix)
        count = -(-size // BLOCK)
        stream = 0
        for i in range(1, count + 1):
            stream = (stream << 128) | encrypt_block(rk, prefix | i)
        return s0, stream >> (8 * (count * BLOCK - size))

    def open(self, nonce: bytes, sealed: bytes, associated: bytes | None) -> bytes | None:
        """The plaintext of ``sealed`` (ciphertext + tag), or None when the tag does not
        match: a wrong key, or bytes changed on the way."""
        tag_length = self.tag_length
        size = len(sealed) - tag_length
        if size < 0:
            return None
        q = self._length_field(nonce, size)
        s0, stream = self._ctr(nonce, q, size)
        plain = (int.from_bytes(sealed[:size], "big") ^ stream).to_bytes(size, "big")
        tag = (self._mac(nonce, q, plain, associated) ^ s0) >> (8 * (BLOCK - tag_length))
        # Compared whole (one integer xor), not byte by byte up to the first difference
        if tag ^ int.from_bytes(sealed[size:], "big"):
            return None
        return plain

    def seal(self, nonce: bytes, plain: bytes, associated: bytes | None) -> bytes:
        """Ciphertext + tag (what a sensor sends); used by ``ledge ble`` tooling and tests."""
        size = len(plain)
        q = self._length_field(nonce, size)
        s0, stream = self._ctr(nonce, q, size)
        tag = (self._mac(nonce, q, plain, associated) ^ s0) >> (8 * (BLOCK - self.tag_length))
        body = (int.from_bytes(plain, "big") ^ stream).to_bytes(size, "big")
        return body + tag.to_bytes(self.tag_length, "big")


def parse_key(text: str) -> bytes:
    """A bindkey written as 32 hex digits; ValueError naming what is wrong."""
    cleaned = text.strip().replace(" ", "").replace(":", "")
    if len(cleaned) != 32:
        raise ValueError(f"a bindkey is 32 hex digits, got {len(cleaned)}")
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        raise ValueError("a bindkey is 32 hex digits (0-9, a-f)") from None

"""masks.py - the `allowed_tokens` bitmask of a sample: token ids to the base64 text the server reads.
Bit i % 32 of 32-bit little-endian word i / 32 is set when token i may be drawn (docs/http.md)."""
import base64
import struct
from typing import Iterable, List


def allowed_tokens(vocab: int, ids: Iterable[int]) -> str:
    """The mask of a vocabulary of `vocab` tokens allowing exactly `ids`."""
    words: List[int] = [0] * ((vocab + 31) // 32)
    for i in ids:
        if not 0 <= i < vocab:
            raise ValueError("token %d is outside a vocabulary of %d" % (i, vocab))
        words[i >> 5] |= 1 << (i & 31)
    return base64.b64encode(struct.pack("<%dI" % len(words), *words)).decode("ascii")


def mask_from_words(words: Iterable[int]) -> str:
    """A mask already made as 32-bit words (an xgrammar bitmask row, as ints)."""
    w = [x & 0xFFFFFFFF for x in words]
    return base64.b64encode(struct.pack("<%dI" % len(w), *w)).decode("ascii")

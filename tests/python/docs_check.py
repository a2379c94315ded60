#!/usr/bin/env python3
# long because each named check needs its own parsing of docs and code, and they share one set of readers and reporters.
"""docs_check.py - README.md and docs/ against what the code and the contract say.

Named checks (run all, or pick with --only / --skip):

  flags-exist        every --flag named in README.md and docs/*.md is taken by
                     a devio binary (its --help) or a repository script (its
                     --help), or is a listed flag of an outside tool
  flags-documented   every flag in each binary's --help appears in that
                     binary's section of docs/operations.md, with its DEVIO_*
                     twin where the binary reads the environment; every DEVIO_*
                     name in README.md and docs/operations.md is such a twin
                     or DEVIO_TOKEN
  routes             every route (method and path) of api/openapi.yaml is
                     listed in docs/http.md and every route docs/http.md names
                     is in api/openapi.yaml; every /v1/... path in README.md
                     and docs/*.md matches a route
  error-codes        the codes of device/status.c's table, the ErrorCode enum
                     of api/openapi.yaml and the status table of docs/http.md
                     are the same set, docs/http.md gives each the HTTP status
                     of x-devio-http-status, and every "NNN code" pair written
                     in README.md and docs/*.md agrees with it
  paths              every repository path README.md and docs/*.md cite
                     (docs/..., api/..., device/..., ...) exists, and so does
                     every relative link and its #anchor
  design-citations   no file of the repository (outside .git, bazel-*,
                     third_party and .devio) cites the design brief that is
                     not part of the repository
  rope-scaling       the rope_scaling types docs/objects.md names as computed
                     are those device/model/model_config.c accepts (and none it calls
                     refused is accepted); likewise the GGUF scaling types of
                     device/model/model_gguf.c
  alert-codes        every error code named in deploy/'s Prometheus rules,
                     their tests and the Grafana dashboard (alert and panel
                     texts, code/error label matchers) is in device/status.c's
                     table
  histograms         each histogram of service/ (put_hist, its bucket array)
                     has its buckets stated in docs/operations.md's Metrics
                     section, right (a full list, or first and last around
                     "to" or "…"), and no bucket statement names no histogram
  record-fields      the ticket record's keys (service/routes/routes_tickets.c) are
                     those of docs/http.md, in order, of the Python client's
                     TicketRecord and of api/openapi.yaml; docs/operations.md's
                     tickets table lists the columns service/store/store_schema.c's
                     migrations make
  architectures      README.md's --model list and docs/objects.md's
                     Architectures are the architectures device/model/model_config.c
                     loads
  suite-counts       every "N suites" in README.md and docs/*.md is the number
                     of suites of tests/conformance/suites.txt (dated reports
                     of DATED_REPORTS excepted)
  details-keys       every details key the sources put in an error answer is in
                     docs/http.md's list (the uses DETAILS_NOT_ANSWERED names,
                     at start only, excepted), and every key listed or written
                     details.KEY there and in api/openapi.yaml is emitted
  source-counts      every "N sources" in the docs, build files and sources
                     stands where SOURCE_CLAIMS says which list it counts, and
                     matches that list (and the files named beside it)
  folder-map         docs/README.md's folder map has one row for each folder of
                     api/, common/, conform/, device/, kernels/, ref/,
                     service/ and tools/ that holds a source or BUILD file,
                     names no folder that is not there, and stays under 40 rows
  test-map           docs/tests.md has one row for each of those files, and
                     every test a row names exists
  abi-version        every backend ABI version stated in a comment of a .c, .h,
                     .cc, .cu or .cuh file, or in a .md file ("ABI version N",
                     "ABI N", "interface version N", "DEVIO_BACKEND_ABI N")
                     is the DEVIO_BACKEND_ABI of device/backend/backend.h
  dtype-lists        every comment of device/backend/backend.h and
                     device/model/model.h that lists dtypes (names two or
                     more) names every dtype of device/model/model.h's enum
                     devio_dtype, unless it says it gives examples ("...",
                     "e.g.")
  header-paths       every repository path (api/..., device/..., docs/...,
                     ending .c, .h, .cc, .cu, .cuh, .py, .sh, .md or .yaml)
                     named in the opening comment of a source under api/,
                     common/, conform/, device/, kernels/, ref/, service/ or
                     tools/ exists

It prints what each check verified, every mismatch, and exits 1 when any
selected check fails. It must never change a file, and never pass a check it
could not run (a missing binary is a failure).

usage: docs_check.py [--bin bazel-bin] [--only NAME,...] [--skip NAME,...]
"""
import argparse
import fnmatch
import json
import os
import re
import sqlite3
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The binaries whose flags the docs describe: name -> (path under --bin, extra
# argument lists whose --help output also counts).
BINARIES = {
    "devio-server": ("service/devio-server", [[]]),
    "devio-ref": ("ref/devio-ref", [[]]),
    "devio-conform": ("conform/devio-conform", [[]]),
    "devio-mkmodel": ("tools/mkmodel/devio-mkmodel", [[], ["--adapter"]]),
    "devio-bench": ("tests/bench/devio-bench", [[]]),
}

# Repository scripts that docs show with flags; their --help lists them.
SCRIPTS = [
    ["python3", "tests/conformance/run.py"],
    ["python3", "tests/python/hf_check.py"],
    ["python3", "tests/bench/server_bench.py"],
    ["python3", "tests/bench/flaky_clients_bench.py"],
    ["python3", "tests/bench/answered_once_bench.py"],
    ["python3", "tools/bench/side_by_side.py"],
    ["python3", "tests/python/status_table_check.py"],
    ["python3", "tests/python/docs_check.py"],
    ["bash", "deploy/devio.sh"],
    ["bash", "deploy/image/build.sh"],
    ["python3", "tests/python/deploy_check.py"],
    ["python3", "kernels/gpu_check.py"],
    ["python3", "examples/openai/serve.py"],
    ["python3", "tests/bench/openai_example_bench.py"],
    ["python3", "tests/bench/openai_cluster_bench.py"],
    ["python3", "tests/bench/depth_bench.py"],
    ["python3", "tests/python/fast_numerics_check.py"],
    ["python3", "tools/perplexity/perplexity.py"],
]

# Flags of tools outside the repository that the docs show, and whose they are.
OUTSIDE_FLAGS = {
    "no-warnings": "node (how ref/wasm/run-node.mjs is run)",
    "config": "bazel (bazel test --config=asan)",
    "data-binary": "curl (a state's bytes sent as they are, README.md)",
}

# Environment variables that are not the twin of a flag.
OTHER_ENV = {
    "DEVIO_TOKEN": "the bearer token of devio-server",
    "DEVIO_REF_ISA": "the reference's instruction-set path, any binary (docs/backends.md)",
    "DEVIO_CPU_ISA": "the cpu backend's instruction-set path, any binary (docs/backends.md)",
    "DEVIO_CPU_GEMM_BREAK": "the cpu backend's broken dot product, a negative control (docs/backends.md)",
    "DEVIO_CUDA_GRAPHS": "0 turns the CUDA backend's graphs off (docs/backends.md)",
    "DEVIO_CUDA_GEMV": "the CUDA backend's GEMV reach under fast numerics (docs/backends.md)",
}

# Files the docs cite that other changes are writing now; reported, not failed.
PENDING = {}

PATH_ROOTS = ("docs", "api", "device", "ref", "cpu", "service", "conform", "tools", "common", "tests",
              "deploy", "kernels", "third_party", ".ci")

FLAG_RE = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:[-_][a-z0-9]+)*)")
ENV_RE = re.compile(r"\bDEVIO_[A-Z][A-Z0-9_]*[A-Z0-9]\b")
METHOD_PATH_RE = re.compile(r"\b(GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS)\s+(/[^\s`\"'|),]*)")
API_PATH_RE = re.compile(r"/v1/[A-Za-z0-9_{}.-]+(?:/[A-Za-z0-9_{}.-]+)*|(?<![\w/])/(?:healthz|readyz|metrics)\b")
REPO_PATH_RE = re.compile(r"(?<![\w./$-])((?:%s)/(?:[A-Za-z0-9_.-]+/?)*)"
                          % "|".join(re.escape(r) for r in PATH_ROOTS))
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
STATUS_ROW_RE = re.compile(r"^\|\s*`([a-z_]+)`\s*\|\s*([1-5]\d\d)\s*\|")
PAIR_RE = re.compile(r"\b([1-5]\d\d)\s+(?:`([a-z][a-z_]*[a-z])`|([a-z]+_[a-z_]*[a-z]))")
# "[E]" keeps this file itself out of a plain grep for the citation.
BRIEF_RE = re.compile(rb"\bD[E]SIGN (\xc2\xa7|section)")


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def doc_files():
    """README.md and every docs/*.md, as paths relative to the root."""
    out = ["README.md"]
    d = os.path.join(ROOT, "docs")
    if os.path.isdir(d):
        out += sorted("docs/" + n for n in os.listdir(d) if n.endswith(".md"))
    return out


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}


def help_text(cmd):
    p = subprocess.run(cmd + ["--help"], cwd=ROOT, capture_output=True, timeout=60,
                       env=clean_env(), stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError("%s --help exited %d" % (" ".join(cmd), p.returncode))
    return p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")


class Context:
    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self._helps = None
        self._doc = None

    def helps(self):
        """binary -> (help text, set of flags); raises when a binary cannot say."""
        if self._helps is None:
            out = {}
            for name, (rel, variants) in BINARIES.items():
                exe = os.path.join(self.bin_dir, rel)
                if not os.access(exe, os.X_OK):
                    raise RuntimeError("no executable %s (bazel build //...)" % exe)
                text = "\n".join(help_text([exe] + v) for v in variants)
                out[name] = (text, set(FLAG_RE.findall(text)))
            self._helps = out
        return self._helps

    def openapi(self):
        if self._doc is None:
            self._doc = yaml.safe_load(read("api/openapi.yaml"))
        return self._doc


def section(text, heading):
    """The text under the level-2 heading `## heading` up to the next level-2 heading."""
    m = re.search(r"^## %s\s*$" % re.escape(heading), text, re.M)
    if not m:
        return None
    rest = text[m.end():]
    n = re.search(r"^## ", rest, re.M)
    return rest[:n.start()] if n else rest


def twin(flag):
    return "DEVIO_" + flag.upper().replace("-", "_")


# ---- checks: each returns (problems, summary) --------------------------------


def check_flags_exist(ctx):
    known = {}
    for name, (_, flags) in ctx.helps().items():
        for f in flags:
            known.setdefault(f, name)
    for cmd in SCRIPTS:
        for f in FLAG_RE.findall(help_text(cmd)):
            known.setdefault(f, cmd[-1])
    for f, who in OUTSIDE_FLAGS.items():
        known.setdefault(f, who)
    problems, n = [], 0
    for rel in doc_files():
        for i, line in enumerate(read(rel).splitlines(), 1):
            for f in FLAG_RE.findall(line):
                n += 1
                if f not in known:
                    problems.append("%s:%d: --%s is taken by no devio binary or script" % (rel, i, f))
    return problems, "%d flag mentions in %d files, all taken by a binary or script" % (
        n, len(doc_files()))


def check_flags_documented(ctx):
    ops = read("docs/operations.md")
    problems, n = [], 0
    twins = set(OTHER_ENV)
    for name, (text, flags) in ctx.helps().items():
        sec = section(ops, name)
        if sec is None:
            problems.append("docs/operations.md has no '## %s' section" % name)
            continue
        documented = set(FLAG_RE.findall(sec))
        env = "environment twin" in text
        for f in sorted(flags):
            n += 1
            if f not in documented:
                problems.append("%s --help has --%s; its section of docs/operations.md does not"
                                % (name, f))
            if env and f not in ("help", "version"):
                twins.add(twin(f))
                if twin(f) not in sec:
                    problems.append("%s reads %s (twin of --%s); its section does not name it"
                                    % (name, twin(f), f))
        # Every binary takes --help, whether or not its usage text says so.
        for f in sorted(documented - flags - {"help"}):
            problems.append("docs/operations.md documents --%s under %s, whose --help lacks it"
                            % (f, name))
    for rel in ("README.md", "docs/operations.md"):
        for i, line in enumerate(read(rel).splitlines(), 1):
            for v in ENV_RE.findall(line):
                if v not in twins:
                    problems.append("%s:%d: %s is no flag's twin and no known variable"
                                    % (rel, i, v))
    return problems, "%d flags of %d binaries documented in their sections, twins included" % (
        n, len(BINARIES))


def openapi_routes(doc):
    out = set()
    for path, item in (doc.get("paths") or {}).items():
        for m in ("get", "put", "post", "delete", "patch", "head", "options"):
            if m in item:
                out.add((m.upper(), path))
    return out


def template_re(path):
    return re.compile("^" + re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(path)) + "$")


def check_routes(ctx):
    routes = openapi_routes(ctx.openapi())
    templates = [(m, p, template_re(p)) for m, p in routes]
    http = read("docs/http.md")
    problems = []
    for m, p in sorted(routes, key=lambda r: (r[1], r[0])):
        if not re.search(r"`%s %s`" % (m, re.escape(p)), http):
            problems.append("api/openapi.yaml has `%s %s`; docs/http.md does not list it" % (m, p))
    named = 0
    for i, line in enumerate(http.splitlines(), 1):
        for m, p in METHOD_PATH_RE.findall(line):
            p = p.split("?")[0].rstrip(".:;")
            named += 1
            if not any(m == tm and rx.match(p) for tm, _, rx in templates):
                problems.append("docs/http.md:%d: %s %s is no route of api/openapi.yaml" % (i, m, p))
    paths = 0
    for rel in doc_files():
        for i, line in enumerate(read(rel).splitlines(), 1):
            for p in API_PATH_RE.findall(line):
                p = p.rstrip(".")
                paths += 1
                if not any(rx.match(p) for _, _, rx in templates):
                    problems.append("%s:%d: %s matches no route of api/openapi.yaml" % (rel, i, p))
    return problems, ("%d routes of api/openapi.yaml listed in docs/http.md; %d route mentions "
                      "there and %d paths in all docs match a route" % (len(routes), named, paths))


def check_error_codes(ctx):
    problems = []
    status_c = set(re.findall(r'\[DEVIO_[A-Z_]+\]\s*=\s*"([a-z_]+)"', read("device/status.c")))
    status_c.discard("ok")
    ec = ctx.openapi()["components"]["schemas"]["ErrorCode"]
    enum = set(ec.get("enum") or [])
    hmap = ec.get("x-devio-http-status") or {}
    table = {}
    for i, line in enumerate(read("docs/http.md").splitlines(), 1):
        m = STATUS_ROW_RE.match(line)
        if m:
            if m.group(1) in table:
                problems.append("docs/http.md:%d: %s is in the status table twice" % (i, m.group(1)))
            table[m.group(1)] = int(m.group(2))
    for name, other in (("the ErrorCode enum", enum), ("docs/http.md's status table", set(table))):
        for c in sorted(status_c - other):
            problems.append("device/status.c has %s; %s does not" % (c, name))
        for c in sorted(other - status_c):
            problems.append("%s has %s; device/status.c does not" % (name, c))
    for c, h in sorted(table.items()):
        if c in hmap and hmap[c] != h:
            problems.append("docs/http.md answers %s with %d; x-devio-http-status says %s"
                            % (c, h, hmap[c]))
    pairs = 0
    for rel in doc_files():
        for i, line in enumerate(read(rel).splitlines(), 1):
            for num, a, b in PAIR_RE.findall(line):
                code = a or b
                if code not in hmap:
                    if b or code in status_c:
                        problems.append("%s:%d: '%s %s' names no error code" % (rel, i, num, code))
                    continue
                pairs += 1
                if int(num) != hmap[code]:
                    problems.append("%s:%d: '%s %s', but %s is answered with %s"
                                    % (rel, i, num, code, code, hmap[code]))
    return problems, ("%d codes in device/status.c, the ErrorCode enum and docs/http.md alike; "
                      "%d 'status code' pairs in the docs agree" % (len(status_c), pairs))


def slug(heading):
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(text):
    out, seen = set(), {}
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else HEADING_RE.match(line)
        if m:
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else "%s-%d" % (base, k))
    return out


def check_paths(ctx):
    problems, pending, n = [], set(), 0

    def exists(rel):
        rel = os.path.normpath(rel)
        if rel in PENDING:
            pending.add(rel)
            return True
        return os.path.exists(os.path.join(ROOT, rel))

    for rel in doc_files():
        text = read(rel)
        base = os.path.dirname(rel)
        for i, line in enumerate(text.splitlines(), 1):
            for p in REPO_PATH_RE.findall(line):
                p = p.rstrip(".")
                n += 1
                if not exists(p):
                    problems.append("%s:%d: %s does not exist" % (rel, i, p))
            for target in LINK_RE.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                n += 1
                path, _, frag = target.partition("#")
                dest = os.path.normpath(os.path.join(base, path)) if path else rel
                if not exists(dest):
                    problems.append("%s:%d: link %s: %s does not exist" % (rel, i, target, dest))
                elif frag and dest.endswith(".md") and dest not in PENDING:
                    if frag not in anchors(read(dest)):
                        problems.append("%s:%d: link %s: %s has no heading #%s"
                                        % (rel, i, target, dest, frag))
    for p in sorted(pending):
        state = "now exists (drop it from PENDING)" if os.path.exists(os.path.join(ROOT, p)) \
            else "pending: " + PENDING[p]
        print("     note: %s %s" % (p, state))
    return problems, "%d path and link citations in %d files exist" % (n, len(doc_files()))


def check_design_citations(ctx):
    problems, n = [], 0
    skip_top = {".git", "third_party", ".devio"}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in skip_top and not d.startswith("bazel-")]
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "node_modules")]
        for fn in filenames:
            path = os.path.join(dirpath, fn)
            if os.path.islink(path):
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            n += 1
            for i, line in enumerate(data.splitlines(), 1):
                if BRIEF_RE.search(line):
                    problems.append("%s:%d: cites the design brief, which is not in the repository"
                                    % (os.path.relpath(path, ROOT), i))
    return problems, "%d files cite nothing outside the repository" % n


# ---- what the code says, read from the sources -------------------------------

# The folders whose .c, .cc and .cu files are the product (docs/README.md's map, docs/tests.md).
PRODUCT_DIRS = ("api", "common", "conform", "cpu", "device", "kernels", "ref", "service", "tools")
PRODUCT_EXT = (".c", ".cc", ".cu")

NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}
COUNT = r"(\d+|%s)" % "|".join(NUMBER_WORDS)
C_STRING_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
SNAKE_RE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
BACKTICK_RE = re.compile(r"`([^`]+)`")


def product_sources():
    """Every product source file, as a path relative to the root, sorted."""
    out = []
    for top in PRODUCT_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "node_modules"))
            out += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames
                    if f.endswith(PRODUCT_EXT)]
    return sorted(out)


def strip_c_comments(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def c_function(text, name):
    """The body of the C function `name` (from its signature to the closing brace at column 0)."""
    m = re.search(r"^[^\n;]*\b%s\([^;{]*\)\s*\n\{\n(.*?)\n\}" % re.escape(name), text, re.M | re.S)
    if not m:
        raise RuntimeError("no function %s found" % name)
    return m.group(1)


def split_args(text):
    """Top-level comma-separated parts of `text` (parentheses, brackets and strings respected)."""
    out, depth, cur, i = [], 0, "", 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            m = C_STRING_RE.match(text, i)
            cur += m.group(0)
            i = m.end()
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    if cur.strip():
        out.append(cur.strip())
    return out


def status_codes():
    codes = set(re.findall(r'\[DEVIO_[A-Z_]+\]\s*=\s*"([a-z_]+)"', read("device/status.c")))
    codes.discard("ok")
    if not codes:
        raise RuntimeError("device/status.c: no status table found")
    return codes


def drop_parens(text):
    """text with every parenthesized group removed, innermost first."""
    while True:
        t = re.sub(r"\([^()]*\)", "", text)
        if t == text:
            return t
        text = t


def md_bullet(text, label, rel):
    """The text of the markdown bullet that starts `- **label**`, up to the next bullet or blank line."""
    m = re.search(r"^- \*\*%s\*\*(.*?)(?=^- |^\s*$)" % re.escape(label), text, re.M | re.S)
    if not m:
        raise RuntimeError("%s has no '- **%s**' bullet" % (rel, label))
    return " ".join(m.group(1).split())


def sets_differ(problems, have, want, have_name, want_name, what):
    for x in sorted(want - have):
        problems.append("%s has %s %s; %s does not" % (want_name, what, x, have_name))
    for x in sorted(have - want):
        problems.append("%s names %s %s; %s does not have it" % (have_name, what, x, want_name))


# ---- checks of the docs against the code --------------------------------------


def check_rope_scaling(ctx):
    problems = []
    cfg = c_function(read("device/model/model_config.c"), "parse_rope")
    accepted = set(re.findall(r'strcmp\(t, "([a-z0-9_]+)"\) == 0', cfg))
    gguf = c_function(read("device/model/model_gguf.c"), "put_rope")
    gguf_accepted = set(re.findall(r'memcmp\(t, "([a-z0-9_]+)", \d+\) == 0', gguf))
    if not accepted or not gguf_accepted:
        raise RuntimeError("no rope types found in parse_rope or put_rope")
    objects = read("docs/objects.md")
    bullet = drop_parens(md_bullet(objects, "RoPE scaling", "docs/objects.md"))
    m = re.search(r"of type (.*?)\.(?:\s|$)", bullet)
    if not m:
        raise RuntimeError("docs/objects.md's RoPE scaling bullet names no 'of type ...'")
    named = set(BACKTICK_RE.findall(m.group(1)))
    sets_differ(problems, named, accepted, "docs/objects.md (RoPE scaling)",
                "device/model/model_config.c (parse_rope)", "rope_scaling type")
    for sentence in re.split(r"\.\s", bullet):
        if "refused" in sentence:
            for t in BACKTICK_RE.findall(sentence):
                if t in accepted:
                    problems.append("docs/objects.md says rope_scaling type %s is refused; "
                                    "device/model/model_config.c accepts it" % t)
    para = " ".join(objects[objects.find("RoPE scaling comes from"):].split("\n\n")[0].split())
    m = re.search(r"RoPE scaling comes from `[^`]*`:(.*?)read as", drop_parens(para))
    if not m:
        raise RuntimeError("docs/objects.md has no 'RoPE scaling comes from `...`: ... read as' "
                           "sentence for GGUF files")
    sets_differ(problems, set(BACKTICK_RE.findall(m.group(1))), gguf_accepted,
                "docs/objects.md (GGUF)", "device/model/model_gguf.c (put_rope)", "rope scaling type")
    return problems, ("rope_scaling types %s (config.json) and %s (GGUF) named alike in "
                      "docs/objects.md" % (", ".join(sorted(accepted)),
                                           ", ".join(sorted(gguf_accepted))))


# Words of an alert's or a panel's text that look like error codes but are not.
ALERT_WORDS = {}
PROMQL_FUNCS = {"histogram_quantile", "label_values", "label_replace", "label_join",
                "count_over_time", "sum_over_time", "avg_over_time", "max_over_time",
                "min_over_time", "quantile_over_time", "absent_over_time", "query_result"}
METRIC_PREFIXES = ("devio_", "process_", "go_", "promhttp_")
TEXT_KEYS = ("summary", "description", "title")
EXPR_KEYS = ("expr", "query", "series", "definition")
CODE_LABELS = ("code", "error", "error_code")
MATCHER_RE = re.compile(r'\b([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def deploy_monitoring_files():
    out = []
    for sub in ("deploy/prometheus", "deploy/grafana"):
        d = os.path.join(ROOT, sub)
        if os.path.isdir(d):
            out += [sub + "/" + n for n in sorted(os.listdir(d))
                    if n.endswith((".yaml", ".yml", ".json"))]
    if not out:
        raise RuntimeError("no Prometheus rules or dashboards under deploy/prometheus, deploy/grafana")
    return out


def walk_strings(node, key=None):
    """(key, string) for every string in a loaded YAML/JSON tree, with the key it is under."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk_strings(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from walk_strings(v, key)
    elif isinstance(node, str):
        yield key, node


def check_alert_codes(ctx):
    codes = status_codes()
    problems, n_text, n_codes = [], 0, 0
    for rel in deploy_monitoring_files():
        data = json.loads(read(rel)) if rel.endswith(".json") else yaml.safe_load(read(rel))
        labels, texts = set(), []
        for key, s in walk_strings(data):
            if key in EXPR_KEYS:
                for label, _, value in MATCHER_RE.findall(s):
                    labels.add(label)
                    if label in CODE_LABELS:
                        for v in value.split("|"):
                            if re.fullmatch(r"[a-z][a-z_]*", v):
                                n_codes += 1
                                if v not in codes:
                                    problems.append("%s: %s=\"%s\" in a query is no error code of "
                                                    "device/status.c" % (rel, label, v))
                labels.update(re.findall(r"\bby\s*\(([^)]*)\)", s))
            elif key in TEXT_KEYS:
                texts.append(s)
        labels = {x.strip() for lab in labels for x in lab.split(",")}
        for s in texts:
            n_text += 1
            for w in SNAKE_RE.findall(s):
                if (w in codes or w.startswith(METRIC_PREFIXES) or w in PROMQL_FUNCS
                        or w in labels or w in ALERT_WORDS):
                    n_codes += w in codes
                    continue
                problems.append("%s: '%s' names %s, which is no error code of device/status.c "
                                "(nor a metric, label or PromQL function)"
                                % (rel, " ".join(s.split())[:90], w))
    return problems, ("%d alert and panel texts in deploy/; the %d error codes they and their "
                      "queries name are in device/status.c" % (n_text, n_codes))


UNIT_S = {"µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
BUCKET_TOKEN_RE = re.compile(r"(\d+(?:\.\d+)?)(?:\s*(µs|μs|us|ms|s)\b)?|(…|\.\.\.)|\b(to)\b")


def histogram_buckets():
    """family -> list of bucket upper bounds, read from service/**/*.c."""
    arrays, fields, families = {}, {}, {}
    names = sorted(os.path.relpath(os.path.join(d, f), ROOT)
                   for d, _, fs in os.walk(os.path.join(ROOT, "service")) for f in fs)
    for name in names:
        if not name.endswith(".c"):
            continue
        text = strip_c_comments(read(name))
        for m in re.finditer(r"static const double (\w+)\[\]\s*=\s*\{([^}]*)\}", text):
            arrays[m.group(1)] = [float(x) for x in split_args(m.group(2))]
        for m in re.finditer(r"(\w+)\s*=\s*devio_hist_make\((\w+)", text):
            fields.setdefault(m.group(1), set()).add(m.group(2))
        for m in re.finditer(r'put_hist\(\s*\w+,\s*"(\w+)",\s*[^,]+,\s*&([^)]*)\)', text):
            families[m.group(1)] = re.findall(r"\w+", m.group(2))[-1]
    out = {}
    for fam, field in families.items():
        arr = fields.get(field, set())
        if len(arr) != 1 or next(iter(arr)) not in arrays:
            raise RuntimeError("cannot tell the buckets of %s (field %s: %s)"
                               % (fam, field, ", ".join(sorted(arr)) or "no devio_hist_make"))
        out[fam] = arrays[next(iter(arr))]
    if not out:
        raise RuntimeError("no put_hist calls found in service/**/*.c")
    return out


def parse_buckets(text):
    """(values, is_range) of a bucket statement: 'A to B', 'a, b, … z' or a full list."""
    vals, pending, is_range = [], [], False
    for num, unit, ell, to in BUCKET_TOKEN_RE.findall(text):
        if ell or to:
            is_range = True
            vals.append(None)
            continue
        pending.append(len(vals))
        vals.append(float(num))
        if unit:
            for i in pending:
                vals[i] *= UNIT_S[unit]
            pending = []
    return vals, is_range


def buckets_match(stated, is_range, code):
    def close(a, b):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    if not is_range:
        return len(stated) == len(code) and all(close(a, b) for a, b in zip(stated, code))
    cut = stated.index(None)
    head = [v for v in stated[:cut] if v is not None]
    tail = [v for v in stated[cut:] if v is not None]
    return (len(head) + len(tail) <= len(code) and all(close(a, b) for a, b in zip(head, code))
            and all(close(a, b) for a, b in zip(reversed(tail), reversed(code))))


def fmt_buckets(vals):
    return ", ".join("%g" % v for v in vals)


def check_histograms(ctx):
    hists = histogram_buckets()
    ops = read("docs/operations.md")
    sec = section(ops, "Metrics")
    if sec is None:
        raise RuntimeError("docs/operations.md has no '## Metrics' section")
    # Statements: each table row, and each clause of a paragraph (split at '; ' and '. ').
    statements = []
    for block in re.split(r"\n\s*\n", sec):
        if block.lstrip().startswith("|"):
            statements += [l for l in block.splitlines() if l.startswith("|")]
        else:
            statements += re.split(r";\s|\.\s", " ".join(block.split()))
    problems, stated = [], set()
    for st in statements:
        m = re.search(r"\bbuckets\b(.*)", st)
        if not m:
            continue
        if st.startswith("|"):
            named = [c for c in BACKTICK_RE.findall(st.split("|")[1]) if c in hists]
        else:
            named = [c for c in BACKTICK_RE.findall(st[:m.start()]) if c in hists]
        if not named:
            problems.append("docs/operations.md: '%s' states buckets without naming the histogram "
                            "(name each family)" % st.strip()[:100])
            continue
        said = " ".join(re.split(r"[)(:;|]", m.group(1))[0].split())
        vals, is_range = parse_buckets(said)
        for fam in named:
            stated.add(fam)
            if not vals or not buckets_match(vals, is_range, hists[fam]):
                problems.append("docs/operations.md gives %s the buckets '%s'; service/ makes %s"
                                % (fam, said[:100], fmt_buckets(hists[fam])))
    for fam in sorted(set(hists) - stated):
        problems.append("docs/operations.md does not state the buckets of %s (service/ makes %s)"
                        % (fam, fmt_buckets(hists[fam])))
    return problems, ("the buckets of %d histograms in service/ stated right in docs/operations.md"
                      % len(hists))


def json_pack_keys(body, what):
    """The keys of the json_pack call that `body` returns, in order."""
    m = re.search(r"return json_pack\((.*?)\);\s*$", body, re.S)
    if not m:
        raise RuntimeError("%s returns no json_pack(...)" % what)
    args = split_args(m.group(1))
    fmt = C_STRING_RE.fullmatch(args[0])
    if not fmt or not fmt.group(1).startswith("{"):
        raise RuntimeError("%s: json_pack's format is not an object" % what)
    n = fmt.group(1).count("s:")
    keys = []
    for i in range(n):
        k = C_STRING_RE.fullmatch(args[1 + 2 * i])
        if not k:
            raise RuntimeError("%s: key %d of json_pack is not a literal" % (what, i))
        keys.append(k.group(1))
    return keys


def ticket_columns():
    """The columns of the tickets table once every migration of service/store/store_schema.c has run."""
    text = strip_c_comments(read("service/store/store_schema.c"))
    m = re.search(r"migrations\[\]\s*=\s*\{(.*?)\n\};", text, re.S)
    if not m:
        raise RuntimeError("service/store/store_schema.c has no migrations[] array")
    sql = "".join(C_STRING_RE.findall(m.group(1))).encode().decode("unicode_escape")
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(sql)
        return [r[1] for r in db.execute("PRAGMA table_info(tickets)")]
    finally:
        db.close()


def typed_dict_keys(text, name, rel):
    m = re.search(r"^class %s\(TypedDict\):\n((?:    .*\n|\s*\n)*)" % name, text, re.M)
    if not m:
        raise RuntimeError("%s has no TypedDict %s" % (rel, name))
    return re.findall(r"^    (\w+):", m.group(1), re.M)


def check_record_fields(ctx):
    problems = []
    src = read("service/routes/routes_tickets.c")
    keys = json_pack_keys(c_function(src, "ticket_row_json"), "ticket_row_json")
    extra = re.findall(r'json_object_set_new\(\w+,\s*"(\w+)"', src)
    if not extra:
        raise RuntimeError("service/routes/routes_tickets.c adds no key to the single-ticket record")
    http = " ".join(read("docs/http.md").split())
    m = re.search(r"Each record has (.*?)\.(?:\s|$)", http)
    if not m:
        raise RuntimeError("docs/http.md has no 'Each record has ...' sentence")
    doc = BACKTICK_RE.findall(drop_parens(m.group(1)))
    if doc != keys:
        problems.append("docs/http.md: a ticket record has %s; service/routes/routes_tickets.c "
                        "(ticket_row_json) encodes %s" % (", ".join(doc), ", ".join(keys)))
    for k in extra:
        if not re.search(r"`GET /v1/tickets/\{id\}`[^\n]*`%s`" % k, read("docs/http.md")):
            problems.append("docs/http.md's row for GET /v1/tickets/{id} does not name `%s`, "
                            "which its record carries" % k)
    rel = "clients/python/devio_client/types.py"
    py = typed_dict_keys(read(rel), "TicketRecord", rel)
    if py != keys + extra:
        problems.append("%s: TicketRecord has %s; the encoder gives %s"
                        % (rel, ", ".join(py), ", ".join(keys + extra)))
    schema = ctx.openapi()["components"]["schemas"]["TicketRecord"]
    sets_differ(problems, set(schema.get("properties") or {}), set(keys + extra),
                "api/openapi.yaml (TicketRecord)", "the encoder", "key")
    sets_differ(problems, set(schema.get("required") or []), set(keys),
                "api/openapi.yaml (TicketRecord required)", "ticket_row_json", "key")
    cols = ticket_columns()
    row = next((l for l in read("docs/operations.md").splitlines() if l.startswith("| `tickets` |")),
               None)
    if row is None:
        raise RuntimeError("docs/operations.md has no '| `tickets` |' row in its SQLite table")
    doc_cols = BACKTICK_RE.findall(drop_parens(row.split("|")[2]))
    if doc_cols != cols:
        problems.append("docs/operations.md: the tickets table has %s; service/store/store_schema.c's "
                        "migrations make %s" % (", ".join(doc_cols), ", ".join(cols)))
    return problems, ("ticket record keys (%d, and %s) alike in the encoder, docs/http.md, the "
                      "Python client and api/openapi.yaml; %d columns of the tickets table in "
                      "docs/operations.md" % (len(keys), ", ".join(extra), len(cols)))


def architectures():
    archs = re.findall(r'strcmp\(arch, "(\w+)"\) == 0',
                       c_function(read("device/model/model_config.c"), "parse_arch"))
    if not archs:
        raise RuntimeError("device/model/model_config.c (parse_arch) names no architecture")
    return archs


def check_architectures(ctx):
    archs = architectures()
    short = {a[:-len("ForCausalLM")] if a.endswith("ForCausalLM") else a for a in archs}
    problems = []
    readme = " ".join(read("README.md").split())
    m = re.search(r"`--model DIR` for your own Hugging Face directory \(([^)]*)\)", readme)
    if not m:
        raise RuntimeError("README.md has no '`--model DIR` for your own Hugging Face "
                           "directory (...)' list")
    named = {x for x in re.split(r",\s*|\s+or\s+|\s+and\s+", m.group(1)) if x}
    sets_differ(problems, named, short, "README.md's --model list",
                "device/model/model_config.c (parse_arch)", "architecture")
    bullet = md_bullet(read("docs/objects.md"), "Architectures", "docs/objects.md")
    sets_differ(problems, set(re.findall(r"`(\w+ForCausalLM)`", bullet)), set(archs),
                "docs/objects.md (Architectures)", "device/model/model_config.c (parse_arch)",
                "architecture")
    return problems, ("the %d architectures of parse_arch named in README.md and docs/objects.md"
                      % len(archs))


# Documents that keep dated reports as they came back: their counts are of their day.
DATED_REPORTS = {"docs/gpu-check.md": "reports of runs on GPU hardware, kept as they came back"}


def check_suite_counts(ctx):
    rows = [l for l in read("tests/conformance/suites.txt").splitlines()
            if l.strip() and not l.startswith("#")]
    n = len(rows)
    if n == 0:
        raise RuntimeError("tests/conformance/suites.txt lists no suite")
    problems, claims = [], 0
    for rel in doc_files():
        if rel in DATED_REPORTS:
            continue
        for i, line in enumerate(read(rel).splitlines(), 1):
            for m in re.finditer(r"\b%s\s+(?:conformance\s+)?suites\b" % COUNT, line, re.I):
                w = m.group(1).lower()
                claims += 1
                if NUMBER_WORDS.get(w, None if not w.isdigit() else int(w)) != n:
                    problems.append("%s:%d: '%s', but tests/conformance/suites.txt has %d suites"
                                    % (rel, i, m.group(0), n))
    return problems, ("%d counts of conformance suites in README.md and docs/ say %d, as "
                      "tests/conformance/suites.txt does (%s skipped: %s)"
                      % (claims, n, ", ".join(DATED_REPORTS), "; ".join(DATED_REPORTS.values())))


# Detail keys that never reach an HTTP answer: (key, file) -> why.
DETAILS_NOT_ANSWERED = {
    ("layer", "device/backend/shape.c"): "the model's checks at start; printed, never answered",
    ("max_bytes", "service/http/tls.c"): "--tls-cert and --tls-key, read at start",
    ("max_path_bytes", "service/http/listen_addr.c"): "--listen, parsed at start",
}


def emitted_detail_keys():
    """key -> files of the product that put it in an error's details."""
    out = {}
    for rel in product_sources():
        text = strip_c_comments(read(rel))
        found = re.findall(r'devio_fail_at\([^;"]*?"([A-Za-z_%]+)"', text)
        found += re.findall(r'detail_key,[^;"]*"([A-Za-z_%]+)"', text)
        found += re.findall(r'json_object_set_new\(details,\s*"(\w+)"', text)
        for k in found:
            if re.fullmatch(r"[a-z][a-z0-9_]*", k):
                out.setdefault(k, set()).add(rel)
    if not out:
        raise RuntimeError("no devio_fail_at detail keys found in the sources")
    return out


def check_details_keys(ctx):
    emitted = emitted_detail_keys()
    http = read("docs/http.md")
    flat = " ".join(http.split())
    m = re.search(r"`details` holds at most one integer naming what failed \(([^)]*)\)", flat)
    if not m:
        raise RuntimeError("docs/http.md has no '`details` holds at most one integer naming what "
                           "failed (...)' list")
    documented = set(BACKTICK_RE.findall(m.group(1)))
    problems, exempt = [], 0
    for k, files in sorted(emitted.items()):
        answered = {f for f in files if (k, f) not in DETAILS_NOT_ANSWERED}
        exempt += len(files) - len(answered)
        if answered and k not in documented:
            problems.append("%s put details.%s in an error; docs/http.md's list of details keys "
                            "lacks it" % (", ".join(sorted(answered)), k))
    for k in sorted(documented - set(emitted)):
        problems.append("docs/http.md documents details key %s; no source emits it" % k)
    for rel, text in (("docs/http.md", http), ("api/openapi.yaml", read("api/openapi.yaml"))):
        for i, line in enumerate(text.splitlines(), 1):
            for k in re.findall(r"\bdetails\.([a-z_]+)", line):
                if k not in emitted:
                    problems.append("%s:%d: details.%s is emitted by no source" % (rel, i, k))
    for (k, f) in sorted(DETAILS_NOT_ANSWERED):
        if f not in emitted.get(k, ()):
            print("     note: %s no longer emits details.%s (drop it from DETAILS_NOT_ANSWERED)"
                  % (f, k))
    return problems, ("%d details keys the sources emit are in docs/http.md's list (%d uses at "
                      "start, never answered, left out)" % (len(emitted), exempt))


def source_lists():
    """Named lists of sources that documents count: name -> list of file names."""
    text = read("ref/isa.bzl")
    m = re.search(r"^REF_ISA_SRCS = \[(.*?)\]", text, re.M | re.S)
    if not m:
        raise RuntimeError("ref/isa.bzl has no REF_ISA_SRCS list")
    return {"REF_ISA_SRCS": re.findall(r'"([^"]+)"', m.group(1))}


# Where a count of "N sources" may stand, and the list it counts: (file, level-2
# heading or None for the whole file) -> list name of source_lists().
SOURCE_CLAIMS = {
    ("ref/isa.bzl", None): "REF_ISA_SRCS",
    ("docs/backends.md", "The reference's instruction-set paths"): "REF_ISA_SRCS",
}
SOURCES_RE = re.compile(r"\b%s\s+sources\b" % COUNT, re.I)


def check_source_counts(ctx):
    lists = source_lists()
    scopes = {}
    for (rel, heading), name in SOURCE_CLAIMS.items():
        text = read(rel)
        if heading is not None:
            text = section(text, heading)
            if text is None:
                raise RuntimeError("%s has no '## %s' section" % (rel, heading))
        scopes.setdefault(rel, []).append((text, name))
    files = doc_files() + sorted(
        os.path.relpath(os.path.join(d, f), ROOT)
        for top in PRODUCT_DIRS + ("tests", "deploy")
        for d, _, fs in os.walk(os.path.join(ROOT, top))
        for f in fs if f.endswith((".bzl", ".bazel", ".c", ".h", ".cu", ".py", ".sh", ".md")))
    problems, claims = [], 0
    for rel in files:
        text = read(rel)
        for m in SOURCES_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            name = next((n for t, n in scopes.get(rel, [])
                         if t is not None and text.find(t) <= m.start() < text.find(t) + len(t)), None)
            if name is None:
                problems.append("%s:%d: '%s' counts sources of no list this check knows (add it "
                                "to SOURCE_CLAIMS)" % (rel, line, m.group(0)))
                continue
            claims += 1
            w = m.group(1).lower()
            count = NUMBER_WORDS[w] if w in NUMBER_WORDS else int(w)
            if count != len(lists[name]):
                problems.append("%s:%d: '%s', but %s lists %d" % (rel, line, m.group(0), name,
                                                                 len(lists[name])))
            after = " ".join(text[m.end():m.end() + 300].split())
            p = re.match(r"[^(.]{0,80}\(([^)]*)\)", after)
            named = {x for x in BACKTICK_RE.findall(p.group(1)) if x.endswith(".c")} if p else set()
            if named and named != set(lists[name]):
                problems.append("%s:%d: names %s after '%s'; %s lists %s"
                                % (rel, line, ", ".join(sorted(named)), m.group(0), name,
                                   ", ".join(lists[name])))
    return problems, ("%d counts of sources match their lists (%s)" % (
        claims, ", ".join("%s: %d" % (k, len(v)) for k, v in lists.items())))


def covered(rel_in_folder, tokens):
    """Whether a source (path relative to its folder) is named by one of a row's tokens."""
    base = os.path.basename(rel_in_folder)
    for t in tokens:
        if "*" in t or "?" in t or "[" in t:
            if fnmatch.fnmatchcase(rel_in_folder, t) or ("/" not in t and fnmatch.fnmatchcase(base, t)):
                return True
        elif t == base or t == rel_in_folder:
            return True
    return False


FOLDER_MAP_MAX_ROWS = 40


def check_folder_map(ctx):
    """One row a folder: every folder of the product that holds a source file
    or a BUILD file has its row, every row names a folder that exists, and the
    table fits on a screen."""
    text = read("docs/README.md")
    rows, problems = [], []
    for line in text.splitlines():
        m = re.match(r"^\|\s*`([a-z_/]+)/`\s*\|", line)
        if m:
            rows.append(m.group(1))
    want = set()
    for top in PRODUCT_DIRS:
        want.add(top)
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "node_modules")]
            if any(f.endswith(PRODUCT_EXT) or f == "BUILD.bazel" for f in filenames):
                want.add(os.path.relpath(dirpath, ROOT))
    for d in sorted(want - set(rows)):
        problems.append("docs/README.md's folder map has no row for %s/" % d)
    for d in rows:
        if not os.path.isdir(os.path.join(ROOT, d)):
            problems.append("docs/README.md's folder map names %s/, which is no folder" % d)
        if rows.count(d) > 1:
            problems.append("docs/README.md's folder map names %s/ twice" % d)
    if len(rows) >= FOLDER_MAP_MAX_ROWS:
        problems.append("docs/README.md's folder map has %d rows; it must stay under %d"
                        % (len(rows), FOLDER_MAP_MAX_ROWS))
    return problems, "%d folders of the product, each a row of docs/README.md's map (%d rows)" % (
        len(want), len(rows))


TEST_MAP = "docs/tests.md"


def check_test_map(ctx):
    text = read(TEST_MAP)
    rows = {}
    problems = []
    for i, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$", line)
        if not m or not m.group(1).endswith(PRODUCT_EXT):
            continue
        src = m.group(1)
        if src in rows:
            problems.append("%s:%d: %s has a second row" % (TEST_MAP, i, src))
        tests = [t for t in BACKTICK_RE.findall(m.group(2)) if "/" in t]
        rows[src] = tests
        if not os.path.exists(os.path.join(ROOT, src)):
            problems.append("%s:%d: %s is no source file" % (TEST_MAP, i, src))
        if not tests:
            problems.append("%s:%d: %s names no test" % (TEST_MAP, i, src))
        for t in tests:
            if not os.path.isfile(os.path.join(ROOT, t)):
                problems.append("%s:%d: %s names %s, which does not exist" % (TEST_MAP, i, src, t))
    sources = product_sources()
    for src in sources:
        if src not in rows:
            problems.append("%s has no row for %s" % (TEST_MAP, src))
    n_tests = len({t for ts in rows.values() for t in ts})
    return problems, "%d source files mapped in %s to %d tests that exist" % (
        len(sources), TEST_MAP, n_tests)


# ---- comments against the code they describe ---------------------------------

BACKEND_H = "device/backend/backend.h"
MODEL_H = "device/model/model.h"
C_EXT = (".c", ".h", ".cc", ".cu", ".cuh")
COMMENT_RE = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
# "ABI version 7", "backend ABI 7", "interface version 7", "the backend seam, version 7",
# "DEVIO_BACKEND_ABI 7", "DEVIO_BACKEND_ABI = 7", "DEVIO_BACKEND_ABI is 7".
ABI_CLAIM_RE = re.compile(r"\b(?:DEVIO_BACKEND_ABI\s*(?:=|is)?|ABI(?:\s+version)?|interface\s+version|"
                          r"seam,?\s+version)\s+`?(\d+)u?\b", re.I)
HEADER_PATH_RE = re.compile(r"(?<![\w./$-])((?:api|common|conform|device|kernels|ref|service|tools|"
                            r"tests|docs|deploy)/[\w/.-]+\.(?:cuh|cu|cc|c|h|py|sh|md|yaml))(?![\w])")


def repo_files(exts):
    """Every file of the repository ending in one of exts (outside .git, bazel-*,
    third_party and .devio), as a path relative to the root, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in (".git", "third_party", ".devio")
                           and not d.startswith("bazel-")]
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "node_modules"))
        out += [os.path.normpath(os.path.join(rel_dir, f)) for f in filenames if f.endswith(exts)]
    return sorted(out)


def c_comments(text):
    """(line number, text) of every comment of a C-like source."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in COMMENT_RE.finditer(text)]


def first_comment(text):
    """The comment a source opens with (a /* */ block, or its leading // lines), or ""."""
    t = text.lstrip()
    if t.startswith("/*"):
        end = t.find("*/")
        return t if end < 0 else t[:end + 2]
    lines = []
    for line in t.splitlines():
        if not line.lstrip().startswith("//"):
            break
        lines.append(line)
    return "\n".join(lines)


def backend_abi():
    m = re.search(r"^#define DEVIO_BACKEND_ABI (\d+)u?\b", read(BACKEND_H), re.M)
    if not m:
        raise ValueError("%s defines no DEVIO_BACKEND_ABI" % BACKEND_H)
    return int(m.group(1))


def check_abi_version(ctx):
    abi, problems, n = backend_abi(), [], 0
    files = repo_files(C_EXT + (".md",))
    for rel in files:
        text = read(rel)
        spans = c_comments(text) if rel.endswith(C_EXT) else [(1, text)]
        for line0, chunk in spans:
            for m in ABI_CLAIM_RE.finditer(chunk):
                n += 1
                if int(m.group(1)) != abi:
                    problems.append("%s:%d: says \"%s\"; DEVIO_BACKEND_ABI is %d (%s)"
                                    % (rel, line0 + chunk.count("\n", 0, m.start()),
                                       " ".join(m.group(0).split()), abi, BACKEND_H))
    return problems, "%d statements of the backend ABI version in %d files say %d, as %s does" % (
        n, len(files), abi, BACKEND_H)


def model_dtypes():
    m = re.search(r"typedef enum devio_dtype \{(.*?)\} devio_dtype;", read(MODEL_H), re.S)
    if not m:
        raise ValueError("%s has no enum devio_dtype" % MODEL_H)
    names = re.findall(r"\bDEVIO_([A-Z0-9_]+)\b", strip_c_comments(m.group(1)))
    if not names:
        raise ValueError("enum devio_dtype of %s names no dtype" % MODEL_H)
    return names


def check_dtype_lists(ctx):
    dtypes, problems, n = model_dtypes(), [], 0
    for rel in (BACKEND_H, MODEL_H):
        for line, comment in c_comments(read(rel)):
            named = [d for d in dtypes if re.search(r"(?<![\w])%s(?![\w])" % re.escape(d), comment)]
            if len(named) < 2:
                continue  # names no list of dtypes
            n += 1
            if re.search(r"\.\.\.|…|\be\.g\.", comment):
                continue  # examples, said to be so
            missing = [d for d in dtypes if d not in named]
            if missing:
                problems.append("%s:%d: a comment lists the dtypes %s but not %s (enum devio_dtype "
                                "of %s)" % (rel, line, ", ".join(named), ", ".join(missing), MODEL_H))
    return problems, "%d comments of %s and %s that list dtypes name all %d of enum devio_dtype" % (
        n, BACKEND_H, MODEL_H, len(dtypes))


def check_header_paths(ctx):
    problems, n, files = [], 0, repo_files(C_EXT)
    files = [f for f in files if f.split(os.sep)[0] in PRODUCT_DIRS]
    for rel in files:
        head = first_comment(read(rel))
        for i, line in enumerate(head.splitlines(), 1):
            for p in HEADER_PATH_RE.findall(line):
                n += 1
                if not os.path.exists(os.path.join(ROOT, p)):
                    problems.append("%s:%d: the header comment names %s, which does not exist"
                                    % (rel, i, p))
    return problems, "%d repository paths named by the header comments of %d sources exist" % (
        n, len(files))


CHECKS = [
    ("flags-exist", check_flags_exist),
    ("flags-documented", check_flags_documented),
    ("routes", check_routes),
    ("error-codes", check_error_codes),
    ("paths", check_paths),
    ("design-citations", check_design_citations),
    ("rope-scaling", check_rope_scaling),
    ("alert-codes", check_alert_codes),
    ("histograms", check_histograms),
    ("record-fields", check_record_fields),
    ("architectures", check_architectures),
    ("suite-counts", check_suite_counts),
    ("details-keys", check_details_keys),
    ("source-counts", check_source_counts),
    ("folder-map", check_folder_map),
    ("test-map", check_test_map),
    ("abi-version", check_abi_version),
    ("dtype-lists", check_dtype_lists),
    ("header-paths", check_header_paths),
]


def main():
    ap = argparse.ArgumentParser(description="README.md and docs/ against the code and the contract.")
    ap.add_argument("--bin", default="bazel-bin", help="Bazel's output tree [bazel-bin]")
    ap.add_argument("--only", default="", help="comma-separated checks to run")
    ap.add_argument("--skip", default="", help="comma-separated checks to leave out")
    args = ap.parse_args()
    names = [n for n, _ in CHECKS]
    only = [x for x in args.only.split(",") if x]
    skip = [x for x in args.skip.split(",") if x]
    for x in only + skip:
        if x not in names:
            ap.error("unknown check '%s' (checks: %s)" % (x, ", ".join(names)))
    ctx = Context(os.path.abspath(args.bin))
    holds = fails = 0
    for name, fn in CHECKS:
        if (only and name not in only) or name in skip:
            continue
        try:
            problems, summary = fn(ctx)
        except Exception as e:  # a check that cannot run fails
            problems, summary = ["could not run: %s" % e], ""
        if problems:
            fails += 1
            print("FAIL %s: %d mismatches" % (name, len(problems)))
            for p in problems:
                print("     - " + p)
        else:
            holds += 1
            print("ok   %s: %s" % (name, summary))
    print("docs_check: %d checks hold, %d do not" % (holds, fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

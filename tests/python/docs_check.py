#!/usr/bin/env python3
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

It prints what each check verified, every mismatch, and exits 1 when any
selected check fails. It must never change a file, and never pass a check it
could not run (a missing binary is a failure).

usage: docs_check.py [--bin bazel-bin] [--only NAME,...] [--skip NAME,...]
"""
import argparse
import os
import re
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
    ["python3", "tools/bench/side_by_side.py"],
    ["python3", "tests/python/status_table_check.py"],
    ["python3", "tests/python/docs_check.py"],
    ["bash", "deploy/devio.sh"],
    ["bash", "deploy/image/build.sh"],
    ["python3", "tests/python/deploy_check.py"],
    ["python3", "kernels/gpu_check.py"],
    ["python3", "examples/openai/serve.py"],
    ["python3", "tests/bench/openai_example_bench.py"],
    ["python3", "tests/bench/depth_bench.py"],
    ["python3", "tests/python/fast_numerics_check.py"],
]

# Flags of tools outside the repository that the docs show, and whose they are.
OUTSIDE_FLAGS = {
    "no-warnings": "node (how ref/wasm/run-node.mjs is run)",
    "config": "bazel (bazel test --config=asan)",
}

# Environment variables that are not the twin of a flag.
OTHER_ENV = {
    "DEVIO_TOKEN": "the bearer token of devio-server",
    "DEVIO_REF_ISA": "the reference's instruction-set path, any binary (docs/backends.md)",
    "DEVIO_CUDA_GRAPHS": "0 turns the CUDA backend's graphs off (docs/backends.md)",
    "DEVIO_CUDA_GEMV": "the CUDA backend's GEMV reach under fast numerics (docs/backends.md)",
}

# Files the docs cite that other changes are writing now; reported, not failed.
PENDING = {}

PATH_ROOTS = ("docs", "api", "device", "ref", "service", "conform", "tools", "common", "tests",
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


CHECKS = [
    ("flags-exist", check_flags_exist),
    ("flags-documented", check_flags_documented),
    ("routes", check_routes),
    ("error-codes", check_error_codes),
    ("paths", check_paths),
    ("design-citations", check_design_citations),
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

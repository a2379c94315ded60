#!/usr/bin/env python3
"""layering_check.py - calls go down, never up: every dependency a BUILD file
declares goes to its own layer or a lower one.

The layers are the package groups of the root BUILD.bazel (each includes the
one above it; `top` is the highest, `base` the lowest). A package's layer is
the group naming it most closely ("//a/b" before "//a/..."). Every "//pkg"
label in a package's BUILD.bazel and .bzl files, outside visibility lists and
load() lines, is a dependency of that package; one that goes to a higher layer
fails the check, unless EXCEPTIONS states why it may. Bazel's visibility (the
same groups, in each package's default_visibility) refuses such a build too;
this check also covers packages whose visibility is public, and says which
edge broke the rule.

  --self-test   also builds a scratch tree with a deliberate upward dependency
                (device/core declaring //service/store) and fails unless this
                check refuses it
usage: layering_check.py [--root DIR] [--self-test]
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (from package, to package) -> why the edge may go up.
EXCEPTIONS = {
    ("ref", "conform"): "devio-ref keeps its path bazel-bin/ref/devio-ref; its main and the "
                        "script runner it links live in conform/",
    ("ref/wasm", "conform"): "the WASI build of devio-ref compiles the same conform/ files",
}

SKIP_DIRS = {".git", ".devio", "node_modules", "__pycache__"}
GROUP_RE = re.compile(r"package_group\((.*?)\n\)", re.S)
FIELD_RE = r"%s\s*=\s*\[(.*?)\]"
LABEL_RE = re.compile(r'"//([A-Za-z0-9_./-]*)(?::[^"]*)?"')


def strings(block):
    return re.findall(r'"([^"]*)"', block)


def layers(root):
    """pattern -> rank (0 = top), from the root BUILD.bazel's package groups."""
    text = open(os.path.join(root, "BUILD.bazel")).read()
    groups = {}
    for m in GROUP_RE.finditer(text):
        body = m.group(1)
        name = re.search(r'name\s*=\s*"([^"]+)"', body).group(1)
        inc = re.search(FIELD_RE % "includes", body, re.S)
        pk = re.search(FIELD_RE % "packages", body, re.S)
        groups[name] = ([s.lstrip(":") for s in strings(inc.group(1))] if inc else [],
                        strings(pk.group(1)) if pk else [])
    rank = {}
    tops = [g for g in groups if not groups[g][0]]
    if len(tops) != 1:
        raise SystemExit("layering_check: the root BUILD.bazel needs one top group "
                         "(a group that includes none), found %s" % tops)
    rank[tops[0]] = 0
    changed = True
    while changed:
        changed = False
        for g, (inc, _) in groups.items():
            if g not in rank and all(i in rank for i in inc):
                rank[g] = max(rank[i] for i in inc) + 1
                changed = True
    lost = set(groups) - set(rank)
    if lost:
        raise SystemExit("layering_check: groups in a cycle: %s" % ", ".join(sorted(lost)))
    out = {}
    for g, (_, pkgs) in groups.items():
        for p in pkgs:
            out[p.lstrip("/")] = (rank[g], g)
    return out


def layer_of(table, pkg):
    if pkg in table:
        return table[pkg]
    best = None
    for pat, v in table.items():
        if pat.endswith("/...") and (pkg == pat[:-4] or pkg.startswith(pat[:-3])):
            if best is None or len(pat) > len(best[0]):
                best = (pat, v)
    return best[1] if best else None


def build_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("bazel-"))
        rel = os.path.relpath(d, root)
        pkg_dir = rel if "BUILD.bazel" in files else None
        for f in sorted(files):
            if f == "BUILD.bazel" or f.endswith(".bzl"):
                if rel == ".":
                    continue
                yield (pkg_dir or rel), os.path.join(d, f)


def deps_of(path):
    text = open(path).read()
    text = re.sub(r"#.*", "", text)
    text = re.sub(r"^load\(.*?\)\s*$", "", text, flags=re.M | re.S)
    text = re.sub(r"(default_)?visibility\s*=\s*\[[^\]]*\]", "", text)
    return {m.group(1) for m in LABEL_RE.finditer(text)} - {""}


def check(root):
    table = layers(root)
    problems, edges = [], 0
    for pkg, path in build_files(root):
        if pkg.startswith("third_party"):
            continue
        mine = layer_of(table, pkg)
        if mine is None:
            problems.append("%s: package %s is in no layer of the root BUILD.bazel"
                            % (os.path.relpath(path, root), pkg))
            continue
        for dep in sorted(deps_of(path)):
            if dep in ("visibility", "conditions") or dep == pkg:
                continue
            theirs = layer_of(table, dep)
            if theirs is None:
                problems.append("%s: //%s is in no layer" % (os.path.relpath(path, root), dep))
                continue
            edges += 1
            if theirs[0] < mine[0] and (pkg, dep) not in EXCEPTIONS:
                problems.append("%s: %s (layer %s) depends on //%s (layer %s, higher): calls go "
                                "down, never up" % (os.path.relpath(path, root), pkg, mine[1],
                                                    dep, theirs[1]))
    return problems, edges


def self_test():
    """A copy of the BUILD files with one upward dependency must fail."""
    tmp = tempfile.mkdtemp(prefix="layering-")
    try:
        for pkg, path in build_files(ROOT):
            dst = os.path.join(tmp, os.path.relpath(path, ROOT))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy(path, dst)
        shutil.copy(os.path.join(ROOT, "BUILD.bazel"), tmp)
        core = os.path.join(tmp, "device", "core", "BUILD.bazel")
        text = open(core).read()
        bad = text.replace('"//device/sample",', '"//device/sample",\n        "//service/store",', 1)
        assert bad != text, "device/core/BUILD.bazel has no //device/sample dep to add beside"
        open(core, "w").write(bad)
        problems, _ = check(tmp)
        hit = [p for p in problems if "device/core" in p and "//service/store" in p]
        return hit, problems
    finally:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    problems, edges = check(a.root)
    for p in problems:
        print("FAIL", p)
    ok = not problems
    if ok:
        print("ok   %d declared dependencies go down or sideways (%d stated exceptions)"
              % (edges, len(EXCEPTIONS)))
    if a.self_test:
        hit, _ = self_test()
        if hit:
            print("ok   self-test: a deliberate upward dependency is refused: %s" % hit[0])
        else:
            print("FAIL self-test: device/core declaring //service/store was not refused")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

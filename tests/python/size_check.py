#!/usr/bin/env python3
"""size_check.py - no source over 700 lines without a reason, no C function over 120 lines.

Walks the repository's .c, .h, .cu, .cuh, .cc, .py and .sh files (skipping
.git, bazel-*, third_party and .devio) and reports:
  - a file of more than 700 lines whose first 15 lines do not say why, in
    the words "long because ..." (any case);
  - in the C-like files (.c, .h, .cu, .cuh, .cc), a function of more than
    120 lines, where a function is a line starting with "{" at column 0
    through the next line starting with "}" at column 0 (both counted), the
    layout every devio file follows; the report names the file and the
    function's signature line.
Lines are counted as wc -l counts them (plus an unterminated last line).
Prints what it checked; exits 1 on any violation, 0 otherwise.

usage: size_check.py [--root DIR] [--max-file N] [--max-func N]
"""
import argparse
import os
import sys

C_LIKE = (".c", ".h", ".cu", ".cuh", ".cc")
EXTENSIONS = C_LIKE + (".py", ".sh")
SKIP_DIRS = {".git", "third_party", ".devio"}
REASON = "long because"
REASON_LINES = 15


def skipped(name):
    return name in SKIP_DIRS or name.startswith("bazel-")


def source_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not skipped(x))
        for f in sorted(files):
            if f.endswith(EXTENSIONS):
                yield os.path.join(d, f)


def read_lines(path):
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line starts no line of its own
    return lines


def signature_at(lines, brace):
    """The first line of the declaration that ends just above line `brace`."""
    i = brace - 1
    while i > 0 and lines[i][:1] in (" ", "\t"):
        i -= 1
    return i


def long_functions(lines, limit):
    """(signature line index, length) of every function over `limit` lines."""
    out = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("{"):
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("}"):
            end += 1
        length = min(end, len(lines) - 1) - i + 1
        if length > limit:
            out.append((signature_at(lines, i), length))
        i = end + 1
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(here)),
                    help="repository root (default: the one holding this script)")
    ap.add_argument("--max-file", type=int, default=700)
    ap.add_argument("--max-func", type=int, default=120)
    args = ap.parse_args()

    problems = []
    n_files = n_funcs = n_long_ok = 0
    for path in source_files(args.root):
        rel = os.path.relpath(path, args.root)
        lines = read_lines(path)
        n_files += 1
        if len(lines) > args.max_file:
            head = "\n".join(lines[:REASON_LINES]).lower()
            if REASON in head:
                n_long_ok += 1
            else:
                problems.append("%s: %d lines (over %d) and no \"%s\" in its first %d lines"
                                % (rel, len(lines), args.max_file, REASON, REASON_LINES))
        if not path.endswith(C_LIKE):
            continue
        n_funcs += sum(1 for l in lines if l.startswith("{"))
        for sig, length in long_functions(lines, args.max_func):
            problems.append("%s:%d: function of %d lines (over %d): %s"
                            % (rel, sig + 1, length, args.max_func, lines[sig].strip()))

    print("size_check: %d %s files under %s, %d C-like functions; files over %d lines "
          "need \"%s\" in their first %d lines (%d do), functions at most %d lines"
          % (n_files, "/".join(EXTENSIONS), args.root, n_funcs, args.max_file, REASON, REASON_LINES, n_long_ok,
             args.max_func))
    for p in problems:
        print("size_check: " + p)
    if problems:
        print("size_check: %d violation(s)" % len(problems))
        return 1
    print("size_check: no violations")
    return 0


if __name__ == "__main__":
    sys.exit(main())

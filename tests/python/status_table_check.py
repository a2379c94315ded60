#!/usr/bin/env python3
"""status_table_check.py - service/http/http_error.c's status -> HTTP table against api/openapi.yaml.

Runs BIN/tests/http_status_table (which prints the C table through
devio_http_code) and checks, in both directions:
  - the codes of device/status.c (less "ok") are exactly the ErrorCode enum
    of api/openapi.yaml and exactly the keys of its x-devio-http-status map;
  - every code has the same HTTP status in the C table and in that map;
  - "ok" is 200 and a value outside the enum is 500;
  - every response of every operation (and x-devio-unrouted) that names error
    codes is filed under the HTTP status the map gives those codes.
It must never pass when either side drifts: any difference is printed and
the exit status is 1. It changes nothing.

usage: status_table_check.py [--bin bazel-bin] [--openapi api/openapi.yaml]
"""
import argparse
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def deref(doc, node):
    """Follows local $refs (only those) until a node without one."""
    seen = 0
    while isinstance(node, dict) and "$ref" in node and seen < 16:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise ValueError("non-local $ref %r" % ref)
        target = doc
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        # Sibling keywords next to a $ref (OpenAPI 3.1 allows them) narrow it:
        # they come first, the referenced node fills the rest.
        merged = dict(target) if isinstance(target, dict) else target
        if isinstance(merged, dict):
            for k, v in node.items():
                if k != "$ref":
                    merged[k] = v
        node = merged
        seen += 1
    return node


def codes_named(doc, response):
    """The error codes a response's JSON schema pins error.code to."""
    response = deref(doc, response)
    media = (response.get("content") or {}).get("application/json")
    if not media:
        return []
    schema = media.get("schema") or {}
    code = (((schema.get("properties") or {}).get("error") or {}).get("properties") or {}).get("code")
    if not code:
        return []
    if "const" in code:
        return [code["const"]]
    return list(code.get("enum") or [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bazel-bin", help="Bazel's output tree [bazel-bin]")
    ap.add_argument("--openapi", default=os.path.join(ROOT, "api", "openapi.yaml"))
    args = ap.parse_args()
    problems = []

    exe = os.path.join(args.bin, "tests", "http_status_table")
    try:
        out = subprocess.run([exe], check=True, capture_output=True, timeout=60).stdout
        c = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        print("status_table_check: cannot read the C table from %s: %s "
              "(bazel build //tests:http_status_table)" % (exe, e))
        return 1
    table = dict(c["statuses"])
    if table.pop("ok", None) != 200:
        problems.append("C table: ok is not 200")
    if c.get("out_of_range") != 500:
        problems.append("C table: a value outside the enum answers %s, not 500" % c.get("out_of_range"))

    doc = yaml.safe_load(open(args.openapi))
    ec = doc["components"]["schemas"]["ErrorCode"]
    enum = list(ec.get("enum") or [])
    hmap = ec.get("x-devio-http-status")
    if not isinstance(hmap, dict):
        problems.append("openapi: ErrorCode has no x-devio-http-status map")
        hmap = {}
    if len(set(enum)) != len(enum):
        problems.append("openapi: ErrorCode enum lists a code twice")
    for name, a, b in (("C table", set(table), set(enum)),
                       ("x-devio-http-status", set(hmap), set(enum))):
        for x in sorted(a - b):
            problems.append("%s has %s, the ErrorCode enum does not" % (name, x))
        for x in sorted(b - a):
            problems.append("the ErrorCode enum has %s, %s does not" % (x, name))
    for code in sorted(set(table) & set(hmap)):
        if table[code] != hmap[code]:
            problems.append("%s: service/http/http_error.c answers %s, openapi says %s"
                            % (code, table[code], hmap[code]))

    # Every response that pins error codes is filed under their status.
    n_resp = 0
    places = []
    for path, item in (doc.get("paths") or {}).items():
        for method in METHODS:
            op = item.get(method)
            if op:
                for status, resp in (op.get("responses") or {}).items():
                    places.append(("%s %s" % (method.upper(), path), status, resp))
    for status, resp in ((doc.get("x-devio-unrouted") or {}).get("responses") or {}).items():
        places.append(("x-devio-unrouted", status, resp))
    for where, status, resp in places:
        for code in codes_named(doc, resp):
            n_resp += 1
            want = hmap.get(code)
            if want is None:
                problems.append("%s %s names unknown code %s" % (where, status, code))
            elif str(want) != str(status):
                problems.append("%s files %s under %s; x-devio-http-status says %s"
                                % (where, code, status, want))

    for p in problems:
        print("MISMATCH " + p)
    if problems:
        print("status_table_check: %d mismatches" % len(problems))
        return 1
    print("status_table_check: %d codes agree between service/http/http_error.c, the ErrorCode enum "
          "and x-devio-http-status; %d responses naming codes are filed under their status"
          % (len(table), n_resp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

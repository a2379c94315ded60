#!/usr/bin/env python3
"""openapi_check.py - checks devio-server answers against api/openapi.yaml.

Finds the documented operation for a method and a concrete path, the
response for a status code, and validates the body (JSON Schema 2020-12,
$refs resolved inside the document). It must never accept what the document
does not describe: an undocumented path, method, status, content type or
field is an AssertionError.

    from openapi_check import Contract
    api = Contract("api/openapi.yaml")
    body = api.check("POST", "/v1/tickets/12/await?timeout_ms=5", 200,
                     resp.headers["Content-Type"], resp.read())

Run as a program it lints the document (every $ref resolves, every example
matches its schema) and runs its self-test; exit status 0 when all holds.

usage: openapi_check.py [PATH/TO/openapi.yaml]
"""
import json
import os
import re
import sys
from urllib.parse import quote

import jsonschema
import yaml
from jsonschema.validators import Draft202012Validator, extend
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

__all__ = ["Contract"]

BASE_URI = "urn:devio:openapi"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
JSON_TYPES = ("application/json",)


def _is_int(checker, x):
    # A JSON 3.0 is a float in Python: the server never sends one where an
    # integer is documented, so drift there must fail.
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(checker, x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_Validator = extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_int, "number": _is_number}
    ),
)


def _escape(segment):
    return str(segment).replace("~", "~0").replace("/", "~1")


def _pointer(*segments):
    return "/" + "/".join(_escape(s) for s in segments) if segments else ""


def _strict_json(data):
    """json.loads that refuses NaN/Infinity and duplicate keys (jansson sends neither)."""
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data).decode("utf-8")

    def no_constant(name):
        raise ValueError("non-JSON number %s" % name)

    def no_duplicates(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise ValueError("duplicate key %r" % k)
            out[k] = v
        return out

    return json.loads(data, parse_constant=no_constant, object_pairs_hook=no_duplicates)


def _media(ct):
    """'Text/Plain; version=0.0.4' -> ('text/plain', {'version': '0.0.4'})."""
    parts = [p.strip() for p in ct.split(";")]
    params = {}
    for p in parts[1:]:
        if "=" in p:
            k, v = p.split("=", 1)
            params[k.strip().lower()] = v.strip().strip('"')
    return parts[0].lower(), params


def _explain(e):
    """The errors worth reading under e: for a oneOf with a discriminator,
    those of the branch the instance names (e.g. "kind": "fork")."""
    prop = (e.schema.get("discriminator") or {}).get("propertyName") if isinstance(e.schema, dict) else None
    if e.validator == "oneOf" and e.context and prop:
        branches = {}
        for c in e.context:
            branches.setdefault(c.schema_path[0], []).append(c)
        named = [
            errs for errs in branches.values()
            if not any(list(c.relative_path) == [prop] and c.validator in ("const", "enum") for c in errs)
        ]
        if len(named) == 1:
            return [x for c in named[0] for x in _explain(c)]
    if e.context:
        return [jsonschema.exceptions.best_match([e])]
    return [e]


def _normalise_path(path):
    path = path.split("#", 1)[0].split("?", 1)[0]
    # The server ignores repeated and trailing slashes when it splits the path.
    path = "/" + "/".join(s for s in path.split("/") if s)
    return path


class Contract:
    """The OpenAPI document, loaded once; check() validates one answer."""

    def __init__(self, yaml_path):
        with open(yaml_path, "rb") as f:
            self.doc = yaml.safe_load(f)
        self.path = yaml_path
        if not isinstance(self.doc, dict) or not str(self.doc.get("openapi", "")).startswith("3.1"):
            raise AssertionError("%s is not an OpenAPI 3.1 document" % yaml_path)
        resource = Resource(contents=self.doc, specification=DRAFT202012)
        self.registry = Registry().with_resource(BASE_URI, resource)
        self._validators = {}
        self._routes = []
        for template, item in self.doc.get("paths", {}).items():
            self._routes.append((template, self._compile(template), item))
        # Literal paths win over templated ones.
        self._routes.sort(key=lambda r: r[0].count("{"))

    # ---- document access ------------------------------------------------------

    def resolve(self, pointer):
        """The object at a JSON pointer ('' is the document)."""
        node = self.doc
        if pointer in ("", "#"):
            return node
        for raw in pointer.lstrip("#").lstrip("/").split("/"):
            seg = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list):
                node = node[int(seg)]
            elif isinstance(node, dict) and seg in node:
                node = node[seg]
            else:
                raise KeyError("no %r in %s" % (seg, pointer))
        return node

    def _deref(self, pointer):
        """Follow $ref chains of non-schema objects (responses, parameters)."""
        obj = self.resolve(pointer)
        seen = set()
        while isinstance(obj, dict) and "$ref" in obj:
            ref = obj["$ref"]
            if not ref.startswith("#") or ref in seen:
                raise AssertionError("bad $ref %r at %s" % (ref, pointer))
            seen.add(ref)
            pointer = ref[1:]
            obj = self.resolve(pointer)
        return pointer, obj

    def _compile(self, template):
        out = "^"
        for seg in template.strip("/").split("/"):
            if re.fullmatch(r"\{([^}]+)\}", seg):
                # Any segment takes a parameter's place (service/http/route_match.c): a
                # bad id is a 400 of the route, not an unknown path.
                out += "/[^/]+"
            else:
                out += "/" + re.escape(seg)
        return re.compile(out + "$")

    def _schema_of(self, schema):
        while isinstance(schema, dict) and "$ref" in schema and schema["$ref"].startswith("#"):
            schema = self.resolve(schema["$ref"][1:])
        return schema if isinstance(schema, dict) else {}

    def validator(self, pointer):
        """A validator for the schema at `pointer` in the document."""
        v = self._validators.get(pointer)
        if v is None:
            ref = BASE_URI + "#" + quote(pointer, safe="/~")
            v = _Validator({"$ref": ref}, registry=self.registry)
            self._validators[pointer] = v
        return v

    # ---- matching -------------------------------------------------------------

    def find(self, method, path):
        """(template, pointer of the operation) or raise AssertionError."""
        method = method.lower()
        if path in self.doc.get("paths", {}):
            template = path
        else:
            concrete = _normalise_path(path)
            template = None
            for t, rx, _ in self._routes:
                if rx.match(concrete):
                    template = t
                    break
            if template is None:
                raise AssertionError("%s %s: path not in the contract" % (method.upper(), path))
        item = self.doc["paths"][template]
        if method not in item:
            raise AssertionError(
                "%s %s: method not in the contract for %s (has %s)"
                % (method.upper(), path, template, ", ".join(m.upper() for m in METHODS if m in item))
            )
        return template, _pointer("paths", template, method)

    def _response(self, where, responses_ptr, status):
        responses = self.resolve(responses_ptr)
        key = str(status)
        for k in (key, key[0] + "XX", "default"):
            if k in responses:
                return self._deref(responses_ptr + "/" + _escape(k))
        raise AssertionError(
            "%s: status %s not in the contract (documented: %s)"
            % (where, key, ", ".join(sorted(responses)))
        )

    # ---- checking -------------------------------------------------------------

    def check(self, method, path, status, content_type, body_bytes):
        """Validate one answer. Returns the decoded JSON (or the raw body)."""
        where = "%s %s -> %s" % (method.upper(), path, status)
        try:
            _, op_ptr = self.find(method, path)
            resp_ptr, resp = self._response(where, op_ptr + "/responses", status)
        except AssertionError as e:
            resp_ptr, resp = self._unrouted(method, path, status, e)
        return self._check_body(where, resp_ptr, resp, content_type, body_bytes)

    def check_request(self, method, path, content_type, body_bytes):
        """Validate a request body that a test is about to send."""
        where = "%s %s (request)" % (method.upper(), path)
        _, op_ptr = self.find(method, path)
        op = self.resolve(op_ptr)
        if "requestBody" not in op:
            raise AssertionError("%s: the operation takes no body" % where)
        rb_ptr, _ = self._deref(op_ptr + "/requestBody")
        return self._check_body(where, rb_ptr, self.resolve(rb_ptr), content_type, body_bytes)

    def _unrouted(self, method, path, status, why):
        """Answers to requests that match no operation: x-devio-unrouted."""
        spec = self.doc.get("x-devio-unrouted")
        if not spec:
            raise why
        if not self._path_known(path):
            kind = "unknown-path"
        elif not self._method_known(method, path):
            kind = "unknown-method"
        else:
            raise why  # a documented operation with an undocumented status
        if str(status) not in spec.get(kind, []):
            raise why
        return self._deref(_pointer("x-devio-unrouted", "responses", str(status)))

    def _path_known(self, path):
        if path in self.doc.get("paths", {}):
            return True
        concrete = _normalise_path(path)
        return any(rx.match(concrete) for _, rx, _ in self._routes)

    def _method_known(self, method, path):
        try:
            self.find(method, path)
            return True
        except AssertionError:
            return False

    def _check_body(self, where, resp_ptr, resp, content_type, body):
        content = resp.get("content")
        if not content:
            if body:
                raise AssertionError("%s: the contract has no body here, got %d bytes" % (where, len(body)))
            return body
        if not content_type:
            raise AssertionError("%s: no Content-Type (contract: %s)" % (where, ", ".join(content)))
        base, params = _media(content_type)
        chosen = None
        for key in content:
            kbase, kparams = _media(key)
            if kbase == base and all(params.get(k) == v for k, v in kparams.items()):
                chosen = key
                break
        if chosen is None:
            raise AssertionError(
                "%s: Content-Type %r not in the contract (%s)" % (where, content_type, ", ".join(content))
            )
        media = content[chosen]
        media_ptr = resp_ptr + "/content/" + _escape(chosen)
        if base not in JSON_TYPES and not base.endswith("+json"):
            return self._check_opaque(where, base, media, body)
        if isinstance(body, (bytes, bytearray, str)):
            try:
                value = _strict_json(body)
            except ValueError as e:
                raise AssertionError("%s: body is not strict JSON: %s" % (where, e)) from None
        else:
            value = body
        if "schema" in media:
            self._validate(where, media_ptr + "/schema", value)
        return value

    def _check_opaque(self, where, base, media, body):
        if isinstance(body, str):
            body = body.encode("utf-8")
        n = media.get("x-devio-element-bytes")
        if n and len(body) % int(n):
            raise AssertionError("%s: %d bytes is not a whole number of %d-byte values" % (where, len(body), n))
        schema = media.get("schema", {})
        if schema.get("type") == "string" and "contentEncoding" not in schema:
            try:
                text = bytes(body).decode("utf-8")
            except UnicodeDecodeError as e:
                raise AssertionError("%s: %s body is not UTF-8: %s" % (where, base, e)) from None
            if base in ("application/yaml", "application/x-yaml", "text/yaml"):
                try:
                    yaml.safe_load(text)
                except yaml.YAMLError as e:
                    raise AssertionError("%s: body is not YAML: %s" % (where, e)) from None
        return body

    def _validate(self, where, schema_ptr, value):
        v = self.validator(schema_ptr)
        try:
            errors = sorted(v.iter_errors(value), key=jsonschema.exceptions.relevance, reverse=True)
        except Unresolvable as e:
            # Name the reference only: the default message prints the whole document.
            raise AssertionError(
                "%s: schema %s has a $ref that does not resolve: %s"
                % (where, schema_ptr, getattr(e, "ref", None) or type(e).__name__)
            ) from None
        if errors:
            lines = []
            for e in [x for e in errors[:3] for x in _explain(e)][:5]:
                lines.append("  at %s: %s" % (e.json_path, e.message[:300]))
            raise AssertionError(
                "%s: body breaks the contract (%s):\n%s\n  body: %s"
                % (where, schema_ptr, "\n".join(lines), json.dumps(value)[:500])
            )

    # ---- lint -----------------------------------------------------------------

    def lint(self):
        """Problems in the document itself, as a list of strings (empty: clean)."""
        problems = []

        def walk(node, ptr):
            if isinstance(node, dict):
                for k, v in node.items():
                    if k == "$ref" and isinstance(v, str):
                        check_ref(v, ptr)
                    elif k == "mapping" and ptr.endswith("/discriminator") and isinstance(v, dict):
                        for name, target in v.items():
                            check_ref(target, ptr + "/mapping/" + _escape(name))
                    walk(v, ptr + "/" + _escape(k))
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, "%s/%d" % (ptr, i))

        def check_ref(ref, ptr):
            if not ref.startswith("#/"):
                problems.append("%s: $ref %r is not local" % (ptr, ref))
                return
            try:
                self.resolve(ref[1:])
            except (KeyError, IndexError, ValueError):
                problems.append("%s: $ref %r does not resolve" % (ptr, ref))

        walk(self.doc, "")

        for name, schema in self.doc.get("components", {}).get("schemas", {}).items():
            try:
                Draft202012Validator.check_schema(schema)
            except jsonschema.exceptions.SchemaError as e:
                problems.append("components/schemas/%s: %s" % (name, e.message))

        op_ids = {}
        for template, item in self.doc.get("paths", {}).items():
            names = set(re.findall(r"\{([^}]+)\}", template))
            declared = set()
            for p in item.get("parameters", []) or []:
                p = self._schema_of(p)
                if p.get("in") == "path":
                    declared.add(p.get("name"))
            for m in METHODS:
                if m not in item:
                    continue
                op = item[m]
                where = "%s %s" % (m.upper(), template)
                oid = op.get("operationId")
                if not oid:
                    problems.append("%s: no operationId" % where)
                elif oid in op_ids:
                    problems.append("%s: operationId %s also on %s" % (where, oid, op_ids[oid]))
                else:
                    op_ids[oid] = where
                mine = set(declared)
                for p in op.get("parameters", []) or []:
                    p = self._schema_of(p)
                    if p.get("in") == "path":
                        mine.add(p.get("name"))
                if mine != names:
                    problems.append("%s: path parameters %s, template has %s" % (where, sorted(mine), sorted(names)))
                if not op.get("responses"):
                    problems.append("%s: no responses" % where)
                problems.extend(self._lint_examples(_pointer("paths", template, m)))
        return problems

    def _lint_examples(self, op_ptr):
        """Every example given for a body must match that body's schema."""
        problems = []
        op = self.resolve(op_ptr)
        bodies = []
        if "requestBody" in op:
            bodies.append(self._deref(op_ptr + "/requestBody")[0])
        for code in op.get("responses", {}):
            bodies.append(self._deref(op_ptr + "/responses/" + _escape(code))[0])
        for ptr in bodies:
            for mt, media in (self.resolve(ptr).get("content") or {}).items():
                if "schema" not in media or not _media(mt)[0].endswith("json"):
                    continue
                samples = []
                if "example" in media:
                    samples.append(("example", media["example"]))
                for name, ex in (media.get("examples") or {}).items():
                    samples.append(("examples/" + name, ex.get("value")))
                schema_ptr = ptr + "/content/" + _escape(mt) + "/schema"
                for name, value in samples:
                    try:
                        self._validate("%s %s" % (ptr, name), schema_ptr, value)
                    except AssertionError as e:
                        problems.append(str(e))
        return problems


# ---- self-test ------------------------------------------------------------------


def _self_test(api):
    """Hand-written answers: those in PASS must pass, those in FAIL must fail."""
    err = lambda code, details=None: json.dumps(  # noqa: E731
        {"error": {"code": code, "message": "m", "details": details or {}}}
    )
    J = "application/json"
    step = {
        "ticket": 12,
        "rows": [
            {"seq": 7, "len": 3, "logits": 31, "tokens": [4242], "logprobs": [-1.25]},
            {"seq": 8, "len": 1},
        ],
        "timing": {"queued_us": 40, "compute_us": 900},
        "tokens": 4,
    }
    facts = {
        "kv": {"block_size": 16, "blocks_total": 64, "blocks_free": 60, "blocks_shared": 0},
        "ssm": {"slots_total": 0, "slots_used": 0, "snapshots_total": 0, "snapshots_used": 0},
        "parked": {"seqs": 0, "bytes": 0},
        "tickets_in_flight": 0,
        "logits_live": 1,
        "logits_rows_live": 1,
        "adapters_loaded": 0,
        "epoch": 3,
    }
    device = {
        "version": "0.2.0",
        "backend": "ref",
        "numerics": "strict",
        "device": {
            "name": "x86-64 CPU, 2 threads (reference)", "memory_total": 0, "memory_free": 0,
            "memory_used": 1 << 20, "compute_capability": "", "driver": "", "runtime": "",
            "failure": "",
        },
        "model": {
            "architecture": "LlamaForCausalLM", "dtype": "F32", "vocab_size": 256,
            "hidden_size": 64, "intermediate_size": 128, "layers": 2, "heads": 4,
            "kv_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
            "tied_embeddings": True,
        },
        "max_depth": 2,
        "limits": {
            "block_size": 16, "kv_blocks": 64, "max_seqs": 256, "max_seq_len": 512,
            "max_rows": 64, "max_batch_tokens": 2048, "logits_handles": 64,
            "logits_rows": 256, "max_loras": 4, "max_lora_rank": 64,
            "ssm_slots": 0, "ssm_snapshots": 0,
        },
        "threads": 0,
        "epoch": 1,
    }
    history = {
        "tickets": [
            {"id": 13, "epoch": 2, "status": "in_flight", "launched_ms": 1700000000000,
             "settled_ms": None, "rows": 1, "tokens": 1, "seqs": [7], "queued_us": 0,
             "compute_us": 0, "error": None, "request_id": "c0ffee-1"},
            {"id": 12, "epoch": 2, "status": "failed", "launched_ms": 1700000000000,
             "settled_ms": 1700000000005, "rows": 2, "tokens": 4, "seqs": [7, 8],
             "queued_us": 3, "compute_us": 900,
             "error": {"code": "device_error", "message": "backend failed"},
             "request_id": "2-9"},
            {"id": 11, "epoch": 1, "status": "aborted", "launched_ms": 1700000000000,
             "settled_ms": None, "rows": 1, "tokens": 1, "seqs": [7], "queued_us": None,
             "compute_us": None,
             "error": {"code": "aborted", "message": "process ended before the ticket settled"},
             "request_id": None},
        ],
        "next": 12,
    }
    adapter = {"name": "sql", "path": "sql-r8", "rank": 8, "alpha": 16.0, "scale": 2.0,
               "targets": ["q_proj", "v_proj"], "sha256": "0" * 64, "size": 15368,
               "pinned": False, "rows_served": 0, "state": "loaded", "loaded_ms": 1700000000000,
               "last_used_ms": 1700000000000, "reason": None}
    unloaded = dict(adapter, state="unloaded")
    metrics = b"# TYPE devio_up gauge\ndevio_up 1\n"

    PASS = [
        ("POST", "/v1/sequences", 201, J, '{"seq":7}'),
        ("GET", "/v1/sequences/7", 200, J,
         '{"seq":7,"len":3,"blocks":1,"busy":null,"ssm_slot":false,"snapshots_held":0,'
         '"snapshots":[],"parked":false}'),
        ("GET", "/v1/sequences/7", 200, J,
         '{"seq":7,"len":3,"blocks":1,"busy":12,"ssm_slot":true,"snapshots_held":1,'
         '"snapshots":[3],"parked":false}'),
        ("GET", "/v1/sequences/99", 404, J, err("unknown_seq", {"seq": 99})),
        ("DELETE", "/v1/sequences/7", 200, J, '{"kind":"free","freed_blocks":1,"freed_snapshots":0,"freed_logits":0}'),
        ("DELETE", "/v1/sequences/7", 409, J, err("seq_busy", {"ticket": 12})),
        ("POST", "/v1/launch", 202, J, '{"ticket":12}'),
        ("POST", "/v1/launch", 409, J, err("out_of_kv_blocks", {"needed": 3})),
        ("POST", "/v1/launch", 409, J, err("out_of_ssm_slots", {"needed": 2})),
        ("POST", "/v1/launch", 409, J, err("out_of_snapshots", {"needed": 4})),
        ("POST", "/v1/launch", 500, J, err("device_error", {"row": 0})),
        ("POST", "/v1/launch", 413, J, err("too_large", {"max_rows": 64})),
        ("POST", "/v1/launch", 401, J, err("unauthorized")),
        ("POST", "/v1/step", 200, J, json.dumps(step)),
        ("POST", "/v1/tickets/12/await?timeout_ms=5000", 200, J, json.dumps(step)),
        ("POST", "/v1/tickets/{id}/await", 200, "application/json; charset=utf-8", json.dumps(step)),
        ("POST", "/v1/tickets/12/await", 202, J, json.dumps({"ticket": 12, "status": "pending"})),
        ("POST", "/v1/tickets/12/await", 409, J, err("ticket_consumed", {"ticket": 12})),
        ("POST", "/v1/tickets/12/await", 503, J, err("torn_down")),
        ("GET", "/v1/tickets?limit=50&status=ok", 200, J, json.dumps(history)),
        ("GET", "/v1/tickets", 200, J, '{"tickets":[],"next":null}'),
        ("GET", "/v1/logits/31?top=2", 200, J, '{"shape":[1,256],"row":0,"top":[[42,13.5],[7,12]]}'),
        ("GET", "/v1/logits/31", 200, "application/octet-stream", bytes(8 * 256)),
        ("POST", "/v1/effects", 200, J, '{"kind":"sample","tokens":[4242],"logprobs":[-0.5]}'),
        ("POST", "/v1/effects", 200, J, '{"kind":"fork","seq":8,"shared_blocks":1}'),
        ("POST", "/v1/effects", 200, J,
         '{"kind":"truncate","len":2,"freed_blocks":0,"freed_snapshots":1}'),
        ("POST", "/v1/effects", 200, J, '{"kind":"snapshot","len":3}'),
        ("POST", "/v1/effects", 200, J, '{"kind":"free","freed_blocks":1,"freed_snapshots":2,"freed_logits":1}'),
        ("POST", "/v1/effects", 200, J, '{"kind":"release"}'),
        ("POST", "/v1/effects", 200, J, '{"kind":"release","freed_snapshots":3}'),
        ("POST", "/v1/effects", 409, J, err("no_snapshot", {"len": 2})),
        ("POST", "/v1/effects", 409, J, err("out_of_snapshots", {"ssm_snapshots": 16})),
        ("POST", "/v1/effects", 409, J, err("out_of_ssm_slots", {"ssm_slots": 4})),
        ("POST", "/v1/effects", 404, J, err("unknown_logits", {"logits": 31})),
        ("GET", "/v1/facts", 200, J, json.dumps(facts)),
        ("GET", "/v1/device", 200, J, json.dumps(device)),
        ("POST", "/v1/teardown", 200, J, '{"torn_down":true,"aborted":1}'),
        ("GET", "/v1/adapters", 200, J, json.dumps([adapter])),
        ("GET", "/v1/adapters/sql", 200, J, json.dumps(adapter)),
        ("PUT", "/v1/adapters/sql", 400, J, err("unsupported")),
        ("DELETE", "/v1/adapters/sql", 200, J, json.dumps(unloaded)),
        ("GET", "/v1/openapi.yaml", 200, "application/yaml", b"openapi: 3.1.0\n"),
        ("GET", "/healthz", 200, J, '{"status":"ok"}'),
        ("GET", "/readyz", 503, J, err("not_ready")),
        ("GET", "/metrics", 200, "text/plain; version=0.0.4", metrics),
        ("GET", "/v2/nothing", 404, J, err("not_found")),
        ("GET", "/v1/sequences/12", 404, J, err("unknown_seq", {"seq": 12})),
        ("PATCH", "/v1/facts", 405, J, err("method_not_allowed")),
        ("GET", "/v1/launch", 405, J, err("method_not_allowed")),
    ]
    FAIL = [
        ("wrong type", "POST", "/v1/sequences", 201, J, '{"seq":"7"}'),
        ("float for integer", "POST", "/v1/sequences", 201, J, '{"seq":7.0}'),
        ("extra property", "GET", "/v1/facts", 200, J, json.dumps(dict(facts, extra=1))),
        ("nested extra property", "POST", "/v1/step", 200, J,
         json.dumps(dict(step, timing={"queued_us": 1, "compute_us": 2, "total_us": 3}))),
        ("missing property", "POST", "/v1/effects", 200, J, '{"kind":"fork","seq":8}'),
        ("truncate without freed_snapshots", "POST", "/v1/effects", 200, J,
         '{"kind":"truncate","len":2,"freed_blocks":0}'),
        ("free without freed_snapshots", "DELETE", "/v1/sequences/7", 200, J,
         '{"kind":"free","freed_blocks":1}'),
        ("sequence without ssm_slot", "GET", "/v1/sequences/7", 200, J,
         '{"seq":7,"len":3,"blocks":1,"busy":null,"snapshots_held":0,"snapshots":[]}'),
        ("sequence without snapshots_held", "GET", "/v1/sequences/7", 200, J,
         '{"seq":7,"len":3,"blocks":1,"busy":null,"ssm_slot":false,"snapshots":[]}'),
        ("snapshots past 64", "GET", "/v1/sequences/7", 200, J,
         '{"seq":7,"len":70,"blocks":5,"busy":null,"ssm_slot":true,"snapshots_held":65,'
         '"snapshots":[' + ",".join(str(i) for i in range(1, 66)) + ']}'),
        ("out_of_snapshots as 400", "POST", "/v1/launch", 400, J, err("out_of_snapshots")),
        ("unknown effect kind", "POST", "/v1/effects", 200, J, '{"kind":"merge"}'),
        ("tokens without logprobs", "POST", "/v1/step", 200, J,
         json.dumps(dict(step, rows=[{"seq": 7, "len": 3, "tokens": [1]}]))),
        ("undocumented status", "POST", "/v1/launch", 200, J, '{"ticket":12}'),
        ("error code of another status", "POST", "/v1/launch", 409, J, err("ticket_pending")),
        ("unknown error code", "POST", "/v1/launch", 400, J, err("bad_plan")),
        ("undocumented path", "GET", "/v1/nothing", 200, J, "{}"),
        ("undocumented method", "PATCH", "/v1/facts", 200, J, json.dumps(facts)),
        ("wrong content type", "GET", "/v1/facts", 200, "text/plain", json.dumps(facts)),
        ("NaN", "GET", "/v1/logits/31", 200, J, '{"shape":[1,2],"row":0,"top":[[1,NaN]]}'),
        ("duplicate key", "POST", "/v1/sequences", 201, J, '{"seq":7,"seq":8}'),
        ("ragged raw logits", "GET", "/v1/logits/31", 200, "application/octet-stream", b"\0" * 5),
        ("unload answer still loaded", "DELETE", "/v1/adapters/sql", 200, J, json.dumps(adapter)),
        ("wrong metrics version", "GET", "/metrics", 200, "text/plain; version=1.0.0", metrics),
        ("error without details", "GET", "/v1/sequences/9", 404, J,
         '{"error":{"code":"unknown_seq","message":"m"}}'),
        ("bad ticket status", "GET", "/v1/tickets", 200, J,
         json.dumps({"tickets": [dict(history["tickets"][0], status="running")], "next": None})),
        ("404 on a known route", "GET", "/v1/facts", 404, J, err("not_found")),
        ("error code ok", "POST", "/v1/step", 200, J, err("ok")),
        ("ticket error code ok", "GET", "/v1/tickets", 200, J,
         json.dumps({"tickets": [dict(history["tickets"][1], error={"code": "ok", "message": ""})],
                     "next": None})),
    ]
    surprises = []
    for method, path, status, ct, body in PASS:
        try:
            api.check(method, path, status, ct, body if isinstance(body, bytes) else body.encode())
        except AssertionError as e:
            surprises.append("should pass: %s %s %s\n%s" % (method, path, status, e))
    for why, method, path, status, ct, body in FAIL:
        try:
            api.check(method, path, status, ct, body if isinstance(body, bytes) else body.encode())
        except AssertionError:
            continue
        surprises.append("should fail (%s): %s %s %s" % (why, method, path, status))
    REQ_PASS = [
        ("POST", "/v1/launch", {"rows": [{"seq": 7, "tokens": [1, 2, 3], "logits": "last",
                                          "sample": {"temperature": 0.7, "top_k": 40, "seed": 1}}]}),
        ("POST", "/v1/launch", {"rows": [{"seq": 7, "tokens": [1, 2], "snapshot": "each"},
                                         {"seq": 8, "tokens": [3], "snapshot": "end"},
                                         {"seq": 9, "tokens": [4], "snapshot": None}]}),
        ("POST", "/v1/effects", {"kind": "truncate", "seq": 7, "len": 2}),
        ("POST", "/v1/effects", {"kind": "release", "logits": 31}),
        ("POST", "/v1/effects", {"kind": "release", "seq": 7}),
        ("PUT", "/v1/adapters/sql", {"path": "sql-r8", "pin": False}),
    ]
    REQ_FAIL = [
        ("POST", "/v1/launch", {"rows": []}),
        ("POST", "/v1/launch", {"rows": [{"seq": 7, "tokens": [1], "logits": "first"}]}),
        ("POST", "/v1/effects", {"kind": "truncate", "seq": 7}),
        ("POST", "/v1/launch", {"rows": [{"seq": 7, "tokens": [1], "snapshot": "start"}]}),
        ("POST", "/v1/effects", {"kind": "release"}),
        ("POST", "/v1/effects", {"kind": "release", "logits": 31, "seq": 7}),
    ]
    for method, path, body in REQ_PASS:
        try:
            api.check_request(method, path, J, json.dumps(body))
        except AssertionError as e:
            surprises.append("request should pass: %s %s\n%s" % (method, path, e))
    for method, path, body in REQ_FAIL:
        try:
            api.check_request(method, path, J, json.dumps(body))
        except AssertionError:
            continue
        surprises.append("request should fail: %s %s %s" % (method, path, body))
    return len(PASS) + len(FAIL) + len(REQ_PASS) + len(REQ_FAIL), surprises


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    path = argv[1] if len(argv) > 1 else os.path.join(here, "..", "..", "api", "openapi.yaml")
    api = Contract(path)
    problems = api.lint()
    for p in problems:
        print("lint: " + p)
    n, surprises = _self_test(api)
    for s in surprises:
        print("self-test: " + s)
    ops = sum(1 for item in api.doc["paths"].values() for m in METHODS if m in item)
    print("openapi_check: %d operations, %d lint problems, %d/%d self-test cases as expected"
          % (ops, len(problems), n - len(surprises), n))
    return 1 if problems or surprises else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

/* script.c - runs conformance scripts: bindings, id naming, logits digests.
 * Prints only what is deterministic (no timings, no epoch, ids as names); never calls the device directly. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec.h"
#include "conform/script.h"
#include "common/sha256.h"
#include "device/status.h"

#define MAX_NAMES 4096

typedef struct id_name {
    uint64_t id;
    char *name;
} id_name;

/* One table per id space: sequences, tickets, logits handles. */
typedef struct name_table {
    const char *kind;
    id_name *v;
    uint32_t n, cap;
} name_table;

/* A state an export op kept under its `as` name, for import ops. */
typedef struct state_blob {
    char *name;
    uint8_t *data;
    size_t n;
} state_blob;

typedef struct runner {
    const devio_script_target *t;
    json_t *bindings; /* name -> raw result */
    state_blob *blobs;
    uint32_t n_blobs;
    name_table seqs, tickets, logits;
    char *why;
    size_t why_len;
    unsigned line;
} runner;

static int fail(runner *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(r->why, r->why_len, "line %u: ", r->line);
    if (n >= 0 && (size_t)n < r->why_len)
        vsnprintf(r->why + n, r->why_len - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

void devio_logits_digest(const float *v, size_t n, char hex[65])
{
    devio_sha256 s;
    devio_sha256_init(&s);
    uint8_t chunk[1024];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], 4);
        if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu))
            b = 0x7fc00000u;
        chunk[k++] = (uint8_t)b;
        chunk[k++] = (uint8_t)(b >> 8);
        chunk[k++] = (uint8_t)(b >> 16);
        chunk[k++] = (uint8_t)(b >> 24);
        if (k == sizeof chunk) {
            devio_sha256_update(&s, chunk, k);
            k = 0;
        }
    }
    devio_sha256_update(&s, chunk, k);
    uint8_t d[32];
    devio_sha256_final(&s, d);
    devio_sha256_hex(d, hex);
}

/* ---- naming ids --------------------------------------------------------- */

static const char *name_of(name_table *t, uint64_t id, const char *suggested)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (t->v[i].id == id)
            return t->v[i].name;
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 64;
        id_name *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return "?";
        t->v = v;
        t->cap = cap;
    }
    char buf[128];
    if (suggested)
        snprintf(buf, sizeof buf, "%s", suggested);
    else
        snprintf(buf, sizeof buf, "%s#%u", t->kind, t->n + 1);
    t->v[t->n].id = id;
    t->v[t->n].name = strdup(buf);
    return t->v[t->n].name ? t->v[t->n++].name : "?";
}

static void table_free(name_table *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        free(t->v[i].name);
    free(t->v);
}

/* ---- resolving "$name.path[i]" references -------------------------------- */

static const json_t *primary_id(const json_t *bound)
{
    static const char *const keys[] = {"seq", "ticket", "logits"};
    if (json_is_integer(bound))
        return bound;
    for (int i = 0; i < 3; i++) {
        const json_t *v = json_object_get(bound, keys[i]);
        if (json_is_integer(v))
            return v;
    }
    return NULL;
}

static json_t *resolve_ref(runner *r, const char *ref)
{
    char name[128];
    size_t n = strcspn(ref, ".[");
    if (n == 0 || n >= sizeof name)
        return NULL;
    memcpy(name, ref, n);
    name[n] = '\0';
    const json_t *v = json_object_get(r->bindings, name);
    const char *p = ref + n;
    if (!*p)
        return v ? json_deep_copy(primary_id(v)) : NULL;
    while (v && *p) {
        if (*p == '.') {
            p++;
            size_t k = strcspn(p, ".[");
            char key[128];
            if (k == 0 || k >= sizeof key)
                return NULL;
            memcpy(key, p, k);
            key[k] = '\0';
            v = json_object_get(v, key);
            p += k;
        } else if (*p == '[') {
            char *end;
            unsigned long i = strtoul(p + 1, &end, 10);
            if (*end != ']')
                return NULL;
            v = json_array_get(v, i);
            p = end + 1;
        } else {
            return NULL;
        }
    }
    return v ? json_deep_copy(v) : NULL;
}

static int substitute(runner *r, json_t *j);

/* *repl: what replaces v when it is a "$ref" string (new reference), else NULL
 * after substituting inside v. */
static int substitute_value(runner *r, json_t *v, json_t **repl)
{
    *repl = NULL;
    if (!json_is_string(v) || json_string_value(v)[0] != '$')
        return substitute(r, v);
    *repl = resolve_ref(r, json_string_value(v) + 1);
    return *repl ? 0 : fail(r, "unbound reference '%s'", json_string_value(v));
}

/* Replace every "$ref" string inside j (in place). */
static int substitute(runner *r, json_t *j)
{
    json_t *v, *x;
    if (json_is_object(j)) {
        const char *k;
        json_object_foreach(j, k, v) {
            if (substitute_value(r, v, &x) < 0)
                return -1;
            if (x)
                json_object_set_new(j, k, x);
        }
    } else if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++) {
            if (substitute_value(r, json_array_get(j, i), &x) < 0)
                return -1;
            if (x)
                json_array_set_new(j, i, x);
        }
    }
    return 0;
}

/* ---- rendering results -------------------------------------------------- */

static json_t *logits_view(runner *r, uint64_t id, const char *name, bool full)
{
    float *data = NULL;
    uint32_t rows = 0, vocab = 0;
    devio_error err = {0};
    json_t *o = json_pack("{s:s}", "id", name);
    if (r->t->logits(r->t->ctx, id, &data, &rows, &vocab, &err) != DEVIO_OK) {
        json_object_set_new(o, "error", json_string(devio_status_str(err.status)));
        return o;
    }
    char hex[65];
    size_t n = (size_t)rows * vocab;
    devio_logits_digest(data, n, hex);
    json_object_set_new(o, "shape", json_pack("[i,i]", rows, vocab));
    json_object_set_new(o, "sha256", json_string(hex));
    if (full) {
        json_t *vals = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(vals, devio_json_float(data[i]));
        json_object_set_new(o, "values", vals);
    }
    free(data);
    return o;
}

/* Rewrite ids as names (suggesting `as`-based names for new ones), expand
 * logits handles into digests, drop what varies between runs. */
static void render(runner *r, json_t *j, const char *path, const char *as, bool full)
{
    if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++) {
            char p[256];
            snprintf(p, sizeof p, "%s[%zu]", path, i);
            render(r, json_array_get(j, i), p, as, full);
        }
        return;
    }
    if (!json_is_object(j))
        return;
    json_object_del(j, "timing");
    json_object_del(j, "epoch");
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(j, tmp, k, v) {
        char p[256], sugg[256];
        snprintf(p, sizeof p, "%s.%s", path, k);
        const char *suggest = NULL;
        if (as) {
            /* The top-level id takes the binding's own name. */
            snprintf(sugg, sizeof sugg, "%s%s", as, path[0] ? p : "");
            suggest = sugg;
        }
        if (json_is_integer(v)) {
            uint64_t id = (uint64_t)json_integer_value(v);
            if (strcmp(k, "seq") == 0)
                json_object_set_new(j, k, json_string(name_of(&r->seqs, id, suggest)));
            else if (strcmp(k, "ticket") == 0 || strcmp(k, "busy") == 0)
                json_object_set_new(j, k, json_string(name_of(&r->tickets, id, suggest)));
            else if (strcmp(k, "logits") == 0)
                json_object_set_new(j, k, logits_view(r, id, name_of(&r->logits, id, suggest),
                                                      full));
        } else {
            render(r, v, p, as, full);
        }
    }
}

/* ---- one line ------------------------------------------------------------ */

static json_t *body_of(runner *r, const char *op, json_t *line)
{
    if (strcmp(op, "launch") == 0 || strcmp(op, "step") == 0)
        return json_incref(json_object_get(line, "plan"));
    if (strcmp(op, "apply") == 0)
        return json_incref(json_object_get(line, "effect"));
    if (strcmp(op, "lora") == 0)
        return json_incref(json_object_get(line, "cmd"));
    if (strcmp(op, "await") == 0) {
        json_t *b = json_pack("{s:O}", "ticket", json_object_get(line, "ticket"));
        json_t *t = json_object_get(line, "timeout_ms");
        if (b && t)
            json_object_set(b, "timeout_ms", t);
        return b;
    }
    if (strcmp(op, "seq") == 0)
        return json_pack("{s:O}", "seq", json_object_get(line, "seq"));
    (void)r;
    return NULL;
}

/* Positions [row, row+1) of handle `id` (all positions when row < 0) as
 * a digest; fills *rows and *hex. */
static devio_status digest_rows(runner *r, uint64_t id, int64_t row, uint32_t *rows,
                                char hex[65], devio_error *err)
{
    float *data = NULL;
    uint32_t n = 0, vocab = 0;
    devio_status s = r->t->logits(r->t->ctx, id, &data, &n, &vocab, err);
    if (s != DEVIO_OK)
        return s;
    if (row >= (int64_t)n) {
        free(data);
        return devio_fail(err, DEVIO_E_INVALID, "row %lld outside the handle's %u rows",
                          (long long)row, n);
    }
    const float *p = row < 0 ? data : data + (size_t)row * vocab;
    *rows = row < 0 ? n : 1;
    devio_logits_digest(p, (size_t)*rows * vocab, hex);
    free(data);
    return DEVIO_OK;
}

/* {"op":"compare","a":H,"a_row":i?,"b":H,"b_row":j?}: are the two logits
 * (a whole handle, or one of its positions) the same bits? Invariance suites
 * use it so that a script checks itself on every target. */
static int compare(runner *r, const json_t *line, json_t **result, devio_error *err)
{
    const json_t *a = json_object_get(line, "a"), *b = json_object_get(line, "b");
    const json_t *ar = json_object_get(line, "a_row"), *br = json_object_get(line, "b_row");
    if (!json_is_integer(a) || !json_is_integer(b) || (ar && !json_is_integer(ar)) ||
        (br && !json_is_integer(br)))
        return fail(r, "op compare needs logits handles \"a\" and \"b\" (rows optional)");
    char ha[65], hb[65];
    uint32_t na = 0, nb = 0;
    *result = NULL;
    if (digest_rows(r, (uint64_t)json_integer_value(a), ar ? json_integer_value(ar) : -1, &na,
                    ha, err) != DEVIO_OK ||
        digest_rows(r, (uint64_t)json_integer_value(b), br ? json_integer_value(br) : -1, &nb,
                    hb, err) != DEVIO_OK)
        return 0;
    bool equal = na == nb && strcmp(ha, hb) == 0;
    *result = json_pack("{s:b,s:i,s:s}", "equal", equal, "rows", na, "sha256", ha);
    if (!equal)
        json_object_set_new(*result, "sha256_b", json_string(hb));
    return 0;
}

/* ---- states: export and import ------------------------------------------ */

static state_blob *blob_find(runner *r, const char *name)
{
    for (uint32_t i = 0; i < r->n_blobs; i++)
        if (strcmp(r->blobs[i].name, name) == 0)
            return &r->blobs[i];
    return NULL;
}

/* Keep data (taken) under name, replacing what was there. */
static int blob_keep(runner *r, const char *name, uint8_t *data, size_t n)
{
    state_blob *b = blob_find(r, name);
    if (!b) {
        state_blob *v = realloc(r->blobs, (r->n_blobs + 1) * sizeof *v);
        if (!v || !(v[r->n_blobs].name = strdup(name))) {
            free(data);
            r->blobs = v ? v : r->blobs;
            return fail(r, "out of memory");
        }
        r->blobs = v;
        b = &v[r->n_blobs++];
        b->data = NULL;
    }
    free(b->data);
    b->data = data;
    b->n = n;
    return 0;
}

/* {"op":"export","seq":S,"snapshots":bool?,"as":NAME}: the state's size and
 * digest, the bytes kept under NAME. */
static int export_op(runner *r, const json_t *line, const char *as, json_t **result,
                     devio_error *err)
{
    const json_t *seq = json_object_get(line, "seq");
    if (!json_is_integer(seq) || !as)
        return fail(r, "op export needs \"seq\" and \"as\"");
    *result = NULL;
    if (!r->t->state_export) {
        devio_fail(err, DEVIO_E_UNSUPPORTED, "this target does not export states");
        return 0;
    }
    uint8_t *data = NULL;
    size_t n = 0;
    if (r->t->state_export(r->t->ctx, (uint64_t)json_integer_value(seq),
                           json_is_true(json_object_get(line, "snapshots")), &data, &n,
                           err) != DEVIO_OK)
        return 0;
    uint8_t d[32];
    char hex[65];
    devio_sha256 h;
    devio_sha256_init(&h);
    devio_sha256_update(&h, data, n);
    devio_sha256_final(&h, d);
    devio_sha256_hex(d, hex);
    *result = json_pack("{s:I,s:s}", "bytes", (json_int_t)n, "sha256", hex);
    return blob_keep(r, as, data, n);
}

/* {"op":"import","state":NAME,"flip":i?,"cut":k?}: the state NAME imported
 * as a new sequence; flip xors byte i, cut drops the last k bytes first. */
static int import_op(runner *r, const json_t *line, json_t **result, devio_error *err)
{
    const char *name = json_string_value(json_object_get(line, "state"));
    state_blob *b = name ? blob_find(r, name) : NULL;
    const json_t *flip = json_object_get(line, "flip"), *cut = json_object_get(line, "cut");
    if (!b)
        return fail(r, "op import needs \"state\", the name an export kept");
    if ((flip && (!json_is_integer(flip) || (uint64_t)json_integer_value(flip) >= b->n)) ||
        (cut && (!json_is_integer(cut) || (uint64_t)json_integer_value(cut) > b->n)))
        return fail(r, "op import: \"flip\" and \"cut\" must lie inside the state");
    *result = NULL;
    if (!r->t->state_import) {
        devio_fail(err, DEVIO_E_UNSUPPORTED, "this target does not import states");
        return 0;
    }
    uint8_t *data = malloc(b->n + 1);
    if (!data)
        return fail(r, "out of memory");
    memcpy(data, b->data, b->n);
    size_t n = b->n - (cut ? (size_t)json_integer_value(cut) : 0);
    if (flip)
        data[json_integer_value(flip)] ^= 1u;
    uint64_t seq = 0;
    if (r->t->state_import(r->t->ctx, data, n, &seq, err) == DEVIO_OK)
        *result = json_pack("{s:I}", "seq", (json_int_t)seq);
    free(data);
    return 0;
}

static int run_line(runner *r, json_t *line, FILE *out)
{
    const char *op = json_string_value(json_object_get(line, "op"));
    if (!op)
        return fail(r, "missing \"op\"");
    /* `as` points into the line, whose "$" strings substitute() replaces:
     * a reference there would free the name still in use, and binds nothing
     * a later line could name anyway. */
    const char *as = json_string_value(json_object_get(line, "as"));
    if (as && as[0] == '$')
        return fail(r, "\"as\" names a binding and cannot be a reference ('%.60s')", as);
    bool full = json_is_true(json_object_get(line, "full"));
    static const char *const ops[] = {"create", "seq",   "launch", "await",  "step",
                                      "apply",  "facts", "lora",   "logits", "compare",
                                      "export", "import"};
    bool known = false;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        known |= strcmp(op, ops[i]) == 0;
    if (!known)
        return fail(r, "unknown op '%s'", op);
    if (substitute(r, line) < 0)
        return -1;

    json_t *result = NULL;
    devio_error err = {0};
    devio_status s;
    if (strcmp(op, "compare") == 0) {
        if (compare(r, line, &result, &err) < 0)
            return -1;
        s = result ? DEVIO_OK : err.status;
    } else if (strcmp(op, "export") == 0 || strcmp(op, "import") == 0) {
        int rc = op[0] == 'e' ? export_op(r, line, as, &result, &err)
                              : import_op(r, line, &result, &err);
        if (rc < 0)
            return -1;
        s = result ? DEVIO_OK : err.status;
    } else if (strcmp(op, "logits") == 0) {
        const json_t *id = json_object_get(line, "logits");
        if (!json_is_integer(id))
            return fail(r, "op logits needs \"logits\"");
        result = json_pack("{s:O}", "logits", id);
        s = DEVIO_OK;
    } else {
        json_t *body = body_of(r, op, line);
        s = r->t->call(r->t->ctx, op, body, &result, &err);
        json_decref(body);
    }
    /* Keys of the result are sorted so that every target prints the same
     * bytes; the line itself reads op, ok, result/error as in docs/conformance.md. */
    json_t *payload;
    if (s == DEVIO_OK) {
        if (as)
            json_object_set(r->bindings, as, result);
        payload = json_deep_copy(result);
        render(r, payload, "", as, full);
    } else {
        payload = json_pack("{s:s}", "code", devio_status_str(err.status));
    }
    json_decref(result);
    char *body = json_dumps(payload, DEVIO_JSON_FLAGS | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    json_t *jop = json_string(op);
    char *op_text = json_dumps(jop, JSON_ENCODE_ANY);
    json_decref(jop);
    json_decref(payload);
    char *text = NULL;
    if (body && op_text) {
        size_t n = strlen(body) + strlen(op_text) + 64;
        text = malloc(n);
        if (text)
            snprintf(text, n, "{\"op\":%s,\"ok\":%s,\"%s\":%s}", op_text,
                     s == DEVIO_OK ? "true" : "false", s == DEVIO_OK ? "result" : "error", body);
    }
    free(body);
    free(op_text);
    if (!text)
        return fail(r, "out of memory");
    fprintf(out, "%s\n", text);
    free(text);
    return 0;
}

int devio_script_run(const devio_script_target *t, FILE *in, FILE *out, char *why,
                     size_t why_len)
{
    runner r = {.t = t, .bindings = json_object(), .why = why, .why_len = why_len,
                .seqs = {.kind = "seq"}, .tickets = {.kind = "ticket"},
                .logits = {.kind = "logits"}};
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    if (why_len)
        why[0] = '\0';
    while (rc == 0 && (n = getline(&buf, &cap, in)) >= 0) {
        r.line++;
        size_t skip = strspn(buf, " \t\r\n");
        if (buf[skip] == '\0' || buf[skip] == '#')
            continue;
        json_error_t je;
        json_t *line = json_loads(buf, 0, &je);
        if (!json_is_object(line)) {
            rc = fail(&r, "not a JSON object: %s", line ? "" : je.text);
        } else {
            rc = run_line(&r, line, out);
        }
        json_decref(line);
    }
    free(buf);
    json_decref(r.bindings);
    table_free(&r.seqs);
    table_free(&r.tickets);
    table_free(&r.logits);
    for (uint32_t i = 0; i < r.n_blobs; i++) {
        free(r.blobs[i].name);
        free(r.blobs[i].data);
    }
    free(r.blobs);
    return rc;
}

/* gguf_test.c - the GGUF reader on files built byte by byte here: a good file read back
 * (every metadata type, lookups, tensor views), then one broken file per refusal, each
 * asserting the status and the words of the error, and every truncation of a good file
 * refused without a crash. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/gguf.h"

/* ---- a GGUF image under construction ----------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

/* v little-endian in `bytes` bytes (zeros past the eighth). */
static void put_u(buf *b, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) {
        uint8_t c = i < 8 ? (uint8_t)(v >> (8 * i)) : 0;
        put(b, &c, 1);
    }
}

static void put_str(buf *b, const char *s)
{
    put_u(b, strlen(s), 8);
    put(b, s, strlen(s));
}

static void put_kv_u32(buf *b, const char *key, uint32_t v)
{
    put_str(b, key);
    put_u(b, DEVIO_GGUF_U32, 4);
    put_u(b, v, 4);
}

static void put_kv_str(buf *b, const char *key, const char *v)
{
    put_str(b, key);
    put_u(b, DEVIO_GGUF_STRING, 4);
    put_str(b, v);
}

typedef struct tinfo {
    const char *name;
    uint32_t ndim;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
} tinfo;

static void put_tensor(buf *b, const tinfo *t)
{
    put_str(b, t->name);
    put_u(b, t->ndim, 4);
    for (uint32_t d = 0; d < t->ndim; d++)
        put_u(b, d < 4 ? t->ne[d] : 1, 8);
    put_u(b, t->type, 4);
    put_u(b, t->offset, 8);
}

static void pad_to(buf *b, size_t align)
{
    while (b->n % align)
        put_u(b, 0, 1);
}

/* The good file: version 3, metadata of every type, an F32 [3, 2] tensor
 * and a Q8_0 [64, 2] one (4 blocks), data aligned to 32. */
static buf good_file(void)
{
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u(&b, 3, 4);
    put_u(&b, 2, 8);  /* tensors */
    put_u(&b, 10, 8); /* metadata entries */
    put_kv_str(&b, "general.architecture", "llama");
    put_kv_u32(&b, "llama.block_count", 30);
    put_str(&b, "llama.rope.freq_base");
    put_u(&b, DEVIO_GGUF_F32, 4);
    float theta = 100000.0f;
    put(&b, &theta, 4);
    put_str(&b, "x.f64");
    put_u(&b, DEVIO_GGUF_F64, 4);
    double half = 0.5;
    put(&b, &half, 8);
    put_str(&b, "x.bool");
    put_u(&b, DEVIO_GGUF_BOOL, 4);
    put_u(&b, 1, 1);
    put_str(&b, "x.i8.negative");
    put_u(&b, DEVIO_GGUF_I8, 4);
    put_u(&b, 0xff, 1);
    put_str(&b, "x.u64");
    put_u(&b, DEVIO_GGUF_U64, 4);
    put_u(&b, (uint64_t)1 << 40, 8);
    put_str(&b, "tokenizer.ggml.tokens");
    put_u(&b, DEVIO_GGUF_ARRAY, 4);
    put_u(&b, DEVIO_GGUF_STRING, 4);
    put_u(&b, 3, 8);
    put_str(&b, "a");
    put_str(&b, "bc");
    put_str(&b, "");
    put_str(&b, "x.nested");
    put_u(&b, DEVIO_GGUF_ARRAY, 4);
    put_u(&b, DEVIO_GGUF_ARRAY, 4);
    put_u(&b, 2, 8);
    for (int i = 0; i < 2; i++) {
        put_u(&b, DEVIO_GGUF_I16, 4);
        put_u(&b, 2, 8);
        put_u(&b, 7, 2);
        put_u(&b, 9, 2);
    }
    put_kv_u32(&b, "general.alignment", 32);
    tinfo f32 = {"blk.0.attn_norm.weight", 2, {3, 2}, DEVIO_GGML_F32, 0};
    tinfo q8 = {"token_embd.weight", 2, {64, 2}, DEVIO_GGML_Q8_0, 32};
    put_tensor(&b, &f32);
    put_tensor(&b, &q8);
    pad_to(&b, 32);
    for (int i = 0; i < 6; i++) {
        float v = (float)i + 0.25f;
        put(&b, &v, 4);
    }
    pad_to(&b, 32);
    for (int i = 0; i < 4 * 34; i++)
        put_u(&b, (uint64_t)i, 1);
    return b;
}

static devio_status parse(const buf *b, devio_gguf_file **f, devio_error *err)
{
    return devio_gguf_parse(b->p, b->n, "m.gguf", f, err);
}

static void test_good_file(void **state)
{
    (void)state;
    buf b = good_file();
    devio_gguf_file *f = NULL;
    devio_error err = {0};
    assert_int_equal(parse(&b, &f, &err), DEVIO_OK);
    assert_int_equal(devio_gguf_version(f), 3);
    assert_int_equal(devio_gguf_kv_count(f), 10);
    uint64_t len = 0;
    const char *arch = devio_gguf_get_str(f, "general.architecture", &len);
    assert_int_equal(len, 5);
    assert_memory_equal(arch, "llama", 5);
    uint32_t u;
    assert_true(devio_gguf_get_u32(f, "llama.block_count", &u));
    assert_int_equal(u, 30);
    float x;
    assert_true(devio_gguf_get_f32(f, "llama.rope.freq_base", &x));
    assert_true(x == 100000.0f);
    assert_true(devio_gguf_get_f32(f, "x.f64", &x));
    assert_true(x == 0.5f);
    assert_true(devio_gguf_get_f32(f, "llama.block_count", &x)); /* an integer, exactly */
    assert_true(x == 30.0f);
    bool flag = false;
    assert_true(devio_gguf_get_bool(f, "x.bool", &flag));
    assert_true(flag);
    assert_false(devio_gguf_get_u32(f, "x.i8.negative", &u));
    assert_false(devio_gguf_get_u32(f, "x.u64", &u)); /* out of range */
    uint64_t big;
    assert_true(devio_gguf_get_u64(f, "x.u64", &big));
    assert_true(big == (uint64_t)1 << 40);
    assert_null(devio_gguf_get_str(f, "llama.block_count", &len));
    assert_false(devio_gguf_get_u32(f, "no.such.key", &u));
    const devio_gguf_kv *toks = devio_gguf_find_kv(f, "tokenizer.ggml.tokens");
    assert_non_null(toks);
    assert_int_equal(toks->type, DEVIO_GGUF_ARRAY);
    assert_int_equal(toks->elem_type, DEVIO_GGUF_STRING);
    assert_int_equal(toks->n, 3);

    assert_int_equal(devio_gguf_tensor_count(f), 2);
    const devio_gguf_tensor *n = devio_gguf_find_tensor(f, "blk.0.attn_norm.weight");
    const devio_gguf_tensor *e = devio_gguf_find_tensor(f, "token_embd.weight");
    assert_non_null(n);
    assert_non_null(e);
    assert_null(devio_gguf_find_tensor(f, "output.weight"));
    assert_int_equal(n->nbytes, 24);
    assert_int_equal(e->nbytes, 4 * 34);
    assert_int_equal(e->ne[0], 64);
    assert_int_equal(e->ne[1], 2);
    float v;
    memcpy(&v, n->data + 5 * 4, 4);
    assert_true(v == 5.25f);
    assert_int_equal(e->data[1], 1);
    assert_int_equal((size_t)(e->data - n->data), 32);
    assert_string_equal(devio_gguf_type_name(DEVIO_GGML_Q4_K), "Q4_K");
    assert_int_equal(devio_gguf_type_bytes(DEVIO_GGML_Q6_K), 210);
    assert_int_equal(devio_gguf_type_block(DEVIO_GGML_Q6_K), 256);
    assert_string_equal(devio_gguf_type_name(99), "?");
    devio_gguf_close(f);
    free(b.p);
}

/* From a file on disk, as the loader opens it. */
static void test_open_file(void **state)
{
    (void)state;
    buf b = good_file();
    char path[] = "/tmp/devio-gguf-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    devio_gguf_file *f = NULL;
    devio_error err = {0};
    assert_int_equal(devio_gguf_open(path, "m.gguf", &f, &err), DEVIO_OK);
    assert_non_null(devio_gguf_find_tensor(f, "token_embd.weight"));
    devio_gguf_close(f);
    unlink(path);
    assert_int_equal(devio_gguf_open(path, "gone.gguf", &f, &err), DEVIO_E_MODEL);
    assert_null(f);
    assert_non_null(strstr(err.message, "gone.gguf: cannot open"));
    free(b.p);
}

/* Every prefix of the good file is refused, and none crashes. */
static void test_every_truncation(void **state)
{
    (void)state;
    buf b = good_file();
    for (size_t n = 0; n < b.n; n++) {
        devio_gguf_file *f = NULL;
        devio_error err = {0};
        devio_status s = devio_gguf_parse(b.p, n, "m.gguf", &f, &err);
        if (s == DEVIO_OK)
            fail_msg("a file cut to %zu of %zu bytes was accepted", n, b.n);
        assert_int_equal(s, DEVIO_E_MODEL);
        assert_null(f);
        assert_non_null(strstr(err.message, "m.gguf: "));
    }
    free(b.p);
}

/* ---- one broken file per refusal ---------------------------------------- */

/* A file with the given tensors (each F32 unless said), alignment 32, and
 * data_bytes of data. */
static buf with_tensors(const tinfo *t, int n, size_t data_bytes)
{
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u(&b, 3, 4);
    put_u(&b, (uint64_t)n, 8);
    put_u(&b, 1, 8);
    put_kv_str(&b, "general.architecture", "llama");
    for (int i = 0; i < n; i++)
        put_tensor(&b, &t[i]);
    pad_to(&b, 32);
    for (size_t i = 0; i < data_bytes; i++)
        put_u(&b, 0, 1);
    return b;
}

static void expect_refused(buf *b, const char *words)
{
    devio_gguf_file *f = NULL;
    devio_error err = {0};
    assert_int_equal(parse(b, &f, &err), DEVIO_E_MODEL);
    assert_null(f);
    if (!strstr(err.message, words))
        fail_msg("error '%s' lacks '%s'", err.message, words);
    free(b->p);
}

static void test_bad_magic_and_version(void **state)
{
    (void)state;
    buf b = good_file();
    b.p[0] = 'X';
    expect_refused(&b, "m.gguf: not a GGUF file");
    b = good_file();
    b.p[4] = 1;
    expect_refused(&b, "GGUF version 1; devio reads 2 and 3");
}

static void test_bad_counts(void **state)
{
    (void)state;
    buf b = good_file();
    for (int i = 0; i < 8; i++)
        b.p[16 + i] = 0xff; /* metadata count */
    expect_refused(&b, "more than the file's");
    b = good_file();
    for (int i = 0; i < 8; i++)
        b.p[8 + i] = 0x7f; /* tensor count */
    expect_refused(&b, "more than the file's");
}

static void test_bad_tensor_type(void **state)
{
    (void)state;
    tinfo t = {"blk.0.ffn_up.weight", 2, {32, 2}, 77, 0};
    buf b = with_tensors(&t, 1, 256);
    expect_refused(&b, "tensor 'blk.0.ffn_up.weight' has type 77, which devio does not know");
}

static void test_bad_tensor_past_end(void **state)
{
    (void)state;
    tinfo t = {"output.weight", 2, {4, 4}, DEVIO_GGML_F32, 0};
    buf b = with_tensors(&t, 1, 60);
    expect_refused(&b, "tensor 'output.weight' (64 bytes at offset 0) runs past the end of the "
                       "data section (60 bytes)");
    t.offset = (uint64_t)1 << 62; /* an offset far past the end, aligned */
    b = with_tensors(&t, 1, 64);
    expect_refused(&b, "tensor 'output.weight' (64 bytes at offset 4611686018427387904) runs past");
}

static void test_bad_misaligned(void **state)
{
    (void)state;
    tinfo t = {"output_norm.weight", 1, {4}, DEVIO_GGML_F32, 4};
    buf b = with_tensors(&t, 1, 64);
    expect_refused(&b, "tensor 'output_norm.weight' starts at offset 4, not a multiple of the "
                       "alignment 32");
}

static void test_bad_overlap_and_duplicate(void **state)
{
    (void)state;
    tinfo t[2] = {{"a.weight", 1, {16}, DEVIO_GGML_F32, 0}, {"b.weight", 1, {8}, DEVIO_GGML_F32, 32}};
    buf b = with_tensors(t, 2, 96);
    expect_refused(&b, "tensors 'a.weight' and 'b.weight' overlap");
    tinfo d[2] = {{"a.weight", 1, {8}, DEVIO_GGML_F32, 0}, {"a.weight", 1, {8}, DEVIO_GGML_F32, 32}};
    b = with_tensors(d, 2, 96);
    expect_refused(&b, "tensor 'a.weight' appears twice");
}

static void test_bad_shapes(void **state)
{
    (void)state;
    tinfo t = {"x.weight", 2, {8, 0}, DEVIO_GGML_F32, 0};
    buf b = with_tensors(&t, 1, 64);
    expect_refused(&b, "tensor 'x.weight' has dimension 1 of size 0");
    tinfo o = {"x.weight", 4, {1u << 20, 1u << 20, 1u << 20, 1u << 20}, DEVIO_GGML_F32, 0};
    b = with_tensors(&o, 1, 64);
    expect_refused(&b, "tensor 'x.weight': its element count overflows");
    tinfo by = {"x.weight", 2, {(uint64_t)1 << 62, 2}, DEVIO_GGML_F32, 0};
    b = with_tensors(&by, 1, 64);
    expect_refused(&b, "tensor 'x.weight': its byte count overflows");
    tinfo blk = {"x.weight", 2, {48, 2}, DEVIO_GGML_Q4_K, 0};
    b = with_tensors(&blk, 1, 1024);
    expect_refused(&b, "tensor 'x.weight': rows of 48 are not whole Q4_K blocks of 256");
    tinfo dims = {"x.weight", 5, {1, 1, 1, 1}, DEVIO_GGML_F32, 0};
    b = with_tensors(&dims, 1, 64);
    expect_refused(&b, "tensor 'x.weight' has 5 dimensions, not 1 to 4");
}

static void test_bad_metadata(void **state)
{
    (void)state;
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u(&b, 3, 4);
    put_u(&b, 0, 8);
    put_u(&b, 2, 8);
    put_kv_u32(&b, "llama.block_count", 1);
    put_kv_u32(&b, "llama.block_count", 2);
    expect_refused(&b, "metadata key 'llama.block_count' appears twice");

    b = (buf){0};
    put(&b, "GGUF", 4);
    put_u(&b, 3, 4);
    put_u(&b, 0, 8);
    put_u(&b, 1, 8);
    put_str(&b, "x.odd");
    put_u(&b, 13, 4);
    put_u(&b, 0, 8);
    expect_refused(&b, "'x.odd' has value type 13, unknown");

    b = (buf){0};
    put(&b, "GGUF", 4);
    put_u(&b, 3, 4);
    put_u(&b, 0, 8);
    put_u(&b, 1, 8);
    put_str(&b, "x.deep");
    put_u(&b, DEVIO_GGUF_ARRAY, 4);
    for (int i = 0; i < 6; i++) { /* an array of one array of one array ... */
        put_u(&b, DEVIO_GGUF_ARRAY, 4);
        put_u(&b, 1, 8);
    }
    put_u(&b, 0, 32);
    expect_refused(&b, "'x.deep' nests arrays deeper than 4");

    b = (buf){0};
    put(&b, "GGUF", 4);
    put_u(&b, 3, 4);
    put_u(&b, 0, 8);
    put_u(&b, 1, 8);
    put_kv_u32(&b, "general.alignment", 24);
    expect_refused(&b, "general.alignment must be a power of two");

    b = (buf){0};
    put(&b, "GGUF", 4);
    put_u(&b, 3, 4);
    put_u(&b, 0, 8);
    put_u(&b, 1, 8);
    put_u(&b, 3, 8);
    put(&b, "a\0b", 3);
    put_u(&b, DEVIO_GGUF_U8, 4);
    put_u(&b, 0, 1);
    expect_refused(&b, "a metadata key holds a NUL byte");

    b = (buf){0};
    put(&b, "GGUF", 4);
    put_u(&b, 3, 4);
    put_u(&b, 0, 8);
    put_u(&b, 1, 8);
    put_str(&b, "x.arr");
    put_u(&b, DEVIO_GGUF_ARRAY, 4);
    put_u(&b, DEVIO_GGUF_U32, 4);
    put_u(&b, (uint64_t)1 << 62, 8);
    put_u(&b, 0, 16);
    expect_refused(&b, "truncated: the value of 'x.arr' runs past the end of the file");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_bad_magic_and_version),
        cmocka_unit_test(test_bad_counts),
        cmocka_unit_test(test_bad_tensor_type),
        cmocka_unit_test(test_bad_tensor_past_end),
        cmocka_unit_test(test_bad_misaligned),
        cmocka_unit_test(test_bad_overlap_and_duplicate),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_bad_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

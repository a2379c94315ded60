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

#include "device/model/gguf.h"
#include "tests/gguf_fixture.h"

/* The good file: version 3, metadata of every type, an F32 [3, 2] tensor
 * and a Q8_0 [64, 2] one (4 blocks), data aligned to 32. */
static gbuf good_file(void)
{
    gbuf b = {0};
    gb_put(&b, "GGUF", 4);
    gb_u(&b, 3, 4);
    gb_u(&b, 2, 8);  /* tensors */
    gb_u(&b, 10, 8); /* metadata entries */
    gb_kv_str(&b, "general.architecture", "llama");
    gb_kv_u32(&b, "llama.block_count", 30);
    gb_str(&b, "llama.rope.freq_base");
    gb_u(&b, DEVIO_GGUF_F32, 4);
    float theta = 100000.0f;
    gb_put(&b, &theta, 4);
    gb_str(&b, "x.f64");
    gb_u(&b, DEVIO_GGUF_F64, 4);
    double half = 0.5;
    gb_put(&b, &half, 8);
    gb_str(&b, "x.bool");
    gb_u(&b, DEVIO_GGUF_BOOL, 4);
    gb_u(&b, 1, 1);
    gb_str(&b, "x.i8.negative");
    gb_u(&b, DEVIO_GGUF_I8, 4);
    gb_u(&b, 0xff, 1);
    gb_str(&b, "x.u64");
    gb_u(&b, DEVIO_GGUF_U64, 4);
    gb_u(&b, (uint64_t)1 << 40, 8);
    gb_str(&b, "tokenizer.ggml.tokens");
    gb_u(&b, DEVIO_GGUF_ARRAY, 4);
    gb_u(&b, DEVIO_GGUF_STRING, 4);
    gb_u(&b, 3, 8);
    gb_str(&b, "a");
    gb_str(&b, "bc");
    gb_str(&b, "");
    gb_str(&b, "x.nested");
    gb_u(&b, DEVIO_GGUF_ARRAY, 4);
    gb_u(&b, DEVIO_GGUF_ARRAY, 4);
    gb_u(&b, 2, 8);
    for (int i = 0; i < 2; i++) {
        gb_u(&b, DEVIO_GGUF_I16, 4);
        gb_u(&b, 2, 8);
        gb_u(&b, 7, 2);
        gb_u(&b, 9, 2);
    }
    gb_kv_u32(&b, "general.alignment", 32);
    gtinfo f32 = {"blk.0.attn_norm.weight", 2, {3, 2}, DEVIO_GGML_F32, 0};
    gtinfo q8 = {"token_embd.weight", 2, {64, 2}, DEVIO_GGML_Q8_0, 32};
    gb_tensor(&b, &f32);
    gb_tensor(&b, &q8);
    gb_pad(&b, 32);
    for (int i = 0; i < 6; i++) {
        float v = (float)i + 0.25f;
        gb_put(&b, &v, 4);
    }
    gb_pad(&b, 32);
    for (int i = 0; i < 4 * 34; i++)
        gb_u(&b, (uint64_t)i, 1);
    return b;
}

static devio_status parse(const gbuf *b, devio_gguf_file **f, devio_error *err)
{
    return devio_gguf_parse(b->p, b->n, "m.gguf", f, err);
}

static void test_good_file(void **state)
{
    (void)state;
    gbuf b = good_file();
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
    for (size_t i = 0; i < 2; i++) /* the place in file order, as the loader marks use */
        assert_int_equal(devio_gguf_tensor_index(f, devio_gguf_tensor_at(f, i)), i);
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
    gbuf b = good_file();
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
    gbuf b = good_file();
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
static gbuf with_tensors(const gtinfo *t, int n, size_t data_bytes)
{
    gbuf b = {0};
    gb_put(&b, "GGUF", 4);
    gb_u(&b, 3, 4);
    gb_u(&b, (uint64_t)n, 8);
    gb_u(&b, 1, 8);
    gb_kv_str(&b, "general.architecture", "llama");
    for (int i = 0; i < n; i++)
        gb_tensor(&b, &t[i]);
    gb_pad(&b, 32);
    for (size_t i = 0; i < data_bytes; i++)
        gb_u(&b, 0, 1);
    return b;
}

static void expect_refused(gbuf *b, const char *words)
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
    gbuf b = good_file();
    b.p[0] = 'X';
    expect_refused(&b, "m.gguf: not a GGUF file");
    b = good_file();
    b.p[4] = 1;
    expect_refused(&b, "GGUF version 1; devio reads 2 and 3");
}

static void test_bad_counts(void **state)
{
    (void)state;
    gbuf b = good_file();
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
    gtinfo t = {"blk.0.ffn_up.weight", 2, {32, 2}, 77, 0};
    gbuf b = with_tensors(&t, 1, 256);
    expect_refused(&b, "tensor 'blk.0.ffn_up.weight' has type 77, which devio does not know");
}

static void test_bad_tensor_past_end(void **state)
{
    (void)state;
    gtinfo t = {"output.weight", 2, {4, 4}, DEVIO_GGML_F32, 0};
    gbuf b = with_tensors(&t, 1, 60);
    expect_refused(&b, "tensor 'output.weight' (64 bytes at offset 0) runs past the end of the "
                       "data section (60 bytes)");
    t.offset = (uint64_t)1 << 62; /* an offset far past the end, aligned */
    b = with_tensors(&t, 1, 64);
    expect_refused(&b, "tensor 'output.weight' (64 bytes at offset 4611686018427387904) runs past");
}

static void test_bad_misaligned(void **state)
{
    (void)state;
    gtinfo t = {"output_norm.weight", 1, {4}, DEVIO_GGML_F32, 4};
    gbuf b = with_tensors(&t, 1, 64);
    expect_refused(&b, "tensor 'output_norm.weight' starts at offset 4, not a multiple of the "
                       "alignment 32");
}

static void test_bad_overlap_and_duplicate(void **state)
{
    (void)state;
    gtinfo t[2] = {{"a.weight", 1, {16}, DEVIO_GGML_F32, 0}, {"b.weight", 1, {8}, DEVIO_GGML_F32, 32}};
    gbuf b = with_tensors(t, 2, 96);
    expect_refused(&b, "tensors 'a.weight' and 'b.weight' overlap");
    gtinfo d[2] = {{"a.weight", 1, {8}, DEVIO_GGML_F32, 0}, {"a.weight", 1, {8}, DEVIO_GGML_F32, 32}};
    b = with_tensors(d, 2, 96);
    expect_refused(&b, "tensor 'a.weight' appears twice");
}

static void test_bad_shapes(void **state)
{
    (void)state;
    gtinfo t = {"x.weight", 2, {8, 0}, DEVIO_GGML_F32, 0};
    gbuf b = with_tensors(&t, 1, 64);
    expect_refused(&b, "tensor 'x.weight' has dimension 1 of size 0");
    gtinfo o = {"x.weight", 4, {1u << 20, 1u << 20, 1u << 20, 1u << 20}, DEVIO_GGML_F32, 0};
    b = with_tensors(&o, 1, 64);
    expect_refused(&b, "tensor 'x.weight': its element count overflows");
    gtinfo by = {"x.weight", 2, {(uint64_t)1 << 62, 2}, DEVIO_GGML_F32, 0};
    b = with_tensors(&by, 1, 64);
    expect_refused(&b, "tensor 'x.weight': its byte count overflows");
    gtinfo blk = {"x.weight", 2, {48, 2}, DEVIO_GGML_Q4_K, 0};
    b = with_tensors(&blk, 1, 1024);
    expect_refused(&b, "tensor 'x.weight': rows of 48 are not whole Q4_K blocks of 256");
    gtinfo dims = {"x.weight", 5, {1, 1, 1, 1}, DEVIO_GGML_F32, 0};
    b = with_tensors(&dims, 1, 64);
    expect_refused(&b, "tensor 'x.weight' has 5 dimensions, not 1 to 4");
}

static void test_bad_metadata(void **state)
{
    (void)state;
    gbuf b = {0};
    gb_put(&b, "GGUF", 4);
    gb_u(&b, 3, 4);
    gb_u(&b, 0, 8);
    gb_u(&b, 2, 8);
    gb_kv_u32(&b, "llama.block_count", 1);
    gb_kv_u32(&b, "llama.block_count", 2);
    expect_refused(&b, "metadata key 'llama.block_count' appears twice");

    b = (gbuf){0};
    gb_put(&b, "GGUF", 4);
    gb_u(&b, 3, 4);
    gb_u(&b, 0, 8);
    gb_u(&b, 1, 8);
    gb_str(&b, "x.odd");
    gb_u(&b, 13, 4);
    gb_u(&b, 0, 8);
    expect_refused(&b, "'x.odd' has value type 13, unknown");

    b = (gbuf){0};
    gb_put(&b, "GGUF", 4);
    gb_u(&b, 3, 4);
    gb_u(&b, 0, 8);
    gb_u(&b, 1, 8);
    gb_str(&b, "x.deep");
    gb_u(&b, DEVIO_GGUF_ARRAY, 4);
    for (int i = 0; i < 6; i++) { /* an array of one array of one array ... */
        gb_u(&b, DEVIO_GGUF_ARRAY, 4);
        gb_u(&b, 1, 8);
    }
    gb_u(&b, 0, 32);
    expect_refused(&b, "'x.deep' nests arrays deeper than 4");

    b = (gbuf){0};
    gb_put(&b, "GGUF", 4);
    gb_u(&b, 3, 4);
    gb_u(&b, 0, 8);
    gb_u(&b, 1, 8);
    gb_kv_u32(&b, "general.alignment", 24);
    expect_refused(&b, "general.alignment must be a power of two");

    b = (gbuf){0};
    gb_put(&b, "GGUF", 4);
    gb_u(&b, 3, 4);
    gb_u(&b, 0, 8);
    gb_u(&b, 1, 8);
    gb_u(&b, 3, 8);
    gb_put(&b, "a\0b", 3);
    gb_u(&b, DEVIO_GGUF_U8, 4);
    gb_u(&b, 0, 1);
    expect_refused(&b, "a metadata key holds a NUL byte");

    b = (gbuf){0};
    gb_put(&b, "GGUF", 4);
    gb_u(&b, 3, 4);
    gb_u(&b, 0, 8);
    gb_u(&b, 1, 8);
    gb_str(&b, "x.arr");
    gb_u(&b, DEVIO_GGUF_ARRAY, 4);
    gb_u(&b, DEVIO_GGUF_U32, 4);
    gb_u(&b, (uint64_t)1 << 62, 8);
    gb_u(&b, 0, 16);
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

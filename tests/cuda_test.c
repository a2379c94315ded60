/* cuda_test.c - the CUDA backend (kernels/). Without a GPU: the plugin loads through the
 * registry and passes its checks, its probe and create refuse with the CUDA runtime's reason,
 * `auto` falls back to the reference and says why, CUDA errors read as devio errors. With a
 * GPU: strict numerics give the reference's bits for every logit and sample (prompts, chunks,
 * decode, batches, LoRA, copy-on-write forks, f32 and bf16 weights), at depth 1 and 2.
 * Cases that need a GPU are skipped, visibly, where none answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/registry.h"
#include "kernels/cuda_backend.h"
#include "ref/builtin.h"
#include "ref/ref_backend.h"
#include "tests/testutil.h"

/* Where Bazel puts //kernels:libdevio-backend-cuda.so in this test's runfiles. */
#define PLUGIN_DIR "kernels"

static bool have_gpu(void)
{
    return devio_backend_probe(&devio_cuda_backend, NULL) == DEVIO_OK;
}

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (!have_gpu()) {                                                                         \
            print_message("cuda_test: no CUDA device answers; this case needs one\n");            \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* ---- without a GPU --------------------------------------------------------- */

static void test_error_text(void **state)
{
    (void)state;
    devio_error err = {0};
    assert_int_equal(devio_cuda_error(2, "q_proj", &err), DEVIO_E_DEVICE);
    assert_string_equal(err.message, "CUDA error in q_proj: cudaErrorMemoryAllocation: out of memory");
    assert_int_equal(err.status, DEVIO_E_DEVICE);
    assert_int_equal(devio_cuda_error(700, "the step", &err), DEVIO_E_DEVICE);
    assert_non_null(strstr(err.message, "cudaErrorIllegalAddress"));
    assert_int_equal(devio_cuda_error(2, "x", NULL), DEVIO_E_DEVICE);
}

static void test_plugin_loads(void **state)
{
    (void)state;
    devio_registry r;
    devio_registry_builtin(&r, PLUGIN_DIR);
    const devio_backend_ops *ops = NULL;
    devio_error err = {0};
    assert_int_equal(devio_registry_find(&r, "cuda", &ops, &err), DEVIO_OK);
    assert_string_equal(ops->name, "cuda");
    assert_int_equal(ops->abi, DEVIO_BACKEND_ABI);
    assert_int_equal(devio_backend_check(ops, &err), DEVIO_OK);
    assert_true(devio_backend_has_adapters(ops));
    assert_non_null(ops->probe);
    assert_non_null(ops->kv_blocks_fit);
    assert_int_equal(r.n_handles, 1);
    /* auto: the plugin when a device answers, else the reference with the reason. */
    assert_int_equal(devio_registry_find(&r, "auto", &ops, &err), DEVIO_OK);
    if (have_gpu()) {
        assert_string_equal(ops->name, "cuda");
    } else {
        assert_ptr_equal(ops, &devio_ref_backend);
        assert_non_null(strstr(r.note, "cuda: no CUDA device"));
    }
    devio_registry_close(&r);
}

static void test_no_device(void **state)
{
    (void)state;
    if (have_gpu())
        skip(); /* only meaningful without one */
    devio_error err = {0};
    assert_int_equal(devio_backend_probe(&devio_cuda_backend, &err), DEVIO_E_UNSUPPORTED);
    assert_non_null(strstr(err.message, "no CUDA device"));
    devio_fixture fx;
    assert_int_equal(devio_fixture_preset(&fx, "tiny", DEVIO_F32, 3), 0);
    devio_device *d = (devio_device *)1;
    devio_config cfg = devio_config_default();
    cfg.threads = 1;
    assert_int_equal(devio_open(fx.model, &devio_cuda_backend, &cfg, &d, &err),
                     DEVIO_E_UNSUPPORTED);
    assert_null(d);
    assert_non_null(strstr(err.message, "no CUDA device"));
    /* Without a device the backend cannot size the pool: the core's default stands. */
    assert_int_equal(devio_backend_kv_blocks_fit(&devio_cuda_backend, fx.model, NULL), 0);
    devio_fixture_free(&fx);
}

static void test_fast_refused(void **state)
{
    (void)state;
    devio_fixture fx;
    assert_int_equal(devio_fixture_preset(&fx, "tiny", DEVIO_F32, 3), 0);
    devio_device *d = NULL;
    devio_error err = {0};
    devio_config cfg = devio_config_default();
    cfg.numerics = DEVIO_NUMERICS_FAST;
    assert_int_equal(devio_open(fx.model, &devio_cuda_backend, &cfg, &d, &err),
                     DEVIO_E_UNSUPPORTED);
    assert_non_null(strstr(err.message, "strict numerics only"));
    devio_fixture_free(&fx);
}

/* ---- with a GPU: the reference's bits ------------------------------------- */

typedef struct run_out {
    float *logits; /* [n, vocab] */
    int32_t *tokens;
    float *logprobs;
    uint32_t n;
} run_out;

static devio_device *open_dev(const devio_fixture *fx, const devio_backend_ops *ops,
                              uint32_t depth, const char *adapters)
{
    devio_config cfg = devio_config_default();
    cfg.kv_blocks = 256;
    cfg.block_size = 4;
    cfg.max_seq_len = 256;
    cfg.max_depth = depth;
    cfg.threads = 1;
    cfg.max_loras = 2;
    cfg.adapters_root = adapters;
    devio_device *d = NULL;
    devio_error err = {0};
    devio_status s = devio_open(fx->model, ops, &cfg, &d, &err);
    if (s != DEVIO_OK)
        fail_msg("open %s: %s", ops->name, err.message);
    if (adapters) {
        devio_lora_cmd cmd = {.kind = DEVIO_LORA_LOAD, .name = "a", .path = "a0"};
        devio_lora_ack ack;
        assert_int_equal(devio_lora(d, &cmd, &ack, &err), DEVIO_OK);
        devio_lora_ack_free(&ack);
    }
    return d;
}

/* A fixed workload: three sequences (one with an adapter when given), a
 * 37-token prompt split 20 + 17, a 5-token prompt, a fork of the first,
 * then 6 decode steps of all of them in one plan each; every step's rows
 * ask for all logits or the last and a sampled token. With depth 2 two
 * launches are in flight before the first await. */
static run_out workload(const devio_fixture *fx, const devio_backend_ops *ops, uint32_t depth,
                        const char *adapters)
{
    devio_device *d = open_dev(fx, ops, depth, adapters);
    uint32_t V = fx->model->cfg.vocab_size;
    run_out out = {.logits = calloc(64 * (size_t)V, sizeof(float)),
                   .tokens = calloc(64, sizeof(int32_t)), .logprobs = calloc(64, sizeof(float))};
    assert_non_null(out.logits);
    uint64_t s[4];
    for (int i = 0; i < 3; i++)
        assert_int_equal(devio_seq_create(d, &s[i], NULL), DEVIO_OK);
    int32_t prompt[37];
    for (uint32_t i = 0; i < 37; i++)
        prompt[i] = (int32_t)((i * 131u + 7u) % V);
    devio_sample_params sp = {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .seed = 11};
    struct {
        uint64_t seq;
        const int32_t *tok;
        uint32_t n;
        const char *adapter;
        devio_logits_mode mode;
    } steps[][3] = {
        {{s[0], prompt, 20, NULL, DEVIO_LOGITS_ALL}, {s[1], prompt + 3, 5, "a", DEVIO_LOGITS_LAST}},
        {{s[0], prompt + 20, 17, NULL, DEVIO_LOGITS_LAST}, {s[2], prompt + 9, 2, NULL, DEVIO_LOGITS_ALL}},
    };
    uint64_t pending[2];
    uint32_t n_pending = 0, pending_k[2];
    for (uint32_t k = 0; k < 2; k++) {
        devio_row rows[3];
        uint32_t nr = 0;
        for (uint32_t r = 0; r < 2; r++)
            rows[nr++] = (devio_row){.seq = steps[k][r].seq, .tokens = steps[k][r].tok,
                                     .n_tokens = steps[k][r].n, .logits = steps[k][r].mode,
                                     .adapter = adapters ? steps[k][r].adapter : NULL,
                                     .has_sample = true, .sample = sp};
        devio_plan plan = {.rows = rows, .n_rows = nr};
        devio_error err = {0};
        pending_k[n_pending] = k;
        if (devio_launch(d, &plan, &pending[n_pending++], &err) != DEVIO_OK)
            fail_msg("launch: %s", err.message);
        if (n_pending < depth && k == 0)
            continue;
        for (uint32_t i = 0; i < n_pending; i++) {
            devio_step_result res;
            assert_int_equal(devio_await(d, pending[i], -1, &res, &err), DEVIO_OK);
            for (uint32_t r = 0; r < res.n_rows; r++) {
                uint32_t kk = pending_k[i];
                uint32_t nl = steps[kk][r].mode == DEVIO_LOGITS_ALL ? steps[kk][r].n : 1;
                assert_true(out.n + nl <= 64);
                assert_int_equal(devio_logits_read(d, res.rows[r].logits, 0, nl,
                                                   out.logits + (size_t)out.n * V, NULL, &err),
                                 DEVIO_OK);
                out.n += nl;
                out.tokens[out.n - 1] = res.rows[r].token;
                out.logprobs[out.n - 1] = res.rows[r].logprob;
                devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = res.rows[r].logits};
                devio_outcome eo;
                assert_int_equal(devio_apply(d, &rel, &eo, NULL), DEVIO_OK);
                devio_outcome_free(&eo);
            }
            devio_step_result_free(&res);
        }
        n_pending = 0;
    }
    /* A fork shares s0's blocks; its first decode copies the partial block. */
    devio_effect fork = {.kind = DEVIO_EFFECT_FORK, .seq = s[0]};
    devio_outcome fo;
    assert_int_equal(devio_apply(d, &fork, &fo, NULL), DEVIO_OK);
    s[3] = fo.seq;
    devio_outcome_free(&fo);
    for (uint32_t step = 0; step < 6; step++) {
        devio_row rows[4];
        int32_t tok[4];
        for (uint32_t r = 0; r < 4; r++) {
            tok[r] = (int32_t)((step * 17u + r * 5u + 3u) % V);
            rows[r] = (devio_row){.seq = s[r], .tokens = &tok[r], .n_tokens = 1,
                                  .logits = DEVIO_LOGITS_LAST,
                                  .adapter = adapters && r == 1 ? "a" : NULL,
                                  .has_sample = true, .sample = sp};
        }
        devio_plan plan = {.rows = rows, .n_rows = 4};
        uint64_t t;
        devio_error err = {0};
        devio_step_result res;
        assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
        assert_int_equal(devio_await(d, t, -1, &res, &err), DEVIO_OK);
        for (uint32_t r = 0; r < res.n_rows; r++) {
            assert_true(out.n < 64);
            assert_int_equal(devio_logits_read(d, res.rows[r].logits, 0, 1,
                                               out.logits + (size_t)out.n * V, NULL, &err),
                             DEVIO_OK);
            out.tokens[out.n] = res.rows[r].token;
            out.logprobs[out.n++] = res.rows[r].logprob;
            devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = res.rows[r].logits};
            devio_outcome eo;
            assert_int_equal(devio_apply(d, &rel, &eo, NULL), DEVIO_OK);
            devio_outcome_free(&eo);
        }
        devio_step_result_free(&res);
    }
    devio_teardown(d, NULL);
    return out;
}

static void compare_runs(const devio_fixture *fx, const char *adapters)
{
    uint32_t V = fx->model->cfg.vocab_size;
    run_out want = workload(fx, &devio_ref_backend, 1, adapters);
    for (uint32_t depth = 1; depth <= 2; depth++) {
        run_out got = workload(fx, &devio_cuda_backend, depth, adapters);
        assert_int_equal(got.n, want.n);
        for (uint32_t i = 0; i < want.n; i++)
            for (uint32_t v = 0; v < V; v++) {
                float a = want.logits[(size_t)i * V + v], b = got.logits[(size_t)i * V + v];
                if (memcmp(&a, &b, sizeof a) != 0)
                    fail_msg("depth %u, logits row %u, token %u: reference %.9g, cuda %.9g", depth,
                             i, v, (double)a, (double)b);
            }
        assert_memory_equal(got.tokens, want.tokens, want.n * sizeof(int32_t));
        assert_memory_equal(got.logprobs, want.logprobs, want.n * sizeof(float));
        free(got.logits);
        free(got.tokens);
        free(got.logprobs);
    }
    free(want.logits);
    free(want.tokens);
    free(want.logprobs);
}

static void strict_case(devio_dtype dtype, bool lora)
{
    NEED_GPU();
    devio_fixture fx;
    assert_int_equal(devio_fixture_preset(&fx, "tiny", dtype, 5), 0);
    char adapters[300];
    snprintf(adapters, sizeof adapters, "%s/adapters", fx.dir);
    if (lora) {
        devio_mkmodel_adapter_opts o = devio_mkmodel_adapter_opts_default();
        char out[400];
        snprintf(out, sizeof out, "%s/a0", adapters);
        o.model_dir = fx.dir;
        o.out_dir = out;
        o.rank = 8;
        o.seed = 2;
        assert_int_equal(devio_mkmodel_write_adapter(&o, NULL), DEVIO_OK);
    }
    compare_runs(&fx, lora ? adapters : NULL);
    devio_fixture_free(&fx);
}

static void test_strict_f32(void **state) { (void)state; strict_case(DEVIO_F32, false); }
static void test_strict_bf16(void **state) { (void)state; strict_case(DEVIO_BF16, false); }
static void test_strict_f16_lora(void **state) { (void)state; strict_case(DEVIO_F16, true); }

static void test_device_info(void **state)
{
    (void)state;
    NEED_GPU();
    devio_fixture fx;
    assert_int_equal(devio_fixture_preset(&fx, "tiny", DEVIO_F32, 3), 0);
    devio_config cfg = devio_config_default();
    cfg.threads = 1;
    devio_device *d = NULL;
    devio_error err = {0};
    assert_int_equal(devio_open(fx.model, &devio_cuda_backend, &cfg, &d, &err), DEVIO_OK);
    devio_device_info info;
    devio_device_info_get(d, &info);
    assert_string_equal(info.backend, "cuda");
    assert_true(info.memory_total > 0 && info.memory_used > 0);
    assert_true(info.compute_capability[0] && info.driver[0] && info.runtime[0]);
    assert_string_equal(info.failure, "");
    /* --kv-blocks 0: the pool is what fits, up to what max_seqs sequences need. */
    uint32_t per_seq = (devio_config_of(d)->max_seq_len + 15) / 16;
    assert_int_equal(devio_facts_get(d).blocks_total, devio_config_of(d)->max_seqs * per_seq);
    print_message("cuda_test: %s, compute capability %s, driver %s, runtime %s\n", info.device,
                  info.compute_capability, info.driver, info.runtime);
    devio_teardown(d, NULL);
    devio_fixture_free(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_text),
        cmocka_unit_test(test_plugin_loads),
        cmocka_unit_test(test_no_device),
        cmocka_unit_test(test_fast_refused),
        cmocka_unit_test(test_device_info),
        cmocka_unit_test(test_strict_f32),
        cmocka_unit_test(test_strict_bf16),
        cmocka_unit_test(test_strict_f16_lora),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

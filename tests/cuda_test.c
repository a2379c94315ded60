/* cuda_test.c - the CUDA backend (kernels/). Without a GPU: the plugin loads through the
 * long because every case, with or without a GPU, runs the same workloads through one set of
 * helpers at the top (model writing, the side-by-side runner, the bit comparison).
 * registry and passes its checks, its probe and create refuse with the CUDA runtime's reason,
 * `auto` falls back to the reference and says why, CUDA errors read as devio errors, a hybrid
 * model the mixer kernels cannot take is refused by name, and the workloads give the same bits
 * on the reference at depth 1 and 2. With a GPU: strict numerics give the reference's bits for
 * every logit and sample (prompts, chunks, decode, batches, LoRA, copy-on-write forks, f32,
 * f16 and bf16 weights), at depth 1 and 2, for Llama and for the hybrid Bamba and Mamba2
 * (state carried across prefill chunks, snapshots END and EACH, forks, snapshot effects and
 * truncation to a snapshot, which go through ssm_copy, LoRA on in_proj and out_proj), and for
 * the model features of numspec rules 1, 4, 4a, 6, 7 and 8: Mistral's sliding window, Granite's
 * four multipliers, Qwen3's q_norm and k_norm, and the yarn and llama3 RoPE tables (with LoRA
 * where the feature meets it: Granite's scaled residual on adapted o_proj and down_proj, Qwen3's
 * norm after adapted q_proj and k_proj), each model as devio-mkmodel writes it; without a GPU
 * those models are checked to load with the feature in their shape, to change the reference's
 * logits and to give the same bits at depth 1 and 2. Cases that need a GPU are skipped, visibly,
 * where none answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "device/backend/registry.h"
#include "device/sample/sampler.h"
#include "device/backend/shape.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_plan.h"
#include "ref/builtin.h"
#include "ref/ref_backend.h"
#include "tests/testutil.h"

#if defined(DEVIO_CUDA_TEST_EMU)
#include <cuda_runtime_api.h> /* the emulator's: devio_emu_fault, devio_emu_counts */
#endif

/* Where Bazel puts //kernels:libdevio-backend-cuda.so (or -cuda-emu.so) in this test's
 * runfiles. Built as cuda_emu_test, every case runs on the SIMT emulator (kernels/emu/),
 * whose one device always answers. */
#define PLUGIN_DIR "kernels"
#if defined(DEVIO_CUDA_TEST_EMU)
#define BACKEND "cuda-emu"
#else
#define BACKEND "cuda"
#endif

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
    assert_string_equal(err.message,
                        "CUDA error in q_proj: cudaErrorMemoryAllocation: out of memory");
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
    assert_int_equal(devio_registry_find(&r, BACKEND, &ops, &err), DEVIO_OK);
    assert_string_equal(ops->name, BACKEND);
    assert_int_equal(ops->abi, DEVIO_BACKEND_ABI);
    assert_int_equal(devio_backend_check(ops, &err), DEVIO_OK);
    assert_true(devio_backend_has_adapters(ops));
    assert_non_null(ops->probe);
    assert_non_null(ops->kv_blocks_fit);
    assert_int_equal(r.n_handles, 1);
    /* auto: the plugin when a device answers, else the reference with the reason; never
     * the emulator, which is test infrastructure (its runfiles hold no cuda plugin). */
    assert_int_equal(devio_registry_find(&r, "auto", &ops, &err), DEVIO_OK);
#if defined(DEVIO_CUDA_TEST_EMU)
    assert_ptr_equal(ops, &devio_ref_backend);
    assert_non_null(strstr(r.note, "cuda: "));
#else
    if (have_gpu()) {
        assert_string_equal(ops->name, "cuda");
    } else {
        assert_ptr_equal(ops, &devio_ref_backend);
        assert_non_null(strstr(r.note, "cuda: no CUDA device"));
    }
#endif
    devio_registry_close(&r);
}

/* With a GPU present the no-device path still runs: this binary again, alone on this case,
 * with no device visible to the CUDA runtime (a fresh process: the runtime reads
 * CUDA_VISIBLE_DEVICES once, at its first call). */
static void run_without_device(const char *test)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("CUDA_VISIBLE_DEVICES", "", 1);
        setenv("DEVIO_CUDA_TEST_ONLY", test, 1);
        execl("/proc/self/exe", "cuda_test", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_no_device(void **state)
{
    (void)state;
    if (have_gpu()) {
        run_without_device("test_no_device");
        return;
    }
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

/* ---- with a GPU: the reference's bits ------------------------------------- */

typedef struct run_out {
    float *logits; /* [n, vocab] */
    int32_t *tokens;
    float *logprobs;
    uint32_t n;
} run_out;

static void free_run(run_out *r)
{
    free(r->logits);
    free(r->tokens);
    free(r->logprobs);
}

/* The numerics open_dev asks for: strict but in compare_fast. */
static devio_numerics run_numerics = DEVIO_NUMERICS_STRICT;

static devio_device *open_dev(const devio_fixture *fx, const devio_backend_ops *ops,
                              uint32_t depth, const char *adapters)
{
    devio_config cfg = devio_config_default();
    cfg.numerics = ops == &devio_ref_backend ? DEVIO_NUMERICS_STRICT : run_numerics;
    cfg.kv_blocks = 256;
    cfg.block_size = 4;
    cfg.max_seq_len = 256;
    cfg.max_depth = depth;
    cfg.threads = 1;
    cfg.max_loras = 2;
    cfg.adapters_root = adapters;
    cfg.ssm_slots = 8; /* hybrid models only; the core ignores them otherwise */
    cfg.ssm_snapshots = 32;
    devio_device *d = NULL;
    devio_error err = {0};
    devio_status s = devio_open(fx->model, ops, &cfg, &d, &err);
    if (s != DEVIO_OK)
        fail_msg("open %s: %s", ops->name, err.message);
    if (adapters) {
        devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LOAD, .name = "a", .path = "a0"};
        devio_adapter_ack ack;
        assert_int_equal(devio_adapter_command(d, &cmd, &ack, &err), DEVIO_OK);
        devio_adapter_ack_free(&ack);
    }
    return d;
}

/* One row of the workload's prompt phase. */
typedef struct prompt_row {
    uint32_t seq;   /* index into the workload's sequences */
    uint32_t first, n;
    bool lora, all; /* the adapter (when there is one); all logits, else the last */
    devio_snapshot snap; /* hybrid models: the SSM snapshots the row takes */
} prompt_row;

/* Settles ticket t: every logits row it produced, its sampled tokens and
 * logprobs appended to out, in row order; n_logits[r] rows for row r. */
static void collect(devio_device *d, uint64_t t, const uint32_t *n_logits, uint32_t V,
                    run_out *out)
{
    devio_step_result res;
    devio_error err = {0};
    assert_int_equal(devio_await(d, t, -1, &res, &err), DEVIO_OK);
    for (uint32_t r = 0; r < res.n_rows; r++) {
        uint32_t nl = n_logits[r];
        assert_true(out->n + nl <= 64);
        assert_int_equal(devio_logits_read(d, res.rows[r].logits, 0, nl,
                                           out->logits + (size_t)out->n * V, NULL, &err),
                         DEVIO_OK);
        out->n += nl;
        out->tokens[out->n - 1] = res.rows[r].token;
        out->logprobs[out->n - 1] = res.rows[r].logprob;
        devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = res.rows[r].logits};
        devio_outcome eo;
        assert_int_equal(devio_apply(d, &rel, &eo, NULL), DEVIO_OK);
        devio_outcome_free(&eo);
    }
    devio_step_result_free(&res);
}

static run_out run_alloc(uint32_t V)
{
    run_out out = {.logits = calloc(64 * (size_t)V, sizeof(float)),
                   .tokens = calloc(64, sizeof(int32_t)), .logprobs = calloc(64, sizeof(float))};
    assert_non_null(out.logits);
    assert_non_null(out.tokens);
    assert_non_null(out.logprobs);
    return out;
}

static const devio_sample_params sample_params = {.temperature = 0.7f, .top_k = 40,
                                                  .top_p = 0.95f, .seed = 11};

/* The prompt phase of a workload: three plans of up to two rows over the
 * sequences s of a 37-token prompt. The first two plans touch different
 * sequences: at depth 2 both are in flight before either is awaited. */
static void prompts(devio_device *d, const uint64_t *s, const prompt_row plans[3][2],
                    uint32_t depth, const char *adapters, uint32_t V, run_out *out)
{
    int32_t prompt[37];
    for (uint32_t i = 0; i < 37; i++)
        prompt[i] = (int32_t)((i * 131u + 7u) % V);
    uint64_t t[3];
    uint32_t n_logits[3][2] = {{0}};
    for (uint32_t k = 0; k < 3; k++) {
        devio_row rows[2];
        uint32_t nr = 0;
        for (uint32_t r = 0; r < 2 && plans[k][r].n; r++, nr++) {
            const prompt_row *p = &plans[k][r];
            rows[r] = (devio_row){.seq = s[p->seq], .tokens = prompt + p->first, .n_tokens = p->n,
                                  .logits = p->all ? DEVIO_LOGITS_ALL : DEVIO_LOGITS_LAST,
                                  .adapter = adapters && p->lora ? "a" : NULL,
                                  .has_sample = true, .sample = sample_params,
                                  .snapshot = p->snap};
            n_logits[k][r] = p->all ? p->n : 1;
        }
        devio_plan plan = {.rows = rows, .n_rows = nr};
        devio_error err = {0};
        if (devio_launch(d, &plan, &t[k], &err) != DEVIO_OK)
            fail_msg("launch: %s", err.message);
        /* Plan 0 stays in flight while plan 1 is launched when depth allows. */
        if (k == 0 && depth >= 2)
            continue;
        if (k == 1 && depth >= 2)
            collect(d, t[0], n_logits[0], V, out);
        collect(d, t[k], n_logits[k], V, out);
    }
}

/* `steps` decode steps of the four sequences s in one plan each, step
 * numbers from step0 on choosing the tokens; row 1 has the adapter (when
 * there is one), row 3 takes snapshots `snap3` (hybrid models). */
static void decode(devio_device *d, const uint64_t *s, uint32_t step0, uint32_t steps,
                   const char *adapters, devio_snapshot snap3, uint32_t V, run_out *out)
{
    for (uint32_t step = step0; step < step0 + steps; step++) {
        devio_row rows[4];
        int32_t tok[4];
        for (uint32_t r = 0; r < 4; r++) {
            tok[r] = (int32_t)((step * 17u + r * 5u + 3u) % V);
            rows[r] = (devio_row){.seq = s[r], .tokens = &tok[r], .n_tokens = 1,
                                  .logits = DEVIO_LOGITS_LAST,
                                  .adapter = adapters && r == 1 ? "a" : NULL,
                                  .has_sample = true, .sample = sample_params,
                                  .snapshot = r == 3 ? snap3 : DEVIO_SNAP_NONE};
        }
        devio_plan plan = {.rows = rows, .n_rows = 4};
        static const uint32_t ones[4] = {1, 1, 1, 1};
        uint64_t tk;
        devio_error err = {0};
        if (devio_launch(d, &plan, &tk, &err) != DEVIO_OK)
            fail_msg("launch: %s", err.message);
        collect(d, tk, ones, V, out);
    }
}

/* An effect on sequence seq that must succeed; returns the outcome's seq. */
static uint64_t effect(devio_device *d, devio_effect_kind kind, uint64_t seq, uint32_t len)
{
    devio_effect e = {.kind = kind, .seq = seq, .len = len};
    devio_outcome o;
    devio_error err = {0};
    if (devio_apply(d, &e, &o, &err) != DEVIO_OK)
        fail_msg("effect %d on sequence %llu: %s", (int)kind, (unsigned long long)seq,
                 err.message);
    uint64_t out = o.seq;
    devio_outcome_free(&o);
    return out;
}

/* A fixed workload: three sequences (one with an adapter when given); a
 * 37-token prompt split 20 + 17, a 5-token and a 2-token prompt; a fork of
 * the first; then 6 decode steps of all four in one plan each. Rows ask for
 * all logits or the last, and a sampled token. */
static run_out workload(const devio_fixture *fx, const devio_backend_ops *ops, uint32_t depth,
                        const char *adapters)
{
    devio_device *d = open_dev(fx, ops, depth, adapters);
    uint32_t V = fx->model->cfg.vocab_size;
    run_out out = run_alloc(V);
    uint64_t s[4];
    for (int i = 0; i < 3; i++)
        assert_int_equal(devio_seq_create(d, &s[i], NULL), DEVIO_OK);
    static const prompt_row plans[3][2] = {
        {{0, 0, 20, false, true, DEVIO_SNAP_NONE}, {1, 3, 5, true, false, DEVIO_SNAP_NONE}},
        {{2, 9, 2, false, true, DEVIO_SNAP_NONE}, {0}},
        {{0, 20, 17, false, false, DEVIO_SNAP_NONE}, {0}},
    };
    prompts(d, s, plans, depth, adapters, V, &out);
    /* A fork shares s0's blocks; its first decode copies the partial block. */
    s[3] = effect(d, DEVIO_EFFECT_FORK, s[0], 0);
    decode(d, s, 0, 6, adapters, DEVIO_SNAP_NONE, V, &out);
    devio_teardown(d, NULL);
    return out;
}

/* The hybrid workload (Bamba, Mamba2): the prompt phase of workload() with
 * s0's first chunk snapshotted at its end (its second chunk starts from the
 * state the first left) and s1's prompt after each token; a fork of s0 (a
 * slot copy) and a snapshot effect on s2 (slot to snapshot); 3 decode steps;
 * then s0, s1 and s2 truncated to snapshots (snapshot to slot: lengths 20,
 * 3 and 2), 3 decode steps with s3 snapshotted after each, s3 truncated to
 * the first of those, s2 to 0 (its next token starts from zeros in a slot
 * that held state), and 2 more steps. 56 logits rows. */
static run_out hybrid_workload(const devio_fixture *fx, const devio_backend_ops *ops,
                               uint32_t depth, const char *adapters)
{
    devio_device *d = open_dev(fx, ops, depth, adapters);
    uint32_t V = fx->model->cfg.vocab_size;
    run_out out = run_alloc(V);
    uint64_t s[4];
    for (int i = 0; i < 3; i++)
        assert_int_equal(devio_seq_create(d, &s[i], NULL), DEVIO_OK);
    static const prompt_row plans[3][2] = {
        {{0, 0, 20, false, true, DEVIO_SNAP_END}, {1, 3, 5, true, false, DEVIO_SNAP_EACH}},
        {{2, 9, 2, false, true, DEVIO_SNAP_NONE}, {0}},
        {{0, 20, 17, false, false, DEVIO_SNAP_NONE}, {0}},
    };
    prompts(d, s, plans, depth, adapters, V, &out);
    s[3] = effect(d, DEVIO_EFFECT_FORK, s[0], 0);
    effect(d, DEVIO_EFFECT_SNAPSHOT, s[2], 0);
    decode(d, s, 0, 3, adapters, DEVIO_SNAP_NONE, V, &out);
    effect(d, DEVIO_EFFECT_TRUNCATE, s[0], 20);
    effect(d, DEVIO_EFFECT_TRUNCATE, s[1], 3);
    effect(d, DEVIO_EFFECT_TRUNCATE, s[2], 2);
    decode(d, s, 3, 3, adapters, DEVIO_SNAP_EACH, V, &out);
    effect(d, DEVIO_EFFECT_TRUNCATE, s[3], 37 + 3 + 1);
    /* s2 to 0 gives its slot back; it takes the slot again, stale, at pos0 0. */
    effect(d, DEVIO_EFFECT_TRUNCATE, s[2], 0);
    decode(d, s, 6, 2, adapters, DEVIO_SNAP_NONE, V, &out);
    devio_teardown(d, NULL);
    return out;
}

typedef run_out (*workload_fn)(const devio_fixture *fx, const devio_backend_ops *ops,
                               uint32_t depth, const char *adapters);

static void compare_runs(const devio_fixture *fx, const char *adapters, workload_fn run)
{
    uint32_t V = fx->model->cfg.vocab_size;
    run_out want = run(fx, &devio_ref_backend, 1, adapters);
    for (uint32_t depth = 1; depth <= 2; depth++) {
        run_out got = run(fx, &devio_cuda_backend, depth, adapters);
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
        free_run(&got);
    }
    free_run(&want);
}

/* Fast numerics (docs/numerics.md): run's logits on the CUDA backend at
 * depth 2 within 1e-2 of the reference's, row by row in the 2-norm over the
 * vocabulary, and the argmax the same in all but one row in 20. */
static void compare_fast(const devio_fixture *fx, const char *adapters, workload_fn run)
{
    uint32_t V = fx->model->cfg.vocab_size;
    run_out want = run(fx, &devio_ref_backend, 1, adapters);
    run_numerics = DEVIO_NUMERICS_FAST;
    run_out got = run(fx, &devio_cuda_backend, 2, adapters);
    run_numerics = DEVIO_NUMERICS_STRICT;
    assert_int_equal(got.n, want.n);
    uint32_t agree = 0;
    double worst = 0;
    for (uint32_t i = 0; i < want.n; i++) {
        const float *a = want.logits + (size_t)i * V, *b = got.logits + (size_t)i * V;
        double d2 = 0, n2 = 0;
        uint32_t ia = 0, ib = 0;
        for (uint32_t v = 0; v < V; v++) {
            d2 += ((double)b[v] - a[v]) * ((double)b[v] - a[v]);
            n2 += (double)a[v] * a[v];
            ia = a[v] > a[ia] ? v : ia;
            ib = b[v] > b[ib] ? v : ib;
        }
        double rel = n2 > 0 ? sqrt(d2 / n2) : sqrt(d2);
        worst = rel > worst ? rel : worst;
        agree += ia == ib;
    }
    print_message("cuda_test: fast numerics: %u rows, relative error at most %.3g, argmax "
                  "agreeing in %u\n", want.n, worst, agree);
    if (worst > 1e-2 || agree * 20 < want.n * 19)
        fail_msg("fast numerics: relative error %.3g (limit 1e-2), argmax agreeing in %u of %u",
                 worst, agree, want.n);
    free_run(&got);
    free_run(&want);
}

/* The tiny model in `dtype` (seed 5), and when `lora` an adapter "a0" of
 * rank 8 under fx->dir/adapters, whose path goes to adapters. */
static void fixture_with(devio_fixture *fx, devio_dtype dtype, bool lora, char *adapters,
                         size_t n)
{
    assert_int_equal(devio_fixture_preset(fx, "tiny", dtype, 5), 0);
    snprintf(adapters, n, "%s/adapters", fx->dir);
    if (!lora)
        return;
    devio_mkmodel_adapter_opts o = devio_mkmodel_adapter_opts_default();
    char out[400];
    snprintf(out, sizeof out, "%s/a0", adapters);
    o.model_dir = fx->dir;
    o.out_dir = out;
    o.rank = 8;
    o.seed = 2;
    assert_int_equal(devio_mkmodel_write_adapter(&o, NULL), DEVIO_OK);
}

/* The workload itself, on the reference at depth 1 and 2, with and without
 * an adapter (so that the GPU cases check the backend, not a broken
 * harness): the same bits. */
static void test_workload_on_reference(void **state)
{
    (void)state;
    for (int lora = 0; lora < 2; lora++) {
        devio_fixture fx;
        char adapters[300];
        fixture_with(&fx, lora ? DEVIO_F16 : DEVIO_BF16, lora, adapters, sizeof adapters);
        uint32_t V = fx.model->cfg.vocab_size;
        run_out a = workload(&fx, &devio_ref_backend, 1, lora ? adapters : NULL);
        run_out b = workload(&fx, &devio_ref_backend, 2, lora ? adapters : NULL);
        assert_int_equal(a.n, 20 + 1 + 2 + 1 + 6 * 4);
        assert_int_equal(b.n, a.n);
        assert_memory_equal(a.logits, b.logits, (size_t)a.n * V * sizeof(float));
        assert_memory_equal(a.tokens, b.tokens, a.n * sizeof(int32_t));
        if (lora) {
            /* The adapter changes the logits of its rows. */
            run_out c = workload(&fx, &devio_ref_backend, 1, NULL);
            assert_true(memcmp(a.logits, c.logits, (size_t)a.n * V * sizeof(float)) != 0);
            free_run(&c);
        }
        free_run(&a);
        free_run(&b);
        devio_fixture_free(&fx);
    }
}

static void strict_case(devio_dtype dtype, bool lora)
{
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    fixture_with(&fx, dtype, lora, adapters, sizeof adapters);
    compare_runs(&fx, lora ? adapters : NULL, workload);
    devio_fixture_free(&fx);
}

/* Rows long enough for whole lane-major chunks (kernels/cuda_kernels.h) and a tail past the
 * last one: hidden 264 = 256 + 8 and ffn 520 = 512 + 8; tied in bf16 (the embedding reads
 * lm_head's lane-major rows), untied in f32 and f16. */
static void wide_case(devio_dtype dtype, bool tied)
{
    NEED_GPU();
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    devio_error err = {0};
    assert_int_equal(devio_mkmodel_preset("tiny", &o, &err), DEVIO_OK);
    o.hidden_size = 264;
    o.intermediate_size = 520;
    o.vocab_size = 300;
    o.head_dim = 0;
    o.dtype = dtype;
    o.tie_word_embeddings = tied;
    o.seed = 9;
    devio_fixture fx;
    assert_int_equal(devio_fixture_make(&fx, o), 0);
    compare_runs(&fx, NULL, workload);
    devio_fixture_free(&fx);
}

static void test_wide_bf16_tied(void **state) { (void)state; wide_case(DEVIO_BF16, true); }
static void test_wide_f32(void **state) { (void)state; wide_case(DEVIO_F32, false); }
static void test_wide_f16(void **state) { (void)state; wide_case(DEVIO_F16, false); }

/* The process's resident bytes (/proc/self/statm). */
static uint64_t resident_bytes(void)
{
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Once the device holds the weights, the host's copy goes back to the system (the process
 * does it when the backend copies_weights): on the bench preset the resident size drops by
 * the weights' bytes (on the emulator the device copy is host memory too, so one copy stays).
 * A backend that reads host weights is refused the released model. */
static void test_host_weights_released(void **state)
{
    (void)state;
    NEED_GPU();
    devio_fixture fx;
    assert_int_equal(devio_fixture_preset(&fx, "bench", DEVIO_BF16, 3), 0);
    devio_config cfg = devio_config_default();
    cfg.threads = 1;
    cfg.kv_blocks = 64;
    devio_device *d = NULL;
    devio_error err = {0};
    assert_true(devio_cuda_backend.copies_weights);
    assert_false(devio_ref_backend.copies_weights);
    assert_int_equal(devio_open(fx.model, &devio_cuda_backend, &cfg, &d, &err), DEVIO_OK);
    uint64_t weights = cuda_plan_weight_bytes(fx.model), with = resident_bytes();
    devio_model_release_weights(fx.model);
    uint64_t without = resident_bytes();
    print_message("cuda_test: bench preset, %.1f MB of weights: resident %.1f MB with the host "
                  "copy, %.1f MB without\n", weights / 1e6, with / 1e6, without / 1e6);
    assert_true(with > without && with - without >= weights - weights / 20);
    assert_true(devio_model_weights_released(fx.model));
    devio_device *r = NULL;
    assert_int_equal(devio_open(fx.model, &devio_ref_backend, &cfg, &r, &err), DEVIO_E_INVALID);
    assert_non_null(strstr(err.message, "were released"));
    assert_null(r);
    devio_teardown(d, NULL);
    devio_fixture_free(&fx);
}

/* The workload on the CUDA backend at depth 2 with CUDA Graphs on or off
 * (DEVIO_CUDA_GRAPHS, read at create); under the emulator, the kernel
 * launches it took (a graph's launch counts as one). */
static run_out graphs_run(const devio_fixture *fx, const char *adapters, const char *graphs,
                          unsigned long *launches)
{
    setenv("DEVIO_CUDA_GRAPHS", graphs, 1);
    *launches = 0;
#if defined(DEVIO_CUDA_TEST_EMU)
    devio_emu_fault(NULL); /* counters from zero */
#endif
    run_out out = workload(fx, &devio_cuda_backend, 2, adapters);
#if defined(DEVIO_CUDA_TEST_EMU)
    unsigned long mallocs, syncs;
    devio_emu_counts(&mallocs, launches, &syncs);
#endif
    unsetenv("DEVIO_CUDA_GRAPHS");
    return out;
}

/* Decode steps replay captured graphs: the same bits as launching every
 * kernel (and as the reference), in far fewer launches. */
static void test_graphs(void **state)
{
    (void)state;
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    fixture_with(&fx, DEVIO_BF16, true, adapters, sizeof adapters);
    uint32_t V = fx.model->cfg.vocab_size;
    run_out want = workload(&fx, &devio_ref_backend, 1, adapters);
    unsigned long with, without;
    run_out on = graphs_run(&fx, adapters, "1", &with), off = graphs_run(&fx, adapters, "0",
                                                                          &without);
    assert_int_equal(on.n, want.n);
    assert_int_equal(off.n, want.n);
    assert_memory_equal(on.logits, want.logits, (size_t)want.n * V * sizeof(float));
    assert_memory_equal(off.logits, want.logits, (size_t)want.n * V * sizeof(float));
    assert_memory_equal(on.tokens, want.tokens, want.n * sizeof(int32_t));
    print_message("cuda_test: graphs: %lu launches with, %lu without\n", with, without);
#if defined(DEVIO_CUDA_TEST_EMU)
    assert_true(with * 2 < without);
#endif
    free_run(&on);
    free_run(&off);
    free_run(&want);
    devio_fixture_free(&fx);
}

static void test_strict_f32(void **state) { (void)state; strict_case(DEVIO_F32, false); }
static void test_strict_bf16(void **state) { (void)state; strict_case(DEVIO_BF16, false); }

/* Fast numerics: projections on the GEMM of kernels/cuda_gemm.h (cuBLASLt on a GPU, the
 * emulator's host GEMM here), with an adapter on top, and a hybrid model whose mixer
 * projections stay strict. */
static void test_fast_bf16_lora(void **state)
{
    (void)state;
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    fixture_with(&fx, DEVIO_BF16, true, adapters, sizeof adapters);
    compare_fast(&fx, adapters, workload);
    devio_fixture_free(&fx);
}

/* The same with every batch of up to 8 tokens on the GEMV (DEVIO_CUDA_GEMV=8): decode rows
 * take it, the prompts the GEMM. */
static void test_fast_gemv(void **state)
{
    (void)state;
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    fixture_with(&fx, DEVIO_BF16, true, adapters, sizeof adapters);
    setenv("DEVIO_CUDA_GEMV", "8", 1);
    compare_fast(&fx, adapters, workload);
    unsetenv("DEVIO_CUDA_GEMV");
    devio_fixture_free(&fx);
}

static void test_fast_f32(void **state)
{
    (void)state;
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    fixture_with(&fx, DEVIO_F32, false, adapters, sizeof adapters);
    compare_fast(&fx, NULL, workload);
    devio_fixture_free(&fx);
}
/* One step of fast numerics over 12 rows, twins 2i and 2i + 1 with the same tokens and sample
 * params P[i], 2i keeping its logits, 2i + 1 asking for the token only; the last pair with
 * step 0b too (a bias, a ban and every penalty over the step's own tokens). Each token and
 * logprob must be device/sample/sampler.c's on row 2i's logits (the GPU samples every row), the twins
 * the same. On the emulator `fault` (devio_emu_fault's spec, or NULL) is armed for the step.
 * Returns the emulator's launches. */
static unsigned long sample_step(devio_device *d, const uint64_t *seqs, const int32_t *tokens,
                                 uint32_t n, uint32_t len, devio_sampler *smp, uint32_t V,
                                 const char *fault)
{
    enum { PAIRS = 6 };
    static const devio_sample_params P[PAIRS] = {
        {.temperature = 0, .top_p = 1},
        {.temperature = 0.8f, .top_p = 1, .seed = 1},
        {.temperature = 1, .top_p = 1, .min_p = 0.1f, .seed = 7},
        {.temperature = 1, .top_k = 5, .top_p = 1, .seed = 3},
        {.temperature = 0.9f, .top_p = 0.8f, .seed = 1ull << 40},
        {.temperature = 1.1f, .top_p = 0.95f, .seed = 5},
    };
    static const int32_t bias_ids[] = {4, 9}, banned[] = {2};
    static const float bias[] = {40.0f, -2.0f}; /* id 4 taken whatever the model says */
    /* The samples: P's draws, the last pair's with the processing too; its penalties count
     * the step's own tokens (from position len on), the host's history below. */
    devio_sample_params S[PAIRS];
    for (uint32_t i = 0; i < PAIRS; i++)
        S[i] = P[i];
    S[PAIRS - 1].bias_ids = bias_ids, S[PAIRS - 1].bias = bias, S[PAIRS - 1].n_bias = 2;
    S[PAIRS - 1].banned = banned, S[PAIRS - 1].n_banned = 1;
    S[PAIRS - 1].repetition_penalty = 1.4f, S[PAIRS - 1].presence_penalty = 0.3f;
    S[PAIRS - 1].frequency_penalty = 0.6f, S[PAIRS - 1].penalty_from = len;
    const int32_t *history = tokens + (PAIRS - 1) * n;
    devio_row rows[2 * PAIRS];
    for (uint32_t r = 0; r < 2 * PAIRS; r++)
        rows[r] = (devio_row){.seq = seqs[r], .tokens = tokens + (r / 2) * n, .n_tokens = n,
                              .logits = r % 2 ? DEVIO_LOGITS_NONE : DEVIO_LOGITS_LAST,
                              .has_sample = true, .sample = S[r / 2]};
    devio_plan plan = {.rows = rows, .n_rows = 2 * PAIRS};
    devio_error err = {0};
    uint64_t t;
    devio_step_result res;
    unsigned long launches = 0;
#if defined(DEVIO_CUDA_TEST_EMU)
    devio_emu_fault(fault);
#else
    (void)fault;
#endif
    assert_int_equal(devio_launch(d, &plan, &t, &err), DEVIO_OK);
    assert_int_equal(devio_await(d, t, -1, &res, &err), DEVIO_OK);
#if defined(DEVIO_CUDA_TEST_EMU)
    unsigned long mallocs, syncs;
    devio_emu_counts(&mallocs, &launches, &syncs);
#endif
    float *logits = malloc(V * sizeof *logits);
    for (uint32_t i = 0; i < PAIRS; i++) {
        const devio_row_result *a = &res.rows[2 * i], *b = &res.rows[2 * i + 1];
        assert_true(a->sampled && b->sampled);
        assert_int_equal(devio_logits_read(d, a->logits, 0, 1, logits, NULL, &err), DEVIO_OK);
        int32_t tok;
        float lp;
        bool last = i == PAIRS - 1;
        assert_int_equal(devio_sampler_run_ex(smp, logits, &S[i], last ? history : NULL,
                                              last ? n : 0, len + n, &tok, &lp, NULL),
                         DEVIO_OK);
        if (a->token != tok || b->token != tok || memcmp(&a->logprob, &lp, 4) ||
            memcmp(&b->logprob, &lp, 4))
            fail_msg("params %u at %u: tokens %d and %d, logprobs %.9g and %.9g; the host "
                     "sampler's %d %.9g", i, len + n, a->token, b->token, (double)a->logprob,
                     (double)b->logprob, tok, (double)lp);
        devio_effect rel = {.kind = DEVIO_EFFECT_RELEASE, .logits = a->logits};
        devio_outcome eo;
        assert_int_equal(devio_apply(d, &rel, &eo, NULL), DEVIO_OK);
        devio_outcome_free(&eo);
    }
    free(logits);
    devio_step_result_free(&res);
    return launches;
}

/* Sampling under fast numerics, a prompt step and then decode steps (graphs). On the
 * emulator a replayed decode step takes two launches: its graph and the sampler kernel. There
 * the prompt step's room for the logit processing is refused (the first allocation fails):
 * that step is sampled on the host, with the same results, and the device stays well. */
static void test_fast_sampling(void **state)
{
    (void)state;
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    fixture_with(&fx, DEVIO_BF16, false, adapters, sizeof adapters);
    uint32_t V = fx.model->cfg.vocab_size;
    run_numerics = DEVIO_NUMERICS_FAST;
    devio_device *d = open_dev(&fx, &devio_cuda_backend, 2, NULL);
    run_numerics = DEVIO_NUMERICS_STRICT;
    devio_sampler *smp = NULL;
    assert_int_equal(devio_sampler_create(V, &smp), DEVIO_OK);
    uint64_t seqs[12];
    devio_error err = {0};
    for (uint32_t r = 0; r < 12; r++)
        assert_int_equal(devio_seq_create(d, &seqs[r], &err), DEVIO_OK);
    int32_t tokens[6 * 6];
    for (uint32_t i = 0; i < 6 * 6; i++)
        tokens[i] = (int32_t)((i * 37u + 11u) % V);
    sample_step(d, seqs, tokens, 6, 0, smp, V, "malloc:1");
#if defined(DEVIO_CUDA_TEST_EMU)
    unsigned long mallocs, launched, syncs;
    devio_emu_counts(&mallocs, &launched, &syncs);
    assert_true(mallocs >= 1); /* the refused allocation was asked for */
#endif
    devio_device_info info;
    devio_device_info_get(d, &info);
    assert_string_equal(info.failure, "");
    for (uint32_t k = 0; k < 4; k++) {
        unsigned long launches = sample_step(d, seqs, tokens + k, 1, 6 + k, smp, V, NULL);
#if defined(DEVIO_CUDA_TEST_EMU)
        if (k > 0) /* the step's graph, replayed, and the sampler kernel */
            assert_int_equal(launches, 2);
#else
        (void)launches;
#endif
    }
    devio_sampler_free(smp);
    devio_teardown(d, NULL);
    devio_fixture_free(&fx);
}

static void test_strict_f16_lora(void **state) { (void)state; strict_case(DEVIO_F16, true); }

/* ---- hybrid models ----------------------------------------------------------- */

/* The tiny preset of `arch` ("bamba": 4 layers, attention in layer 1, RoPE
 * on half of each head; "mamba2": 2 mixer layers, no MLP) in dtype, seed
 * 7; with `lora` an adapter "a0" of rank 4 under fx->dir/adapters on
 * in_proj and out_proj (Bamba: also q_proj, gate_proj and down_proj). */
static void hybrid_fixture(devio_fixture *fx, const char *arch, devio_dtype dtype, bool lora,
                           char *adapters, size_t n)
{
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    devio_error err = {0};
    o.arch = arch;
    if (devio_mkmodel_preset("tiny", &o, &err) != DEVIO_OK)
        fail_msg("mkmodel --preset tiny --arch %s: %s", arch, err.message);
    o.dtype = dtype;
    o.seed = 7;
    assert_int_equal(devio_fixture_make(fx, o), 0);
    snprintf(adapters, n, "%s/adapters", fx->dir);
    if (!lora)
        return;
    devio_mkmodel_adapter_opts a = devio_mkmodel_adapter_opts_default();
    char out[400];
    snprintf(out, sizeof out, "%s/a0", adapters);
    a.model_dir = fx->dir;
    a.out_dir = out;
    a.rank = 4;
    a.seed = 3;
    a.targets = (1u << DEVIO_LORA_IN_PROJ) | (1u << DEVIO_LORA_OUT_PROJ);
    if (strcmp(arch, "bamba") == 0)
        a.targets |= (1u << DEVIO_LORA_Q) | (1u << DEVIO_LORA_GATE) | (1u << DEVIO_LORA_DOWN);
    if (devio_mkmodel_write_adapter(&a, &err) != DEVIO_OK)
        fail_msg("mkmodel --adapter on %s: %s", arch, err.message);
}

/* The hybrid workload on the reference at depth 1 and 2 gives the same bits
 * (so that the GPU cases check the backend, not the harness), and its
 * adapter changes the logits. */
static void test_hybrid_workload_on_reference(void **state)
{
    (void)state;
    static const char *const archs[] = {"bamba", "mamba2"};
    for (int k = 0; k < 4; k++) {
        bool lora = k >= 2;
        devio_fixture fx;
        char adapters[300];
        hybrid_fixture(&fx, archs[k % 2], lora ? DEVIO_BF16 : DEVIO_F32, lora, adapters,
                       sizeof adapters);
        uint32_t V = fx.model->cfg.vocab_size;
        run_out a = hybrid_workload(&fx, &devio_ref_backend, 1, lora ? adapters : NULL);
        run_out b = hybrid_workload(&fx, &devio_ref_backend, 2, lora ? adapters : NULL);
        assert_int_equal(a.n, 20 + 1 + 2 + 1 + 3 * 4 + 3 * 4 + 2 * 4);
        assert_int_equal(b.n, a.n);
        assert_memory_equal(a.logits, b.logits, (size_t)a.n * V * sizeof(float));
        assert_memory_equal(a.tokens, b.tokens, a.n * sizeof(int32_t));
        if (lora) {
            run_out c = hybrid_workload(&fx, &devio_ref_backend, 1, NULL);
            assert_true(memcmp(a.logits, c.logits, (size_t)a.n * V * sizeof(float)) != 0);
            free_run(&c);
        }
        free_run(&a);
        free_run(&b);
        devio_fixture_free(&fx);
    }
}

/* What the mixer kernels cannot take is refused at create, by name, before
 * any device memory is touched (so this runs without a GPU too). */
static void test_hybrid_refused(void **state)
{
    (void)state;
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    devio_error err = {0};
    o.arch = "mamba2";
    assert_int_equal(devio_mkmodel_preset("tiny", &o, &err), DEVIO_OK);
    o.ssm_state = 288;
    devio_fixture fx;
    assert_int_equal(devio_fixture_make(&fx, o), 0);
    devio_config cfg = devio_config_default();
    cfg.threads = 1;
    cfg.kv_blocks = 64;
    devio_device *d = NULL;
    assert_int_equal(devio_open(fx.model, &devio_cuda_backend, &cfg, &d, &err),
                     DEVIO_E_UNSUPPORTED);
    assert_null(d);
    assert_non_null(strstr(err.message, "at most 256 states"));
    assert_non_null(strstr(err.message, "288 (d_state)"));
    devio_fixture_free(&fx);
}

static void hybrid_case(const char *arch, devio_dtype dtype, bool lora)
{
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    hybrid_fixture(&fx, arch, dtype, lora, adapters, sizeof adapters);
    compare_runs(&fx, lora ? adapters : NULL, hybrid_workload);
    devio_fixture_free(&fx);
}

static void test_bamba_f32(void **state) { (void)state; hybrid_case("bamba", DEVIO_F32, false); }
static void test_bamba_bf16_lora(void **state)
{
    (void)state;
    hybrid_case("bamba", DEVIO_BF16, true);
}
static void test_mamba2_f32(void **state) { (void)state; hybrid_case("mamba2", DEVIO_F32, false); }
static void test_fast_bamba_bf16_lora(void **state)
{
    (void)state;
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    hybrid_fixture(&fx, "bamba", DEVIO_BF16, true, adapters, sizeof adapters);
    compare_fast(&fx, adapters, hybrid_workload);
    devio_fixture_free(&fx);
}
static void test_mamba2_f16_lora(void **state)
{
    (void)state;
    hybrid_case("mamba2", DEVIO_F16, true);
}

/* ---- model features: numspec rules 1, 4, 4a, 6, 7, 8 ------------------------ */

typedef enum feature {
    FEAT_WINDOW,  /* Mistral: sliding_window 11 (rule 6) */
    FEAT_GRANITE, /* Granite: embedding, attention, residual and logits multipliers (1, 6, 7, 8) */
    FEAT_QWEN3,   /* Qwen3: q_norm and k_norm (rule 4a) */
    FEAT_YARN,    /* RoPE scaling yarn, its attention factor in the tables (rule 4) */
    FEAT_LLAMA3,  /* RoPE scaling llama3 (rule 4) */
    FEAT_N,
} feature;

static const char *const feature_name[FEAT_N] = {"mistral", "granite", "qwen3", "yarn", "llama3"};

/* A window shorter than the workload's prompts, and a multiple of neither
 * the block size (4) nor 32: j0 moves through blocks and lanes, and the core
 * releases the blocks left below it. */
#define TEST_WINDOW 11u

/* The tiny model with feature f in dtype, seed 5, as devio-mkmodel writes
 * it: the mistral, granite or qwen3 tiny preset, or the llama one with RoPE
 * scaling. Granite's multipliers are none a power of two but the
 * embedding's, so that a multiply in place of the division, or a product
 * fused into the residual add, would show. With `lora` an adapter "a0" of
 * rank 8 under fx->dir/adapters on the modules the feature meets: Granite's
 * q_proj, o_proj, gate_proj and down_proj (the scaled residual after LoRA),
 * Qwen3's q_proj, k_proj and v_proj (the norm after LoRA), Mistral's q_proj
 * and v_proj. */
static void feature_fixture(devio_fixture *fx, feature f, devio_dtype dtype, bool lora,
                            char *adapters, size_t n)
{
    static const char *const arch[FEAT_N] = {"mistral", "granite", "qwen3", "llama", "llama"};
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    devio_error err = {0};
    o.arch = arch[f];
    if (devio_mkmodel_preset("tiny", &o, &err) != DEVIO_OK)
        fail_msg("mkmodel --preset tiny --arch %s: %s", arch[f], err.message);
    o.dtype = dtype;
    o.seed = 5;
    switch (f) {
    case FEAT_WINDOW: o.sliding_window = TEST_WINDOW; break;
    case FEAT_GRANITE:
        o.embedding_multiplier = 12.0;
        o.attention_multiplier = 0.3;
        o.residual_multiplier = 0.22;
        o.logits_scaling = 6.5;
        break;
    case FEAT_YARN: /* original_max_position_embeddings 512 / 4 */
        o.rope_scaling = DEVIO_MKMODEL_ROPE_YARN;
        o.rope_factor = 4.0;
        break;
    case FEAT_LLAMA3: /* wavelengths of head_dim 16 on both sides of 64 / 4 and 64 / 1 */
        o.rope_scaling = DEVIO_MKMODEL_ROPE_LLAMA3;
        o.rope_factor = 8.0;
        o.rope_original_max = 64;
        break;
    case FEAT_QWEN3:
    case FEAT_N: break;
    }
    if (devio_fixture_make(fx, o) != 0)
        fail_msg("writing or loading the %s model", feature_name[f]);
    snprintf(adapters, n, "%s/adapters", fx->dir);
    if (!lora)
        return;
    devio_mkmodel_adapter_opts a = devio_mkmodel_adapter_opts_default();
    char out[400];
    snprintf(out, sizeof out, "%s/a0", adapters);
    a.model_dir = fx->dir;
    a.out_dir = out;
    a.rank = 8;
    a.seed = 2;
    if (f == FEAT_GRANITE)
        a.targets = (1u << DEVIO_LORA_Q) | (1u << DEVIO_LORA_O) | (1u << DEVIO_LORA_GATE) |
                    (1u << DEVIO_LORA_DOWN);
    else if (f == FEAT_QWEN3)
        a.targets = (1u << DEVIO_LORA_Q) | (1u << DEVIO_LORA_K) | (1u << DEVIO_LORA_V);
    if (devio_mkmodel_write_adapter(&a, &err) != DEVIO_OK)
        fail_msg("mkmodel --adapter on the %s model: %s", feature_name[f], err.message);
}

/* The shape the core hands every backend carries the feature. */
static void check_feature_shape(const devio_fixture *fx, feature f)
{
    devio_model_shape sh;
    devio_error err = {0};
    assert_int_equal(devio_model_shape_get(fx->model, &sh, &err), DEVIO_OK);
    const devio_rope_scaling *r = &fx->model->cfg.rope_scaling;
    switch (f) {
    case FEAT_WINDOW: assert_int_equal(sh.window, TEST_WINDOW); break;
    case FEAT_GRANITE:
        assert_true(sh.emb_mult == 12.0f && sh.attn_scale == 0.3f && sh.res_mult == 0.22f &&
                    sh.logit_scale == 6.5f);
        break;
    case FEAT_QWEN3: assert_true(sh.qk_norm && sh.head_dim * sh.n_heads != sh.d); break;
    case FEAT_YARN: assert_true(r->type == DEVIO_ROPE_YARN && r->attention_factor != 1.0f); break;
    case FEAT_LLAMA3: assert_int_equal(r->type, DEVIO_ROPE_LLAMA3); break;
    case FEAT_N: break;
    }
    if (f != FEAT_WINDOW)
        assert_int_equal(sh.window, 0);
    if (f != FEAT_GRANITE)
        assert_true(sh.emb_mult == 1.0f && sh.res_mult == 1.0f && sh.logit_scale == 1.0f);
    if (f != FEAT_QWEN3)
        assert_false(sh.qk_norm);
}

/* Without a GPU: each feature's model loads with the feature in its shape,
 * the workload on the reference gives the same bits at depth 1 and 2 (with
 * the adapter too, where the GPU case has one), and the feature changes the
 * logits of the plain Llama model it was made from: the GPU cases compare
 * something. */
static void test_features_on_reference(void **state)
{
    (void)state;
    devio_fixture plain;
    assert_int_equal(devio_fixture_preset(&plain, "tiny", DEVIO_F32, 5), 0);
    uint32_t V = plain.model->cfg.vocab_size;
    run_out base = workload(&plain, &devio_ref_backend, 1, NULL);
    for (int f = 0; f < FEAT_N; f++) {
        for (int lora = 0; lora < 2; lora++) {
            devio_fixture fx;
            char adapters[300];
            feature_fixture(&fx, (feature)f, DEVIO_F32, lora, adapters, sizeof adapters);
            check_feature_shape(&fx, (feature)f);
            assert_int_equal(fx.model->cfg.vocab_size, V);
            const char *ad = lora ? adapters : NULL;
            run_out a = workload(&fx, &devio_ref_backend, 1, ad);
            run_out b = workload(&fx, &devio_ref_backend, 2, ad);
            assert_int_equal(a.n, base.n);
            assert_int_equal(b.n, a.n);
            assert_memory_equal(a.logits, b.logits, (size_t)a.n * V * sizeof(float));
            assert_memory_equal(a.tokens, b.tokens, a.n * sizeof(int32_t));
            if (!lora && memcmp(a.logits, base.logits, (size_t)a.n * V * sizeof(float)) == 0)
                fail_msg("the %s model gives the plain model's logits", feature_name[f]);
            free_run(&a);
            free_run(&b);
            devio_fixture_free(&fx);
        }
    }
    free_run(&base);
    devio_fixture_free(&plain);
}

static void feature_case(feature f, devio_dtype dtype, bool lora)
{
    NEED_GPU();
    devio_fixture fx;
    char adapters[300];
    feature_fixture(&fx, f, dtype, lora, adapters, sizeof adapters);
    compare_runs(&fx, lora ? adapters : NULL, workload);
    devio_fixture_free(&fx);
}

/* One model feature in one dtype, with or without LoRA: a case's state. */
typedef struct feature_run {
    feature f;
    devio_dtype dtype;
    bool lora;
} feature_run;

static void test_feature(void **state)
{
    const feature_run *r = *state;
    feature_case(r->f, r->dtype, r->lora);
}

static feature_run feature_runs[] = {
    {FEAT_WINDOW, DEVIO_F32, false}, {FEAT_WINDOW, DEVIO_BF16, true},
    {FEAT_GRANITE, DEVIO_F32, false}, {FEAT_GRANITE, DEVIO_F16, true},
    {FEAT_QWEN3, DEVIO_F32, false},  {FEAT_QWEN3, DEVIO_BF16, true},
    {FEAT_YARN, DEVIO_BF16, false},  {FEAT_LLAMA3, DEVIO_F32, false},
};

#define FEATURE_TEST(name, k) {name, test_feature, NULL, NULL, &feature_runs[k]}

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
    assert_string_equal(info.backend, BACKEND);
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

/* ---- a sequence's state moved between devices (docs/state.md) ------------- */

/* Strict: prefilled on the reference, continued on the GPU, and back, the same bits as on
 * the reference alone; a hybrid model's state slot and snapshots go along (truncate to one).
 * Fast (Llama): from one GPU device to another. */
static void state_case(const char *arch)
{
    devio_fixture fx;
    char adapters[300];
    hybrid_fixture(&fx, arch, DEVIO_BF16, false, adapters, sizeof adapters);
    bool hybrid = strcmp(arch, "llama") != 0;
    devio_device *ref = open_dev(&fx, &devio_ref_backend, 1, NULL);
    devio_device *gpu = open_dev(&fx, &devio_cuda_backend, 2, NULL);
    uint64_t sr = devio_test_seq(ref);
    int32_t tok[13];
    devio_test_tokens(tok, 13, 5, fx.model->cfg.vocab_size);
    free(devio_test_step(ref, sr, tok, 13, hybrid ? DEVIO_SNAP_EACH : DEVIO_SNAP_NONE,
                         DEVIO_OK));
    uint64_t sg = devio_test_move(ref, sr, true, gpu);
    devio_test_steps_alike(ref, sr, gpu, sg, 4, 10);
    if (hybrid) {
        devio_effect cut = {.kind = DEVIO_EFFECT_TRUNCATE, .seq = sr, .len = 6};
        devio_outcome o;
        devio_error err = {0};
        assert_int_equal(devio_apply(ref, &cut, &o, &err), DEVIO_OK);
        cut.seq = sg;
        assert_int_equal(devio_apply(gpu, &cut, &o, &err), DEVIO_OK);
    }
    uint64_t back = devio_test_move(gpu, sg, true, ref);
    devio_test_steps_alike(gpu, sg, ref, back, 3, 20);
    devio_teardown(ref, NULL);
    devio_teardown(gpu, NULL);
    if (hybrid) { /* fast numerics move the same way on every model: once is enough */
        devio_fixture_free(&fx);
        return;
    }
    run_numerics = DEVIO_NUMERICS_FAST;
    devio_device *f1 = open_dev(&fx, &devio_cuda_backend, 2, NULL);
    devio_device *f2 = open_dev(&fx, &devio_cuda_backend, 1, NULL);
    run_numerics = DEVIO_NUMERICS_STRICT;
    uint64_t s1 = devio_test_seq(f1);
    free(devio_test_step(f1, s1, tok, 13, DEVIO_SNAP_NONE, DEVIO_OK));
    uint64_t s2 = devio_test_move(f1, s1, false, f2);
    devio_test_steps_alike(f1, s1, f2, s2, 3, 30);
    devio_teardown(f1, NULL);
    devio_teardown(f2, NULL);
    devio_fixture_free(&fx);
}

static void test_state_moves(void **state)
{
    (void)state;
    NEED_GPU();
    state_case("llama");
    state_case("bamba"); /* Mamba2's moves: the ssm_state_mamba2 suite on the GPU */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_text),
        cmocka_unit_test(test_plugin_loads),
        cmocka_unit_test(test_no_device),
        cmocka_unit_test(test_workload_on_reference),
        cmocka_unit_test(test_device_info),
        cmocka_unit_test(test_strict_f32),
        cmocka_unit_test(test_strict_bf16),
        cmocka_unit_test(test_strict_f16_lora),
        cmocka_unit_test(test_fast_bf16_lora),
        cmocka_unit_test(test_fast_f32),
        cmocka_unit_test(test_fast_gemv),
        cmocka_unit_test(test_fast_sampling),
        cmocka_unit_test(test_graphs),
        cmocka_unit_test(test_wide_bf16_tied),
        cmocka_unit_test(test_wide_f32),
        cmocka_unit_test(test_wide_f16),
        cmocka_unit_test(test_host_weights_released),
        cmocka_unit_test(test_hybrid_workload_on_reference),
        cmocka_unit_test(test_hybrid_refused),
        cmocka_unit_test(test_bamba_f32),
        cmocka_unit_test(test_fast_bamba_bf16_lora),
        cmocka_unit_test(test_bamba_bf16_lora),
        cmocka_unit_test(test_mamba2_f32),
        cmocka_unit_test(test_mamba2_f16_lora),
        cmocka_unit_test(test_features_on_reference),
        cmocka_unit_test(test_state_moves),
        FEATURE_TEST("test_mistral_window_f32", 0),
        FEATURE_TEST("test_mistral_window_bf16_lora", 1),
        FEATURE_TEST("test_granite_f32", 2),
        FEATURE_TEST("test_granite_f16_lora", 3),
        FEATURE_TEST("test_qwen3_f32", 4),
        FEATURE_TEST("test_qwen3_bf16_lora", 5),
        FEATURE_TEST("test_rope_yarn_bf16", 6),
        FEATURE_TEST("test_rope_llama3_f32", 7),
    };
    /* One case alone (run_without_device), by its name. */
    const char *only = getenv("DEVIO_CUDA_TEST_ONLY");
    if (only)
        cmocka_set_test_filter(only);
    return devio_run_tests("cuda_test", tests, sizeof tests / sizeof tests[0], NULL, NULL);
}

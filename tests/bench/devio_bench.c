/* devio_bench.c - devio-bench: decode and prefill speed of the reference device.
 * Measures the machine's read bandwidth in the same run and reports decode as a
 * fraction of it. A benchmark, not a test: it prints figures and asserts nothing. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/clock.h"
#include "device/backend/backend.h"
#include "device/model/model.h"
#include "ref/builtin.h"
#include "tools/mkmodel/mkmodel.h"

typedef uint64_t v8u __attribute__((vector_size(64)));


/* ---- read bandwidth ------------------------------------------------------ */

typedef struct bw_job {
    const v8u *p;
    size_t n;
    uint64_t sink;
} bw_job;

static void *bw_read(void *arg)
{
    bw_job *j = arg;
    v8u a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        a += j->p[i];
        b += j->p[i + 1];
        c += j->p[i + 2];
        d += j->p[i + 3];
    }
    a += b + c + d;
    for (int k = 0; k < 8; k++)
        j->sink += a[k];
    return NULL;
}

/* Best of several passes over a buffer much larger than the caches, split across threads. */
static double read_bandwidth(uint32_t threads, size_t bytes)
{
    v8u *buf = aligned_alloc(64, bytes);
    if (!buf)
        return 0;
    memset(buf, 1, bytes);
    size_t n = bytes / sizeof(v8u);
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        pthread_t th[64];
        bw_job jobs[64];
        double t0 = devio_clock_s();
        for (uint32_t t = 0; t < threads; t++) {
            jobs[t] = (bw_job){.p = buf + n / threads * t, .n = n / threads};
            pthread_create(&th[t], NULL, bw_read, &jobs[t]);
        }
        for (uint32_t t = 0; t < threads; t++)
            pthread_join(th[t], NULL);
        double gbs = (double)bytes / (devio_clock_s() - t0) / 1e9;
        if (gbs > best)
            best = gbs;
    }
    free(buf);
    return best;
}

/* ---- the device ---------------------------------------------------------- */

static uint64_t weight_bytes(const devio_model *m)
{
    const devio_tensor *all[] = {&m->embed, &m->norm, &m->lm_head};
    uint64_t total = 0;
    for (int i = 0; i < 3; i++) {
        if (i == 2 && m->lm_head.data == m->embed.data)
            break;
        total += devio_tensor_bytes(all[i]);
    }
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const devio_layer *y = &m->layers[l];
        const devio_mixer *x = &y->mixer;
        const devio_tensor *t[] = {&y->attn_norm, &y->wq, &y->wk, &y->wv, &y->wo, &y->bq,
                                   &y->bk, &y->bv, &y->ffn_norm, &y->w_gate, &y->w_up,
                                   &y->w_down, &x->in_proj, &x->in_bias, &x->conv_w,
                                   &x->conv_b, &x->dt_bias, &x->a_log, &x->d_skip, &x->norm,
                                   &x->out_proj, &x->out_bias};
        for (size_t k = 0; k < sizeof t / sizeof *t; k++)
            total += devio_tensor_bytes(t[k]);
    }
    /* The embedding table is gathered, not streamed: count one row per token, i.e. none. */
    if (m->lm_head.data != m->embed.data)
        total -= devio_tensor_bytes(&m->embed);
    return total;
}

/* The model's shape, so that a figure says what it was measured on. */
static void print_shape(const devio_model *m)
{
    const devio_model_config *c = &m->cfg;
    uint32_t attn = 0;
    for (uint32_t l = 0; l < c->n_layers; l++)
        attn += m->layers[l].kind == DEVIO_LAYER_ATTENTION;
    printf("shape: %s, vocab %u, hidden %u, %u layers (%u attention, %u Mamba-2 mixers)",
           c->architecture, c->vocab_size, c->hidden_size, c->n_layers, attn, c->n_layers - attn);
    if (attn)
        printf(", %u heads of %u, %u kv heads", c->n_heads, c->head_dim, c->n_kv_heads);
    if (c->intermediate_size)
        printf(", ffn %u", c->intermediate_size);
    if (attn < c->n_layers)
        printf(", %u SSM heads of %u, state %u, %u groups, conv %u", c->ssm.n_heads,
               c->ssm.head_dim, c->ssm.d_state, c->ssm.n_groups, c->ssm.d_conv);
    printf("\n");
}

static int check(devio_status s, const devio_error *e, const char *what)
{
    if (s == DEVIO_OK)
        return 0;
    fprintf(stderr, "devio-bench: %s: %s: %s\n", what, devio_status_str(s), e->message);
    return -1;
}

/* Frees the benchmark's sequences (what a failure leaves is the process's end). */
static void free_seqs(devio_device *d, const uint64_t *seqs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        devio_effect fr = {.kind = DEVIO_EFFECT_FREE, .seq = seqs[i]};
        devio_outcome o;
        if (devio_apply(d, &fr, &o, NULL) == DEVIO_OK)
            devio_outcome_free(&o);
    }
}

/* n adapters a0.. of rank 16 on every projection of the model in model_dir,
 * written under a new temporary directory root (300 bytes), which cfg then
 * names; 0, or -1 with err filled. */
static int write_adapters(const char *model_dir, char *root, uint32_t n, devio_config *cfg,
                          devio_error *err)
{
    snprintf(root, 300, "/tmp/devio-bench-adapters-XXXXXX");
    if (!mkdtemp(root)) {
        root[0] = '\0';
        return -1;
    }
    cfg->adapters_root = root;
    cfg->max_loras = n;
    cfg->max_lora_rank = 16;
    for (uint32_t i = 0; i < n; i++) {
        char out[400];
        snprintf(out, sizeof out, "%s/a%u", root, i);
        devio_mkmodel_adapter_opts o = devio_mkmodel_adapter_opts_default();
        o.model_dir = model_dir;
        o.out_dir = out;
        o.rank = 16;
        o.alpha = 16;
        o.targets = (1u << DEVIO_LORA_N_TARGETS) - 1;
        o.seed = i + 1;
        if (check(devio_mkmodel_write_adapter(&o, err), err, "write adapter") < 0)
            return -1;
    }
    return 0;
}

/* The preset main wrote into dir, removed (dir "" for none). */
static void remove_model(const char *dir)
{
    if (!dir[0])
        return;
    char path[300];
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* What write_adapters wrote, removed (root "" for none). */
static void remove_adapters(const char *root, uint32_t n)
{
    for (uint32_t i = 0; root[0] && i < n; i++) {
        char path[400];
        const char *files[] = {"adapter_config.json", "adapter_model.safetensors", ""};
        for (int k = 0; k < 3; k++) {
            snprintf(path, sizeof path, "%s/a%u/%s", root, i, files[k]);
            (k < 2 ? unlink : rmdir)(path);
        }
    }
    if (root[0])
        rmdir(root);
}

/* Loads adapters a0.. by their directories' names. */
static int load_adapters(devio_device *d, uint32_t n, devio_error *err)
{
    for (uint32_t i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "a%u", i);
        devio_adapter_cmd cmd = {.kind = DEVIO_ADAPTER_CMD_LOAD, .name = name, .path = name};
        devio_adapter_ack ack;
        if (check(devio_adapter_command(d, &cmd, &ack, err), err, "load adapter") < 0)
            return -1;
        devio_adapter_ack_free(&ack);
    }
    return 0;
}

/* Decode `steps` steps at batch `batch` after a short prefill; tokens/s.
 * With n_adapters, row i runs adapter "a<i % n_adapters>". */
static double bench_decode(devio_device *d, uint32_t batch, uint32_t steps, uint32_t vocab,
                           uint32_t n_adapters)
{
    static const char *const names[] = {"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7"};
    uint64_t seqs[64];
    int32_t tok[64];
    devio_row rows[64];
    devio_error err = {0};
    devio_step_result r;
    uint64_t t;
    for (uint32_t i = 0; i < batch; i++) {
        if (check(devio_seq_create(d, &seqs[i], &err), &err, "create") < 0)
            return 0;
        int32_t prompt[16];
        for (int k = 0; k < 16; k++)
            prompt[k] = (int32_t)((i * 131u + (uint32_t)k * 7u + 1u) % vocab);
        rows[i] = (devio_row){.seq = seqs[i], .tokens = prompt, .n_tokens = 16,
                              .has_sample = true, .sample = {.temperature = 0, .top_p = 1},
                              .adapter = n_adapters ? names[i % n_adapters] : NULL};
        devio_plan p = {.rows = &rows[i], .n_rows = 1};
        if (check(devio_launch(d, &p, &t, &err), &err, "prefill") < 0 ||
            check(devio_await(d, t, -1, &r, &err), &err, "await") < 0)
            return 0;
        tok[i] = r.rows[0].token;
        devio_step_result_free(&r);
    }
    double t0 = devio_clock_s();
    for (uint32_t s = 0; s < steps; s++) {
        for (uint32_t i = 0; i < batch; i++)
            rows[i] = (devio_row){.seq = seqs[i], .tokens = &tok[i], .n_tokens = 1,
                                  .has_sample = true, .sample = {.temperature = 0, .top_p = 1},
                                  .adapter = n_adapters ? names[i % n_adapters] : NULL};
        devio_plan p = {.rows = rows, .n_rows = batch};
        if (check(devio_launch(d, &p, &t, &err), &err, "decode") < 0 ||
            check(devio_await(d, t, -1, &r, &err), &err, "await") < 0)
            return 0;
        for (uint32_t i = 0; i < batch; i++)
            tok[i] = r.rows[i].token;
        devio_step_result_free(&r);
    }
    double dt = devio_clock_s() - t0;
    free_seqs(d, seqs, batch);
    return (double)batch * steps / dt;
}

/* Decode of two groups of `half` sequences each, one plan per group, for
 * `steps` steps of each; tokens/s. depth 1: launch a group and await it,
 * then the other. depth 2: the next group is launched before the previous
 * one is awaited, so a backend that computes behind submit overlaps the
 * host's work on one group with the device's on the other. */
static double bench_overlap(devio_device *d, uint32_t half, uint32_t steps, uint32_t vocab,
                            uint32_t depth)
{
    uint64_t seqs[64];
    int32_t tok[64];
    devio_row rows[64];
    devio_error err = {0};
    devio_step_result r;
    uint32_t n = 2 * half;
    for (uint32_t i = 0; i < n; i++) {
        if (check(devio_seq_create(d, &seqs[i], &err), &err, "create") < 0)
            return 0;
        tok[i] = (int32_t)((i * 131u + 1u) % vocab);
    }
    uint64_t pending[2] = {0, 0};
    double t0 = devio_clock_s();
    for (uint32_t s = 0; s < 2 * steps; s++) {
        uint32_t g = s % 2, base = g * half;
        for (uint32_t i = 0; i < half; i++)
            rows[base + i] = (devio_row){.seq = seqs[base + i], .tokens = &tok[base + i],
                                         .n_tokens = 1, .has_sample = true,
                                         .sample = {.temperature = 0, .top_p = 1}};
        devio_plan p = {.rows = rows + base, .n_rows = half};
        /* The group's previous step must be done before its next launch. */
        if (pending[g]) {
            if (check(devio_await(d, pending[g], -1, &r, &err), &err, "await") < 0)
                return 0;
            for (uint32_t i = 0; i < half; i++)
                tok[base + i] = r.rows[i].token;
            devio_step_result_free(&r);
            pending[g] = 0;
        }
        if (check(devio_launch(d, &p, &pending[g], &err), &err, "decode") < 0)
            return 0;
        if (depth == 1) {
            if (check(devio_await(d, pending[g], -1, &r, &err), &err, "await") < 0)
                return 0;
            for (uint32_t i = 0; i < half; i++)
                tok[base + i] = r.rows[i].token;
            devio_step_result_free(&r);
            pending[g] = 0;
        }
    }
    for (uint32_t g = 0; g < 2; g++)
        if (pending[g] && check(devio_await(d, pending[g], -1, &r, &err), &err, "await") == 0)
            devio_step_result_free(&r);
    double dt = devio_clock_s() - t0;
    free_seqs(d, seqs, n);
    return (double)n * steps / dt;
}

/* One prefill of `n` tokens (logits of the last position); tokens/s. */
static double bench_prefill(devio_device *d, uint32_t n, uint32_t reps, uint32_t vocab)
{
    int32_t *prompt = malloc(n * sizeof *prompt);
    devio_error err = {0};
    double best = 0;
    for (uint32_t k = 0; k < n; k++)
        prompt[k] = (int32_t)((k * 7919u + 3u) % vocab);
    for (uint32_t rep = 0; rep < reps; rep++) {
        uint64_t s, t;
        devio_step_result r;
        if (check(devio_seq_create(d, &s, &err), &err, "create") < 0)
            break;
        devio_row row = {.seq = s, .tokens = prompt, .n_tokens = n,
                         .has_sample = true, .sample = {.temperature = 0, .top_p = 1}};
        devio_plan p = {.rows = &row, .n_rows = 1};
        double t0 = devio_clock_s();
        if (check(devio_launch(d, &p, &t, &err), &err, "prefill") < 0 ||
            check(devio_await(d, t, -1, &r, &err), &err, "await") < 0)
            break;
        double tps = n / (devio_clock_s() - t0);
        best = tps > best ? tps : best;
        devio_step_result_free(&r);
        free_seqs(d, &s, 1);
    }
    free(prompt);
    return best;
}

typedef struct flags {
    const char *model, *preset, *arch, *backend, *backend_path;
    int dtype; /* index into dtypes */
    int numerics; /* index into numerics_names: strict, fast */
    uint32_t threads, steps, overlap, adapters;
    double device_bw; /* GB/s measured elsewhere (the GPU check's probe), or 0 */
    uint32_t batches[4]; /* [0] = how many */
    uint32_t prefill[4]; /* [0] = how many */
    bool json;
    bool skip_weight_scan;
} flags;

static const char *const dtypes[] = {"bf16", "f16", "f32", NULL};
static const char *const numerics_names[] = {"strict", "fast", NULL};

/* "1,8,32": up to three numbers in lo..hi into b[1..], their count into b[0]. */
static bool parse_list(const char *v, uint32_t *b, unsigned long lo, unsigned long hi)
{
    uint32_t n = 0;
    while (*v) {
        char *end;
        unsigned long x = strtoul(v, &end, 10);
        if (end == v || x < lo || x > hi || n >= 3 || (*end && *end != ',') ||
            (*end == ',' && end[1] == '\0'))
            return false;
        b[++n] = (uint32_t)x;
        v = *end ? end + 1 : end;
    }
    b[0] = n;
    return n > 0;
}

static bool parse_batches(const char *v, void *field)
{
    return parse_list(v, field, 1, 64);
}

/* The device is opened with at most 4096 positions. */
static bool parse_prefill(const char *v, void *field)
{
    return parse_list(v, field, 1, 4032);
}

#define F(f) offsetof(flags, f)
static const devio_opt opts[] = {
    {.flag = "model", .type = DEVIO_OPT_STR, .offset = F(model), .metavar = "DIR",
     .help = "model directory [the preset, written to a temp dir]"},
    {.flag = "preset", .type = DEVIO_OPT_STR, .offset = F(preset), .metavar = "NAME",
     .help = "bench|small|tiny|1b [bench]"},
    {.flag = "arch", .type = DEVIO_OPT_STR, .offset = F(arch), .metavar = "ARCH",
     .help = "llama|bamba|mamba2: the preset's architecture [llama]"},
    {.flag = "dtype", .type = DEVIO_OPT_CHOICE, .offset = F(dtype), .metavar = "bf16|f16|f32",
     .help = "weight type of the preset [bf16]", .choices = dtypes},
    {.flag = "backend", .type = DEVIO_OPT_STR, .offset = F(backend), .metavar = "NAME",
     .help = "ref, auto, or a plugin's name [ref]"},
    {.flag = "backend-path", .type = DEVIO_OPT_STR, .offset = F(backend_path), .metavar = "DIR",
     .help = "where backend plugins are [next to this binary]"},
    {.flag = "numerics", .type = DEVIO_OPT_CHOICE, .offset = F(numerics),
     .metavar = "strict|fast", .help = "the backend's numerics [strict]",
     .choices = numerics_names},
    {.flag = "threads", .type = DEVIO_OPT_U32, .offset = F(threads), .metavar = "N",
     .help = "compute threads, 1..64 [2]"},
    {.flag = "steps", .type = DEVIO_OPT_U32, .offset = F(steps), .metavar = "N",
     .help = "decode steps per batch size [32]"},
    {.flag = "prefill", .type = DEVIO_OPT_CUSTOM, .offset = F(prefill), .metavar = "LIST",
     .help = "prompt tokens of each prefill run, up to three in 1..4032 [512]",
     .parse = parse_prefill},
    {.flag = "batches", .type = DEVIO_OPT_CUSTOM, .offset = F(batches), .metavar = "LIST",
     .help = "decode batch sizes, up to three in 1..64 [1,8,32]", .parse = parse_batches},
    {.flag = "overlap", .type = DEVIO_OPT_U32, .offset = F(overlap), .metavar = "N",
     .help = "also decode two groups of N/2 at depth 1 and depth 2, 0 = not [0]"},
    {.flag = "adapters", .type = DEVIO_OPT_U32, .offset = F(adapters), .metavar = "N",
     .help = "also decode with N (up to 8) LoRA adapters of rank 16 on every projection, "
             "rows spread over them, beside none (a model directory) [0]"},
    {.flag = "device-bw", .type = DEVIO_OPT_F64, .offset = F(device_bw), .metavar = "GBS",
     .help = "the device's read bandwidth, measured apart (a GPU): decode is compared with it"},
    {.flag = "json", .type = DEVIO_OPT_BOOL, .offset = F(json),
     .help = "print the figures as one JSON object instead of lines of text"},
    {.flag = "skip-weight-scan", .type = DEVIO_OPT_BOOL, .offset = F(skip_weight_scan),
     .help = "load the model without scanning its weights for NaN and infinities"},
};
#undef F

static const devio_cli cli = {
    .prog = "devio-bench",
    .usage = "usage: devio-bench [--model DIR | --preset bench|small|tiny|1b [--arch A]] "
             "[options]\n"
             "Writes the preset to a temp dir unless --model is given, measures the read\n"
             "bandwidth, then decode at each batch size and a prefill of each length. Prints\n"
             "figures; asserts nothing.",
    .opts = opts,
    .n_opts = sizeof opts / sizeof *opts,
};

/* What one run measured, printed as text or as JSON at the end. */
typedef struct results {
    double bw;
    uint64_t weight_bytes;
    double decode[3];  /* tokens/s at f->batches[1 + k] */
    double prefill[3]; /* tokens/s at f->prefill[1 + k] */
    double overlap[2]; /* depth 1, depth 2; when f->overlap >= 2 */
    double adapted[3]; /* tokens/s at f->batches[1 + k] with f->adapters adapters */
} results;

/* A JSON string: quotes, backslashes and control characters escaped. */
static void print_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void print_json(const flags *f, const devio_device_info *info, const devio_model *m,
                       const char *model, const results *r)
{
    printf("{\"backend\": ");
    print_json_str(info->backend);
    printf(", \"device\": ");
    print_json_str(info->device);
    printf(", \"model\": ");
    print_json_str(model);
    printf(", \"dtype\": \"%s\", \"threads\": %u, \"steps\": %u, \"weight_bytes\": %llu, "
           "\"read_bw_gbs\": %.3f, \"read_bw_given\": %s, \"decode\": [",
           devio_dtype_str(m->embed.dtype), f->threads, f->steps,
           (unsigned long long)r->weight_bytes, r->bw, f->device_bw > 0 ? "true" : "false");
    for (uint32_t k = 0; k < f->batches[0]; k++)
        printf("%s{\"batch\": %u, \"tok_s\": %.3f}", k ? ", " : "", f->batches[1 + k],
               r->decode[k]);
    printf("], \"prefill\": [");
    for (uint32_t k = 0; k < f->prefill[0]; k++)
        printf("%s{\"tokens\": %u, \"tok_s\": %.3f}", k ? ", " : "", f->prefill[1 + k],
               r->prefill[k]);
    printf("]");
    if (f->adapters > 0) {
        printf(", \"adapters\": %u, \"decode_adapted\": [", f->adapters);
        for (uint32_t k = 0; k < f->batches[0]; k++)
            printf("%s{\"batch\": %u, \"tok_s\": %.3f}", k ? ", " : "", f->batches[1 + k],
                   r->adapted[k]);
        printf("]");
    }
    if (f->overlap >= 2)
        printf(", \"overlap\": {\"groups_of\": %u, \"depth1_tok_s\": %.3f, "
               "\"depth2_tok_s\": %.3f}",
               f->overlap / 2 > 32 ? 32 : f->overlap / 2, r->overlap[0], r->overlap[1]);
    printf("}\n");
}

int main(int argc, char **argv)
{
    flags f = {.preset = "bench", .arch = "llama", .backend = "ref", .threads = 2, .steps = 32,
               .prefill = {1, 512}, .batches = {3, 1, 8, 32}};
    devio_cli_result cr = devio_cli_parse(&cli, &f, argc, argv, NULL, NULL, stdout, stderr);
    if (cr != DEVIO_CLI_OK)
        return cr == DEVIO_CLI_EXIT ? 0 : 2;
    if (f.threads == 0 || f.threads > 64 || f.steps == 0 || f.adapters > 8) {
        fprintf(stderr, "devio-bench: --threads must be in 1..64, --steps > 0, --adapters <= 8\n");
        return 2;
    }
    const char *model_dir = f.model, *preset = f.preset;
    uint32_t threads = f.threads, steps = f.steps;
    uint32_t n_batches = f.batches[0], *batches = f.batches + 1;
    uint32_t n_prefill = f.prefill[0], *prefill = f.prefill + 1, longest = 0;
    for (uint32_t k = 0; k < n_prefill; k++)
        longest = prefill[k] > longest ? prefill[k] : longest;
    devio_error err = {0};
    char tmp[256] = "";
    if (!model_dir) {
        devio_mkmodel_opts o = devio_mkmodel_opts_default();
        o.arch = f.arch;
        if (check(devio_mkmodel_preset(preset, &o, &err), &err, "preset") < 0)
            return 2;
        static const devio_dtype types[] = {DEVIO_BF16, DEVIO_F16, DEVIO_F32};
        o.dtype = types[f.dtype];
        snprintf(tmp, sizeof tmp, "/tmp/devio-bench-XXXXXX");
        if (!mkdtemp(tmp))
            return 1;
        o.out_dir = tmp;
        if (check(devio_mkmodel_write(&o, &err), &err, "write model") < 0)
            return 1;
        model_dir = tmp;
    }
    devio_model *m = NULL;
    devio_model_params mp = devio_model_params_default();
    mp.skip_weight_scan = f.skip_weight_scan;
    if (check(devio_model_load_with(model_dir, &mp, &m, &err), &err, "load") < 0)
        return 1;
    devio_config cfg = devio_config_default();
    cfg.threads = threads;
    cfg.max_seqs = 64;
    /* Decode runs up to 64 sequences of at most 1024 positions; a prefill
     * past them one more sequence of up to 4096. */
    cfg.max_seq_len = longest + 64;
    uint32_t short_len = cfg.max_seq_len > 1024 ? 1024 : cfg.max_seq_len;
    cfg.kv_blocks = 64 * ((short_len + 15) / 16) +
                    (cfg.max_seq_len > 1024 ? (cfg.max_seq_len + 15) / 16 : 0);
    cfg.max_batch_tokens = longest > 64 ? longest : 64;
    cfg.numerics = f.numerics == 1 ? DEVIO_NUMERICS_FAST : DEVIO_NUMERICS_STRICT;
    char adapters[300] = "";
    if (f.adapters > 0 && write_adapters(model_dir, adapters, f.adapters, &cfg, &err) < 0)
        return 1;
    devio_device *d = NULL;
    devio_registry reg;
    const devio_backend_ops *ops = NULL;
    devio_registry_builtin(&reg, f.backend_path);
    reg.numerics = cfg.numerics; /* auto under fast takes the cpu backend */
    if (check(devio_registry_find(&reg, f.backend, &ops, &err), &err, "backend") < 0 ||
        check(devio_open(m, ops, &cfg, &d, &err), &err, "open") < 0 ||
        load_adapters(d, f.adapters, &err) < 0)
        return 1;

    results r = {0};
    r.bw = f.device_bw > 0 ? f.device_bw : read_bandwidth(threads, (size_t)1 << 30);
    double bw = r.bw;
    uint64_t wb = r.weight_bytes = weight_bytes(m);
    devio_device_info info;
    devio_device_info_get(d, &info);
    const char *model_name = model_dir == tmp ? preset : model_dir;
    if (!f.json) {
        printf("devio-bench: backend %s (%s numerics) on %s\n", info.backend,
               devio_numerics_str(info.numerics), info.device);
        printf("devio-bench: model %s (%s), %.1f MB of weights streamed per step, %u threads\n",
               model_name, devio_dtype_str(m->embed.dtype), wb / 1e6, threads);
        print_shape(m);
        if (f.device_bw > 0)
            printf("read bandwidth: %.2f GB/s (the device's, as given by --device-bw)\n", bw);
        else
            printf("read bandwidth: %.2f GB/s (best of 5 passes over 1 GiB, %u threads)\n", bw,
                   threads);
    }
    for (uint32_t k = 0; k < n_batches; k++) {
        double tps = r.decode[k] = bench_decode(d, batches[k], steps, m->cfg.vocab_size, 0);
        double steps_s = tps / batches[k];
        double gbs = steps_s * (double)wb / 1e9;
        if (!f.json)
            printf("decode batch %2u: %8.1f tokens/s  %6.2f steps/s  weights %.2f GB/s = %.0f%% "
                   "of read bandwidth\n",
                   batches[k], tps, steps_s, gbs, 100.0 * gbs / bw);
    }
    for (uint32_t k = 0; k < n_batches && f.adapters > 0; k++) {
        double tps = r.adapted[k] =
            bench_decode(d, batches[k], steps, m->cfg.vocab_size, f.adapters);
        if (!f.json)
            printf("decode batch %2u, %u adapters: %8.1f tokens/s = %.2fx the time of none\n",
                   batches[k], f.adapters, tps, tps > 0 ? r.decode[k] / tps : 0.0);
    }
    if (f.overlap >= 2) {
        uint32_t half = f.overlap / 2 > 32 ? 32 : f.overlap / 2;
        double d1 = r.overlap[0] = bench_overlap(d, half, steps, m->cfg.vocab_size, 1);
        double d2 = r.overlap[1] = bench_overlap(d, half, steps, m->cfg.vocab_size, 2);
        if (!f.json)
            printf("decode 2 groups of %u: depth 1 %.1f tokens/s, depth 2 %.1f tokens/s = "
                   "%.2fx\n",
                   half, d1, d2, d1 > 0 ? d2 / d1 : 0.0);
    }
    for (uint32_t k = 0; k < n_prefill; k++) {
        r.prefill[k] = bench_prefill(d, prefill[k], 3, m->cfg.vocab_size);
        if (!f.json)
            printf("prefill %u tokens: %.1f tokens/s\n", prefill[k], r.prefill[k]);
    }
    if (f.json)
        print_json(&f, &info, m, model_name, &r);
    devio_teardown(d, NULL);
    devio_registry_close(&reg);
    devio_model_free(m);
    remove_model(tmp);
    remove_adapters(adapters, f.adapters);
    return 0;
}

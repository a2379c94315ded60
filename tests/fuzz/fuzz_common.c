/* fuzz_common.c - the scratch directory, micro model and device of fuzz_common.h.
 * It must stay deterministic: the same input always meets the same files and the same fresh device. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "tests/fuzz/fuzz_common.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/adapter/adapter.h"
#include "ref/ref_backend.h"
#include "tools/mkmodel/mkmodel.h"

static char dir[256];
static devio_model *model;

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)flag;
    (void)f;
    return remove(p);
}

static void cleanup(void)
{
    devio_model_free(model);
    model = NULL;
    if (dir[0])
        nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void die(const char *what, const devio_error *err)
{
    fprintf(stderr, "fuzz setup: %s: %s\n", what, err ? err->message : strerror(errno));
    abort();
}

const char *fuzz_path(const char *rel)
{
    static char bufs[4][512];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", fuzz_dir(), rel);
    return b;
}

void fuzz_mkdir(const char *rel)
{
    if (mkdir(fuzz_path(rel), 0755) != 0 && errno != EEXIST)
        die(rel, NULL);
}

void fuzz_write(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(path, NULL);
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, (const char *)data + done, n - done);
        if (w <= 0)
            die(path, NULL);
        done += (size_t)w;
    }
    close(fd);
}

const char *fuzz_dir(void)
{
    if (dir[0])
        return dir;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/devio-fuzz-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir))
        die("mkdtemp", NULL);
    atexit(cleanup);
    devio_mkmodel_opts o = devio_mkmodel_opts_default();
    o.vocab_size = 32;
    o.hidden_size = 16;
    o.intermediate_size = 32;
    o.n_layers = 1;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.head_dim = 8;
    o.max_position_embeddings = 64;
    o.seed = 7;
    o.out_dir = fuzz_path("model");
    devio_error err = {0};
    if (devio_mkmodel_write(&o, &err) != DEVIO_OK)
        die("devio_mkmodel_write", &err);
    devio_mkmodel_adapter_opts a = devio_mkmodel_adapter_opts_default();
    a.model_dir = fuzz_path("model");
    a.out_dir = fuzz_path("adapters/a");
    a.rank = 2;
    a.alpha = 4.0;
    a.seed = 3;
    if (devio_mkmodel_write_adapter(&a, &err) != DEVIO_OK)
        die("devio_mkmodel_write_adapter", &err);
    return dir;
}

const devio_model *fuzz_model(void)
{
    if (model)
        return model;
    devio_error err = {0};
    if (devio_model_load(fuzz_path("model"), &model, &err) != DEVIO_OK)
        die("devio_model_load", &err);
    return model;
}

devio_device *fuzz_device_open(void)
{
    const devio_model *m = fuzz_model();
    devio_config c = devio_config_default();
    c.threads = 1;
    c.use_worker_thread = false;
    c.max_seqs = 8;
    c.max_seq_len = 64;
    c.kv_blocks = 16;
    c.block_size = 8;
    c.max_rows = 8;
    c.max_batch_tokens = 64;
    c.logits_handles = 8;
    c.logits_rows = 32;
    c.max_loras = 2;
    c.max_lora_rank = 4;
    static char root[512];
    snprintf(root, sizeof root, "%s", fuzz_path("adapters"));
    c.adapters_root = root;
    devio_device *d = NULL;
    devio_error err = {0};
    if (devio_open(m, &devio_ref_backend, &c, &d, &err) != DEVIO_OK)
        die("devio_open", &err);
    return d;
}

/* fuzz_state.c - libFuzzer target: a sequence's state import (devio.h, docs/state.md) on a fresh
 * reference device, with states a fuzzer could not find alone: each input makes a real state
 * and then damages it.
 * Input: byte 0 - a prompt length (1..40) and flags; the next bytes, the prompt's tokens (as
 * many as there are, the rest zeros); then 4-byte edits (offset 16 bits, xor mask, spare).
 * The state of that prompt is exported, edited, its checksum made right again when flag 1 asks
 * (so that the edits reach the header and unit checks behind it), cut by the last byte when
 * flag 2 asks, then imported in pieces of 1 + byte 1 % 97 bytes. An import that succeeds must
 * take a step. Nothing the bytes say may crash, leak or leave the device holding anything. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/sum64.h"
#include "tests/fuzz/fuzz_common.h"

static uint8_t *export_all(devio_device *d, uint64_t seq, size_t *n)
{
    devio_export *x = NULL;
    uint64_t total = 0;
    devio_error err = {0};
    if (devio_export_open(d, seq, true, &x, &total, &err) != DEVIO_OK)
        abort(); /* a fresh sequence always exports: a broken harness */
    uint8_t *b = malloc((size_t)total);
    size_t got = 0, k = 1;
    while (k > 0 && got < total)
        if (devio_export_read(x, b + got, (size_t)total - got, &k, &err) != DEVIO_OK)
            abort();
        else
            got += k;
    devio_export_close(x);
    *n = got;
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    devio_device *d = fuzz_device_open();
    uint32_t vocab = fuzz_model()->cfg.vocab_size, len = 1 + data[0] % 40;
    uint32_t flags = data[0] / 40, piece = 1 + data[1] % 97;
    int32_t tok[40] = {0};
    for (uint32_t i = 0; i < len && 2 + i < size; i++)
        tok[i] = (int32_t)(data[2 + i] % vocab);
    uint64_t seq = 0, ticket = 0;
    devio_row row = {.tokens = tok, .n_tokens = len, .logits = DEVIO_LOGITS_NONE};
    devio_plan plan = {.rows = &row, .n_rows = 1};
    devio_step_result r;
    devio_error err = {0};
    if (devio_seq_create(d, &seq, &err) != DEVIO_OK)
        abort();
    row.seq = seq;
    if (devio_launch(d, &plan, &ticket, &err) != DEVIO_OK ||
        devio_await(d, ticket, -1, &r, &err) != DEVIO_OK)
        abort();
    devio_step_result_free(&r);
    devio_facts before = devio_facts_get(d);
    size_t n;
    uint8_t *b = export_all(d, seq, &n);
    for (size_t at = 2 + len; at + 4 <= size; at += 4)
        b[((size_t)data[at] | (size_t)data[at + 1] << 8) % n] ^= data[at + 2];
    if (flags & 1u) {
        devio_sum64 s;
        devio_sum64_init(&s, 0);
        devio_sum64_update(&s, b, n - 8);
        uint64_t v = devio_sum64_final(&s);
        for (int i = 0; i < 8; i++)
            b[n - 8 + i] = (uint8_t)(v >> (8 * i));
    }
    if (flags & 2u)
        n -= data[size - 1] % n;
    devio_import *m = NULL;
    devio_status st = devio_import_open(d, (flags & 4u) ? n / 2 : 0, &m, &err);
    for (size_t at = 0; st == DEVIO_OK && at < n; at += piece)
        st = devio_import_write(m, b + at, n - at < piece ? n - at : piece, &err);
    uint64_t got = 0;
    if (st == DEVIO_OK)
        st = devio_import_finish(m, &got, &err);
    devio_import_close(m);
    if (st == DEVIO_OK) {
        int32_t t = 1;
        devio_row next = {.seq = got, .tokens = &t, .n_tokens = 1, .logits = DEVIO_LOGITS_LAST};
        devio_plan p2 = {.rows = &next, .n_rows = 1};
        if (devio_launch(d, &p2, &ticket, &err) == DEVIO_OK &&
            devio_await(d, ticket, -1, &r, &err) == DEVIO_OK)
            devio_step_result_free(&r);
    } else {
        /* A refused import holds nothing. */
        devio_facts after = devio_facts_get(d);
        if (after.blocks_free != before.blocks_free || after.seqs_live != before.seqs_live ||
            after.ssm_slots_used != before.ssm_slots_used)
            abort();
    }
    free(b);
    devio_teardown(d, NULL);
    return 0;
}

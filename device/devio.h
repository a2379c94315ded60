/* devio.h - the DeviceIo interface in C: one device, one model, batched steps.
 * Backend-neutral; never includes HTTP, JSON or SQL. Every number is in host order.
 *
 * Threads: devio_launch and devio_await may be called from different threads
 * at once; every other call is serialised by the device's own lock. A step
 * runs on the device's worker thread (native) or inside devio_await (builds
 * without threads); its numbers are the same either way.
 *
 * Failure rule: a call that returns anything but DEVIO_OK changes nothing
 * that a later call can observe, and fills the caller's devio_error when one
 * is given. */
#ifndef DEVIO_DEVIO_H
#define DEVIO_DEVIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The one status enum, one numbering for every layer (device/status.c names
 * each code). The device returns the codes up to DEVIO_E_DEVICE; the codes
 * after it are returned only by the server, and are documented with the
 * server (service/http/http_error.h). */
typedef enum devio_status {
    DEVIO_OK = 0,
    DEVIO_E_INVALID,          /* malformed plan, effect or parameter */
    DEVIO_E_UNKNOWN_SEQ,      /* no such sequence */
    DEVIO_E_UNKNOWN_TICKET,   /* no such ticket */
    DEVIO_E_UNKNOWN_LOGITS,   /* no such logits handle */
    DEVIO_E_UNKNOWN_ADAPTER,  /* a plan or command names an adapter not loaded */
    DEVIO_E_SEQ_BUSY,         /* the sequence is in a ticket not yet awaited */
    DEVIO_E_DEPTH_EXCEEDED,   /* max_depth tickets already in flight */
    DEVIO_E_TICKET_CONSUMED,  /* the ticket was already awaited */
    DEVIO_E_TICKET_PENDING,   /* the await's timeout passed first; await again */
    DEVIO_E_OUT_OF_KV_BLOCKS, /* the plan needs more KV blocks than are free */
    DEVIO_E_OUT_OF_LOGITS,    /* no free logits handle or rows */
    DEVIO_E_OUT_OF_SEQS,      /* the sequence table is full */
    DEVIO_E_OUT_OF_SSM_SLOTS, /* no free SSM state slot */
    DEVIO_E_OUT_OF_SNAPSHOTS, /* no free SSM snapshot slot */
    DEVIO_E_NO_SNAPSHOT,      /* truncate to a length with no SSM snapshot */
    DEVIO_E_ADAPTER_CAPACITY, /* max_loras loaded and none evictable */
    DEVIO_E_UNSUPPORTED,      /* a feature this model or build lacks */
    DEVIO_E_TOO_LARGE,        /* a plan over max_rows, max_batch_tokens or max_seq_len */
    DEVIO_E_TORN_DOWN,        /* the device was torn down */
    DEVIO_E_MODEL,            /* model files missing or malformed */
    DEVIO_E_IO,               /* a file system error */
    DEVIO_E_NOMEM,            /* an allocation failed */
    DEVIO_E_DEVICE,           /* the backend failed */
    /* The server's own codes (service/http/http_error.h). */
    DEVIO_E_UNAUTHORIZED,
    DEVIO_E_NOT_FOUND,
    DEVIO_E_METHOD,
    DEVIO_E_NOT_READY,
    DEVIO_E_STORE_UNAVAILABLE,
    DEVIO_E_BAD_FRAMING,
    DEVIO_E_TOO_MANY_CONNECTIONS,
    DEVIO_E_MEDIA_TYPE,
    DEVIO_E_TICKET_REAPED,
    DEVIO_E_KEY_IN_USE,
    DEVIO_E_KEY_REUSED,
    DEVIO_STATUS_COUNT
} devio_status;

/* Stable snake_case code, e.g. "out_of_kv_blocks". Never NULL. */
const char *devio_status_str(devio_status s);
/* Inverse of devio_status_str; unknown codes map to DEVIO_E_DEVICE. */
devio_status devio_status_parse(const char *code);

/* A status with a human message and one optional detail pair.
 * Filled by the failing call; caller-owned storage. */
typedef struct devio_error {
    devio_status status;
    char message[256];
    char detail_key[32]; /* "" when none, e.g. "row" */
    int64_t detail_val;
    uint64_t ticket;     /* beside detail_key: the ticket an answer names (seq_busy's
                            blocking ticket), 0 when none; details.ticket on the wire */
} devio_error;

typedef struct devio_model devio_model;   /* device/model/model.h */
typedef struct devio_device devio_device; /* opaque */

/* Top logprobs a sample may ask for with each token. */
#define DEVIO_TOP_LOGPROBS_MAX 20u

/* A sample: the one record that goes from a request to the sampler
 * (device/sample/sampler.h defines every step): the draw (temperature, top_k,
 * top_p, min_p, seed), the logit processing before it (step 0b: bias, masks,
 * penalties) and the top logprobs reported with it (step 1b). Every pointer
 * is borrowed for the call that takes it (a launch copies the arrays into its
 * ticket). devio_sample_params_default() asks for a draw at temperature 1
 * and nothing else. */
typedef struct devio_sample_params {
    float temperature; /* 0 = greedy */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
    const int32_t *bias_ids;  /* logit_bias: n_bias (token id, additive bias) pairs */
    const float *bias;
    uint32_t n_bias;
    const uint32_t *allowed;  /* allowed_tokens: (vocab + 31) / 32 words, bit i % 32 of word
                                 i / 32 set when token i may be drawn; NULL: every token */
    uint32_t allowed_words;
    const int32_t *banned;    /* banned_tokens */
    uint32_t n_banned;
    float repetition_penalty; /* > 0; 1 or 0 (unset) = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint32_t penalty_from;    /* the penalties count the sequence's tokens at positions
                                 >= this one (0: the prompt too) */
    uint32_t logprobs;        /* top-n logprobs with each sampled token, <= DEVIO_TOP_LOGPROBS_MAX */
} devio_sample_params;

devio_sample_params devio_sample_params_default(void);

/* Which SSM snapshots a plan row takes. Attention-only models accept both
 * and hold nothing (their KV cache is the whole state). */
typedef enum devio_snapshot {
    DEVIO_SNAP_NONE = 0,
    DEVIO_SNAP_END,  /* one snapshot at the row's new length */
    DEVIO_SNAP_EACH, /* one after every token of the row (speculative decoding) */
} devio_snapshot;

/* Snapshots a row of n_tokens takes in mode s. */
static inline uint32_t devio_snapshots_of(devio_snapshot s, uint32_t n_tokens)
{
    return s == DEVIO_SNAP_EACH ? n_tokens : s == DEVIO_SNAP_END ? 1u : 0u;
}

typedef enum devio_logits_mode {
    DEVIO_LOGITS_NONE = 0,
    DEVIO_LOGITS_LAST,
    DEVIO_LOGITS_ALL,
} devio_logits_mode;

/* One row of a step plan. All pointers are borrowed for the call only. */
typedef struct devio_row {
    uint64_t seq;
    const int32_t *tokens;
    uint32_t n_tokens;
    devio_logits_mode logits;
    const char *adapter; /* NULL = base model */
    bool has_sample;     /* sample the last position with `sample` */
    devio_sample_params sample;
    bool prompt_logprobs; /* the raw logprob of each token of the row given those before it
                             (the first token's is NaN: its context is not in this step) */
    devio_snapshot snapshot; /* SSM snapshots this row takes (hybrid models) */
} devio_row;

typedef struct devio_plan {
    const devio_row *rows;
    uint32_t n_rows;
} devio_plan;

/* Per-row result of a settled step. */
typedef struct devio_row_result {
    uint64_t seq;
    uint32_t len;        /* sequence length after the step */
    uint64_t logits;     /* handle, 0 when none was asked for */
    bool sampled;
    int32_t token;       /* valid when sampled */
    float logprob;       /* log-softmax of the raw logits at the token */
    const float *prompt_logprobs; /* row.prompt_logprobs: n_prompt values, [0] NaN; into the
                                     result's prompt_buf; NULL otherwise */
    uint32_t n_prompt;
    uint32_t n_top;      /* proc->logprobs: the top ids by raw logit, with their logprobs */
    int32_t top_ids[DEVIO_TOP_LOGPROBS_MAX];
    float top_logprobs[DEVIO_TOP_LOGPROBS_MAX];
} devio_row_result;

/* Result of devio_await. Caller frees with devio_step_result_free(). */
typedef struct devio_step_result {
    uint64_t ticket;
    uint32_t n_rows;
    devio_row_result *rows;
    uint64_t queued_us;  /* launch to start of compute */
    uint64_t compute_us; /* compute of the step */
    uint32_t n_tokens;   /* tokens processed by the step */
    float *prompt_buf;   /* owned: the rows' prompt_logprobs */
} devio_step_result;

void devio_step_result_free(devio_step_result *r);

typedef enum devio_effect_kind {
    DEVIO_EFFECT_SAMPLE = 0,
    DEVIO_EFFECT_FORK,
    DEVIO_EFFECT_TRUNCATE,
    DEVIO_EFFECT_SNAPSHOT,
    DEVIO_EFFECT_FREE,
    DEVIO_EFFECT_RELEASE,
    DEVIO_EFFECT_PARK,    /* the sequence's state to host memory, its blocks and slots freed */
    DEVIO_EFFECT_RESTORE, /* a parked sequence's state back into the pool */
} devio_effect_kind;

typedef struct devio_effect {
    devio_effect_kind kind;
    uint64_t seq;        /* fork, truncate, snapshot, free, park, restore; release: drop its
                            snapshots */
    uint32_t len;        /* truncate */
    uint64_t logits;     /* sample, release (one of logits and seq, not both) */
    bool has_row;        /* sample: one position; otherwise every position */
    uint32_t row;        /* sample: position index inside the handle */
    devio_sample_params params; /* sample; its penalties count the tokens of the handle's
                                   sequence before each sampled position */
} devio_effect;

/* Outcome of devio_apply. Caller frees with devio_outcome_free(). */
typedef struct devio_outcome {
    devio_effect_kind kind;
    uint64_t seq;          /* fork: the new sequence */
    uint32_t len;          /* snapshot: the length snapshotted */
    uint32_t shared_blocks;/* fork */
    uint32_t freed_blocks; /* truncate, free, park: blocks back to the pool (a block a fork
                              still holds stays with it and is not counted) */
    uint32_t freed_snapshots; /* truncate, free, park, release of a sequence's snapshots */
    uint64_t parked_bytes; /* park: host bytes the state now takes; restore: host bytes
                              given back */
    uint32_t freed_logits; /* free: the sequence's logits handles released with it */
    uint32_t n_tokens;     /* sample */
    int32_t *tokens;       /* sample; owned by the outcome */
    float *logprobs;       /* sample; owned by the outcome */
    uint32_t n_top;        /* sample: top logprobs per token (proc->logprobs) */
    int32_t *top_ids;      /* sample: n_tokens * n_top, token-major; owned; NULL when n_top 0 */
    float *top_logprobs;
} devio_outcome;

void devio_outcome_free(devio_outcome *o);

typedef struct devio_facts {
    uint32_t block_size, blocks_total, blocks_free, blocks_shared;
    uint32_t ssm_slots_total, ssm_slots_used, ssm_snapshots_total, ssm_snapshots_used;
    uint32_t tickets_in_flight, logits_live, adapters_loaded;
    uint32_t logits_rows_live; /* positions the live handles hold, of logits_rows */
    uint32_t seqs_live;        /* sequences created and not freed, of max_seqs */
    uint32_t seqs_parked;      /* of them, parked in host memory */
    uint64_t parked_bytes;     /* host bytes the parked states take, of park_memory_mib */
    uint64_t epoch;
} devio_facts;

/* Snapshot lengths a sequence's info lists (its count is always exact). */
#define DEVIO_SEQ_SNAPSHOTS_LISTED 64u

/* The state of one sequence: its length, blocks, ticket and snapshots. */
typedef struct devio_seq_info {
    uint64_t seq;
    uint32_t len, blocks;
    uint64_t busy_ticket; /* 0 when not busy */
    bool ssm_slot;         /* holds an SSM state slot (hybrid models, length > 0) */
    uint32_t n_snapshots;  /* snapshots held */
    /* their lengths, ascending, the first min(n_snapshots, DEVIO_SEQ_SNAPSHOTS_LISTED) */
    uint32_t snapshots[DEVIO_SEQ_SNAPSHOTS_LISTED];
    bool parked;           /* its state is in host memory (park); it holds no blocks or slots */
} devio_seq_info;

/* Adapter commands (devio_adapter_command). Applied at quiescence. */
typedef enum devio_adapter_cmd_kind {
    DEVIO_ADAPTER_CMD_LOAD = 0,
    DEVIO_ADAPTER_CMD_UNLOAD,
    DEVIO_ADAPTER_CMD_LIST,
    DEVIO_ADAPTER_CMD_PIN,
    DEVIO_ADAPTER_CMD_UNPIN,
} devio_adapter_cmd_kind;

typedef struct devio_adapter_cmd {
    devio_adapter_cmd_kind kind;
    const char *name; /* borrowed */
    const char *path; /* load: relative to the adapters root; borrowed */
    bool pin;         /* load: pin on load */
} devio_adapter_cmd;

/* Where an adapter record stands. The device says loaded (or unloaded, in
 * the acknowledgement of an unload); the store adds stale and failed. */
typedef enum devio_adapter_state {
    DEVIO_ADAPTER_LOADED = 0,
    DEVIO_ADAPTER_UNLOADED,
    DEVIO_ADAPTER_STALE,  /* recorded weights differ from the file at restart */
    DEVIO_ADAPTER_FAILED, /* the last load failed; reason says why */
    DEVIO_ADAPTER_STATE_COUNT
} devio_adapter_state;

/* Sizes of the record's strings, the NUL included. */
#define DEVIO_ADAPTER_NAME_MAX 64
#define DEVIO_ADAPTER_PATH_MAX 256
#define DEVIO_ADAPTER_TARGETS_MAX 128
#define DEVIO_ADAPTER_REASON_MAX 320

/* The one adapter record: what the device and every layer above it say
 * about an adapter (api/adapter_record.h has its helpers). Plain data with
 * its own storage: copy it, keep it, free nothing. The device fills every
 * field but the store's (loaded_ms, last_used_ms, reason), which it leaves 0. */
typedef struct devio_adapter_record {
    char name[DEVIO_ADAPTER_NAME_MAX];
    char path[DEVIO_ADAPTER_PATH_MAX]; /* relative to the adapters root */
    uint32_t rank;                     /* 0 when unknown (a failed load) */
    float alpha, scale;
    char targets[DEVIO_ADAPTER_TARGETS_MAX]; /* comma-separated modules, e.g. "q_proj,v_proj" */
    char sha256[65];                         /* hex of adapter_model.safetensors; "" when unknown */
    uint64_t size;                           /* bytes of adapter_model.safetensors */
    devio_adapter_state state;
    bool pinned;
    uint64_t rows_served;            /* plan rows launched with it since it loaded (device count) */
    int64_t loaded_ms, last_used_ms; /* unix ms; 0 when never */
    char reason[DEVIO_ADAPTER_REASON_MAX]; /* why it is failed/stale/unloaded; "" when none */
} devio_adapter_record;

/* Acknowledgement. Caller frees with devio_adapter_ack_free(). */
typedef struct devio_adapter_ack {
    devio_adapter_cmd_kind kind;
    uint32_t n_adapters;
    devio_adapter_record *adapters;       /* list: all loaded; others: the one touched */
    char evicted[DEVIO_ADAPTER_NAME_MAX]; /* load: name evicted to make room, or "" */
} devio_adapter_ack;

void devio_adapter_ack_free(devio_adapter_ack *a);

/* strict: every number bit-identical to the reference (device/numerics/numspec.h);
 * fast: a backend's own kernels, within a stated tolerance of it. */
typedef enum devio_numerics {
    DEVIO_NUMERICS_STRICT = 0,
    DEVIO_NUMERICS_FAST,
} devio_numerics;

/* "strict", "fast". */
const char *devio_numerics_str(devio_numerics n);
/* Inverse of devio_numerics_str; false for any other string. */
bool devio_numerics_parse(const char *s, devio_numerics *out);

/* The longest context max_seq_len 0 gives, however long the model's. */
#define DEVIO_MAX_SEQ_LEN_DEFAULT 131072u

/* ---- events (docs/state.md, "Events") -----------------------------------
 * What changed on the device that a router may want to know: a sequence made, freed,
 * parked, restored, exported or imported; a KV block filled (its whole prefix of tokens now
 * computed here) or given back; an adapter loaded or unloaded; the device failing. */
typedef enum devio_event_kind {
    DEVIO_EVENT_SEQ_CREATED = 0, /* create, or fork (parent set) */
    DEVIO_EVENT_SEQ_FREED,
    DEVIO_EVENT_SEQ_PARKED,
    DEVIO_EVENT_SEQ_RESTORED,
    DEVIO_EVENT_SEQ_EXPORTED,    /* an export read to its end */
    DEVIO_EVENT_SEQ_IMPORTED,
    DEVIO_EVENT_BLOCK_STORED,    /* a block became full: its prefix is here */
    DEVIO_EVENT_BLOCK_REMOVED,   /* a full block went back to the pool, or will be rewritten */
    DEVIO_EVENT_ADAPTER_LOADED,
    DEVIO_EVENT_ADAPTER_UNLOADED,
    DEVIO_EVENT_DEVICE_FAILED,
} devio_event_kind;

typedef struct devio_event {
    devio_event_kind kind;
    uint64_t seq;         /* sequence events; a stored block: the sequence that filled it */
    uint64_t parent;      /* a fork's parent, else 0 */
    uint32_t block;       /* block events: its index in the pool */
    uint32_t prefix_len;  /* block events: the tokens its prefix holds, (index + 1) * block_size */
    uint64_t prefix_hash; /* block events: devio_prefix_hash of those tokens */
    const char *name;     /* adapter events: its name; device failed: the message; borrowed */
} devio_event;

/* The hash of a token prefix that block events carry, chained block by block:
 * hash(block i) = devio_prefix_hash(hash(block i-1), its block_size tokens), with 0
 * before block 0. Each token is hashed as 4 little-endian bytes with common/sum64.h's sum
 * seeded by the previous hash. A router hashes a prompt's blocks the same way to find the
 * devices where its longest prefix already is. */
uint64_t devio_prefix_hash(uint64_t prev, const int32_t *tokens, uint32_t n);

/* Device configuration. Fill with devio_config_default() then override. */
typedef struct devio_config {
    uint32_t kv_blocks;        /* 0 = derive: 16 full-length sequences, within kv_memory_mib */
    uint32_t kv_memory_mib;    /* the derived pool's memory at most, MiB; 0 = 1024 */
    uint32_t block_size;       /* tokens per KV block, default 16 */
    uint32_t max_depth;        /* tickets in flight, default 2 */
    uint32_t max_seqs;         /* live sequences, default 256 */
    uint32_t max_seq_len;      /* 0 = the model's declared positions (at most 131072) */
    uint32_t max_rows;         /* rows per plan, default 64 */
    uint32_t max_batch_tokens; /* tokens per plan, default 2048 */
    uint32_t logits_handles;   /* live logits handles, default 64 */
    uint32_t logits_rows;      /* live logits positions over all handles, default 256 */
    uint32_t max_loras;        /* default 4 */
    uint32_t max_lora_rank;    /* default 64 */
    uint32_t ssm_slots;        /* SSM state slots (hybrid models), 0 = derive from memory */
    uint32_t ssm_snapshots;    /* SSM snapshot slots (hybrid models), 0 = derive from memory */
    uint32_t park_memory_mib;  /* host memory parked sequences may take, MiB; 0 = 1024 */
    const char *adapters_root; /* PEFT adapter directories live below it; borrowed, may be NULL
                                  (then loading adapters is refused) */
    uint32_t threads;          /* backend compute threads, 0 = all cores */
    devio_numerics numerics;   /* default strict; the backend refuses what it cannot keep */
    uint64_t epoch;            /* reported in facts; the server bumps it per start */
    uint64_t first_ticket_id;  /* ticket ids start here (unique across restarts) */
    uint64_t first_seq_id;     /* sequence ids start here; 0 = 1 */
    uint64_t first_logits_id;  /* logits handle ids start here; 0 = 1 */
    bool use_worker_thread;    /* false: steps run inside devio_await/devio_apply */
    /* Called on the worker thread, without the device lock, after each step
     * settles: an await of `ticket` would now answer at once. It must not
     * call the device and must return quickly (it delays the next step).
     * NULL: none. Called only with use_worker_thread. */
    void (*on_settled)(void *ctx, uint64_t ticket);
    void *on_settled_ctx;      /* borrowed; outlives the device */
    /* Called under the device lock each time a sequence id (create, fork) or
     * a logits handle id is handed out, with the highest of each handed out
     * so far, before any answer can name it: the server keeps a durable
     * high-water mark so that no id is handed out twice on one history file.
     * It must not call the device and must return at once. NULL: none. */
    void (*on_ids)(void *ctx, uint64_t seq_high, uint64_t logits_high);
    void *on_ids_ctx;          /* borrowed; outlives the device */
    /* Called under the device lock for every event, in order: it must copy what it keeps,
     * not call the device, and return at once (a step waits on it). NULL: none. */
    void (*on_event)(void *ctx, const devio_event *e);
    void *on_event_ctx;        /* borrowed; outlives the device */
} devio_config;

devio_config devio_config_default(void);

typedef struct devio_backend_ops devio_backend_ops; /* device/backend/backend.h */

/* What the device is: the backend actually running and what it says of
 * its hardware. */
typedef struct devio_device_info {
    char backend[32];            /* the backend's name: "ref", "cuda", ... */
    devio_numerics numerics;
    char device[128];            /* "x86-64 CPU, 2 threads", "NVIDIA H200" */
    uint64_t memory_total;       /* bytes of device memory; 0 for a CPU backend */
    uint64_t memory_free;
    uint64_t memory_used;        /* bytes the backend holds: KV pool, buffers, weight copies */
    char compute_capability[16]; /* "9.0"; "" for a CPU */
    char path[24];               /* the instruction-set path a CPU backend runs: "avx2" */
    uint32_t kv_elem_bytes;      /* bytes of one K or V element the backend keeps: 4
                                    (binary32) or 2 (binary16); 0 when it does not say */
    char driver[32], runtime[32];/* versions; "" for a CPU */
    char failure[200];           /* why the device can compute no more; "" while it can */
} devio_device_info;

/* Open a device on a loaded model with a backend. `model` is borrowed and
 * must outlive the device. On success *out is owned by the caller, who ends
 * it with devio_teardown(). On failure *out is NULL. */
devio_status devio_open(const devio_model *model, const devio_backend_ops *backend,
                        const devio_config *cfg, devio_device **out, devio_error *err);

/* Fill *out. Never fails on an open device. */
void devio_device_info_get(devio_device *d, devio_device_info *out);

/* The model behind the device; borrowed. */
const devio_model *devio_model_of(const devio_device *d);
const devio_config *devio_config_of(const devio_device *d);

devio_facts devio_facts_get(devio_device *d);
uint32_t devio_max_depth(const devio_device *d);

/* Create an empty sequence. */
devio_status devio_seq_create(devio_device *d, uint64_t *seq, devio_error *err);
devio_status devio_seq_info_get(devio_device *d, uint64_t seq, devio_seq_info *out,
                                devio_error *err);
/* Every live sequence, by id: the first cap of them into out (may be NULL
 * with cap 0), their count into *n. For a scheduler that lost its own record. */
devio_status devio_seq_list(devio_device *d, devio_seq_info *out, uint32_t cap, uint32_t *n,
                            devio_error *err);

/* ---- a sequence's state, exported and imported (docs/state.md) ---------
 * The state is one versioned, checksummed stream of bytes: the model's
 * fingerprint, the numerics and KV element, the tokens, the K and V of every
 * position held, the recurrent state of a hybrid model and, when asked, its
 * snapshots. It continues bit for bit on any device of the same model and
 * numbers. Both directions are cursors, so that neither side holds a long
 * sequence's state whole in memory. */
typedef struct devio_export devio_export;
typedef struct devio_import devio_import;

/* Begin exporting sequence `seq` (with its snapshots when `snapshots`). The
 * sequence is pinned until devio_export_close: a launch naming it or an
 * effect on it is refused DEVIO_E_SEQ_BUSY. DEVIO_E_SEQ_BUSY when a ticket
 * not yet awaited holds it; DEVIO_E_UNSUPPORTED when the backend cannot read
 * its state. *bytes: the stream's whole size. *out owned by the caller. */
devio_status devio_export_open(devio_device *d, uint64_t seq, bool snapshots, devio_export **out,
                               uint64_t *bytes, devio_error *err);
/* The next bytes of the stream, at most cap, into buf; *n is 0 at its end.
 * Waits for the steps in flight at each part it reads from the backend. */
devio_status devio_export_read(devio_export *x, void *buf, size_t cap, size_t *n,
                               devio_error *err);
/* Unpin the sequence and free x; x may be NULL. */
void devio_export_close(devio_export *x);

/* Begin importing a state of at most max_bytes (0: no limit) as a new
 * sequence. Nothing is visible until devio_import_finish succeeds. */
devio_status devio_import_open(devio_device *d, uint64_t max_bytes, devio_import **out,
                               devio_error *err);
/* Feed the next n bytes. The header is checked as soon as it is whole
 * (another model, numerics, KV element or version: DEVIO_E_INVALID; over
 * max_bytes: DEVIO_E_TOO_LARGE) and everything the sequence needs is then
 * reserved (DEVIO_E_OUT_OF_SEQS, _KV_BLOCKS, _SSM_SLOTS, _SNAPSHOTS); bytes
 * past the stream's end are refused. After a failure the import holds
 * nothing and every later call fails. */
devio_status devio_import_write(devio_import *m, const void *buf, size_t n, devio_error *err);
/* The stream whole and its checksum right: the sequence goes live, its id in
 * *seq. Otherwise DEVIO_E_INVALID and nothing is kept. Either way m stays
 * the caller's, to close. */
devio_status devio_import_finish(devio_import *m, uint64_t *seq, devio_error *err);
/* Free m, giving back whatever an unfinished import reserved; m may be NULL. */
void devio_import_close(devio_import *m);

/* Validate `plan`, reserve every KV block and logits handle it needs, and
 * queue it. On failure nothing is reserved. `plan` is copied; the caller may
 * free it as soon as this returns. */
devio_status devio_launch(devio_device *d, const devio_plan *plan, uint64_t *ticket,
                          devio_error *err);

/* Wait up to timeout_ms (< 0: forever) for `ticket` to settle, then return
 * its result once and end the ticket. DEVIO_E_TICKET_PENDING on timeout
 * leaves the ticket in flight. */
devio_status devio_await(devio_device *d, uint64_t ticket, int64_t timeout_ms,
                         devio_step_result *out, devio_error *err);

/* devio_launch in two halves, so that a caller can make the ticket durable
 * (its history row) between them without holding the device:
 * - reserve validates the plan and takes everything it needs and its ticket
 *   id, exactly as devio_launch, but submits nothing. The reserved ticket
 *   counts toward max_depth, makes its sequences busy, cannot be awaited
 *   (unknown_ticket), and holds back calls that wait for launched steps to
 *   run (effects, adapter commands, teardown) until it is committed or cancelled.
 * - commit submits it; when the backend refuses, the reservation is undone
 *   and the backend's status returned (the id stays used).
 * - cancel undoes the reservation as if the launch had been refused; the
 *   sequences, blocks, handles and slots are as before the reserve. Its id
 *   is never handed out again.
 * Every successful reserve is followed, soon and from any thread, by exactly
 * one commit or cancel. */
devio_status devio_launch_reserve(devio_device *d, const devio_plan *plan, uint64_t *ticket,
                                  devio_error *err);
devio_status devio_launch_commit(devio_device *d, uint64_t ticket, devio_error *err);
void devio_launch_cancel(devio_device *d, uint64_t ticket);

/* How devio_await_end leaves a held ticket. */
typedef enum devio_await_ending {
    DEVIO_AWAIT_KEEP = 0, /* settled and awaitable again; the caller frees the result it got */
    DEVIO_AWAIT_CONSUME,  /* ended as devio_await ends it */
    DEVIO_AWAIT_DROP,     /* ended, and the logits handles its rows made released: the
                             answer goes to nobody (a server reaping an abandoned ticket) */
} devio_await_ending;

/* devio_await in two halves, so that a caller can make the result durable
 * before the ticket ends: begin waits as devio_await and, once the ticket has
 * settled, gives this caller its result (or the step's failure and err)
 * without ending it: *held is then true and other awaits of the ticket wait
 * (or time out pending). end then leaves it as `how` says. Call end exactly
 * once when *held. */
devio_status devio_await_begin(devio_device *d, uint64_t ticket, int64_t timeout_ms,
                               devio_step_result *out, bool *held, devio_error *err);
void devio_await_end(devio_device *d, uint64_t ticket, devio_await_ending how);

/* Apply one effect. It waits for the step that fills a logits handle it
 * reads or releases, for a free or a truncate for the launches being
 * reserved whose plans copy from one of its sequence's blocks, and on hybrid
 * models for every launched step before it copies SSM state; steps of other
 * sequences keep running. All or nothing. */
devio_status devio_apply(devio_device *d, const devio_effect *e, devio_outcome *out,
                         devio_error *err);

/* Read positions [row, row+n) of a logits handle into dst (n * vocab floats).
 * *n_rows_out receives the handle's number of positions. */
devio_status devio_logits_read(devio_device *d, uint64_t logits, uint32_t row, uint32_t n,
                               float *dst, uint32_t *n_rows_out, devio_error *err);

typedef enum devio_logits_state {
    DEVIO_LOGITS_PENDING = 0, /* its step has not settled */
    DEVIO_LOGITS_READY,       /* filled: readable and samplable */
    DEVIO_LOGITS_FAILED,      /* its step failed: released when the ticket is awaited */
} devio_logits_state;

/* One live logits handle: whose it is and how many positions it holds. */
typedef struct devio_logits_info {
    uint64_t logits, seq, ticket; /* the handle, the sequence that owns it, its step */
    uint32_t rows;                /* positions it holds */
    uint32_t pos0;                /* the sequence position of its first row */
    devio_logits_state state;
} devio_logits_info;

/* The live logits handles a client can name, by id: the first cap of them
 * into out (may be NULL with cap 0), their count into *n. */
devio_status devio_logits_list(devio_device *d, devio_logits_info *out, uint32_t cap,
                               uint32_t *n, devio_error *err);

/* Load, unload, list, pin or unpin adapters, at quiescence. */
devio_status devio_adapter_command(devio_device *d, const devio_adapter_cmd *cmd,
                                   devio_adapter_ack *ack, devio_error *err);

/* Finish every launched step, release device memory, free the device.
 * Tickets not yet awaited are reported through aborted_out (may be NULL). */
devio_status devio_teardown(devio_device *d, uint32_t *aborted_out);

#ifdef __cplusplus
}
#endif
#endif

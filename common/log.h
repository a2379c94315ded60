/* log.h - devio's log lines on standard error: levels, text or JSON lines, typed fields.
 * One write(2) per line so that threads never interleave; it never allocates, never fails
 * loudly, and never blocks: a line the log cannot take at once is dropped and counted. */
#ifndef DEVIO_LOG_H
#define DEVIO_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum devio_log_level {
    DEVIO_LOG_DEBUG = 0,
    DEVIO_LOG_INFO,
    DEVIO_LOG_WARN,
    DEVIO_LOG_ERROR,
} devio_log_level;

typedef enum devio_log_format {
    DEVIO_LOG_TEXT = 0, /* "TIME LEVEL PROG EVENT: message key=value ..." */
    DEVIO_LOG_JSON,     /* one JSON object per line: time, level, logger, event, msg, fields */
} devio_log_format;

/* The names the flags take, in enum order, NULL-terminated. */
extern const char *const devio_log_format_names[];
extern const char *const devio_log_level_names[];

/* Set the program name (borrowed, must outlive logging), the format and the
 * least level written. Call before threads log; until then: text, info, "devio". */
void devio_log_configure(const char *prog, devio_log_format format, devio_log_level min);

/* Also write lines to fd instead of standard error (tests); -1 restores fd 2. */
void devio_log_set_fd(int fd);

bool devio_log_enabled(devio_log_level level);

typedef enum devio_log_kind { DEVIO_LF_STR = 0, DEVIO_LF_I64, DEVIO_LF_U64, DEVIO_LF_F64 } devio_log_kind;

/* One field of a line. Strings are borrowed for the call; NULL writes null. */
typedef struct devio_log_field {
    const char *key;
    devio_log_kind kind;
    const char *s;
    int64_t i;
    uint64_t u;
    double f;
} devio_log_field;

#define DEVIO_LF_S(k, v) ((devio_log_field){.key = (k), .kind = DEVIO_LF_STR, .s = (v)})
#define DEVIO_LF_I(k, v) ((devio_log_field){.key = (k), .kind = DEVIO_LF_I64, .i = (v)})
#define DEVIO_LF_U(k, v) ((devio_log_field){.key = (k), .kind = DEVIO_LF_U64, .u = (v)})
#define DEVIO_LF_F(k, v) ((devio_log_field){.key = (k), .kind = DEVIO_LF_F64, .f = (v)})

/* Write one line: `event` names what happened (a word: "start", "access",
 * "store"), the message is printf-formatted, fields follow. A line longer
 * than 4 KiB is cut (JSON stays valid: the cut falls inside the message). */
void devio_logf(devio_log_level level, const char *event, const devio_log_field *fields,
                size_t n_fields, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Lines dropped so far and not yet reported: a line is dropped, never
 * waited for, when standard error (a pipe or socket) cannot take it at once;
 * the next line written says how many were. */
uint64_t devio_log_dropped(void);

/* devio_logf without fields. */
#define devio_log(level, event, ...) devio_logf((level), (event), NULL, 0, __VA_ARGS__)

#endif

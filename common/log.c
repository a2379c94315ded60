/* log.c - one log line, text or JSON, built in a stack buffer and written with one write(2).
 * Configuration is set once at start-up; lines from any thread after that. Never blocks on
 * a log nobody reads: such lines are dropped and counted. */
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

#define LINE_MAX_BYTES 4096

const char *const devio_log_format_names[] = {"text", "json", NULL};
const char *const devio_log_level_names[] = {"debug", "info", "warn", "error", NULL};

static const char *log_prog = "devio";
static devio_log_format log_format = DEVIO_LOG_TEXT;
static devio_log_level log_min = DEVIO_LOG_INFO;
static int log_fd = 2;

void devio_log_configure(const char *prog, devio_log_format format, devio_log_level min)
{
    log_prog = prog ? prog : "devio";
    log_format = format;
    log_min = min;
}

void devio_log_set_fd(int fd) { log_fd = fd < 0 ? 2 : fd; }

bool devio_log_enabled(devio_log_level level) { return level >= log_min; }

/* A bounded line under construction; `len` never passes `cap` - 2 (room for "\n"). */
typedef struct line {
    char buf[LINE_MAX_BYTES];
    size_t len;
} line;

static void put(line *l, const char *s, size_t n)
{
    size_t room = sizeof l->buf - 2 - l->len;
    if (n > room)
        n = room;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void puts_(line *l, const char *s) { put(l, s, strlen(s)); }

static void putf(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(line *l, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        put(l, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* s as the inside of a JSON string (quotes, backslashes and controls escaped),
 * or as text with newlines and controls shown as escapes; whole characters or
 * escapes only, never past `limit` bytes of the line. */
static void put_escaped_to(line *l, const char *s, bool json, size_t limit)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        char unit[8];
        int n;
        if ((c == '"' || c == '\\') && json)
            n = snprintf(unit, sizeof unit, "\\%c", c);
        else if (c == '\n')
            n = snprintf(unit, sizeof unit, "\\n");
        else if (c < 0x20 || c == 0x7f)
            n = snprintf(unit, sizeof unit, "\\u%04x", c);
        else
            n = snprintf(unit, sizeof unit, "%c", c);
        if (l->len + (size_t)n > limit)
            return;
        put(l, unit, (size_t)n);
    }
}

static void put_escaped(line *l, const char *s, bool json)
{
    put_escaped_to(l, s, json, sizeof l->buf - 2);
}

static void put_time(line *l)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char tmp[40];
    size_t n = strftime(tmp, sizeof tmp, "%Y-%m-%dT%H:%M:%S", &tm);
    put(l, tmp, n);
    putf(l, ".%03ldZ", ts.tv_nsec / 1000000);
}

static void put_value(line *l, const devio_log_field *f, bool json)
{
    switch (f->kind) {
    case DEVIO_LF_STR:
        if (!f->s) {
            puts_(l, json ? "null" : "-");
        } else {
            /* A string field takes at most 512 bytes, and always leaves
             * room for what closes the line. */
            size_t limit = l->len + 512 < sizeof l->buf - 160 ? l->len + 512 : sizeof l->buf - 160;
            if (json)
                puts_(l, "\"");
            put_escaped_to(l, f->s, json, limit);
            if (json)
                puts_(l, "\"");
        }
        break;
    case DEVIO_LF_I64:
        putf(l, "%lld", (long long)f->i);
        break;
    case DEVIO_LF_U64:
        putf(l, "%llu", (unsigned long long)f->u);
        break;
    case DEVIO_LF_F64:
        if (isfinite(f->f))
            putf(l, "%.6g", f->f);
        else
            puts_(l, json ? "null" : "nan");
        break;
    }
}

/* Lines dropped because the log could not take them at once; said in the next line written. */
static uint64_t log_dropped;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

/* True when fd takes a write without blocking now: a pipe or socket nobody
 * reads fills up, and a server must never stop serving for its log. Files
 * and terminals always do. At most PIPE_BUF bytes go in one write, so a pipe
 * that polls writable takes the whole line. */
static bool writable_now(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLOUT);
}

static void write_all(int fd, const char *p, size_t left)
{
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w <= 0)
            return; /* a log line is never worth failing for */
        p += w;
        left -= (size_t)w;
    }
}

/* One line out, whole, under the lock (one writer at a time keeps the
 * writable check true for the write that follows it); or dropped and counted. */
static void emit(const char *buf, size_t len)
{
    pthread_mutex_lock(&log_mu);
    if (!writable_now(log_fd)) {
        log_dropped++;
    } else {
        if (log_dropped) {
            char note[96];
            int n = snprintf(note, sizeof note,
                             "devio log: %llu lines dropped: the log was not being read\n",
                             (unsigned long long)log_dropped);
            write_all(log_fd, note, (size_t)n);
            log_dropped = 0;
        }
        write_all(log_fd, buf, len);
    }
    pthread_mutex_unlock(&log_mu);
}

uint64_t devio_log_dropped(void)
{
    pthread_mutex_lock(&log_mu);
    uint64_t n = log_dropped;
    pthread_mutex_unlock(&log_mu);
    return n;
}

void devio_logf(devio_log_level level, const char *event, const devio_log_field *fields,
                size_t n_fields, const char *fmt, ...)
{
    if (level < log_min || level > DEVIO_LOG_ERROR)
        return;
    char msg[LINE_MAX_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int mn = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (mn < 0)
        msg[0] = '\0';
    bool json = log_format == DEVIO_LOG_JSON;
    line l = {.len = 0};
    /* JSON puts the message last so that a cut line loses only the message's tail. */
    if (json) {
        puts_(&l, "{\"time\":\"");
        put_time(&l);
        puts_(&l, "\",\"level\":\"");
        puts_(&l, devio_log_level_names[level]);
        puts_(&l, "\",\"logger\":\"");
        put_escaped(&l, log_prog, true);
        puts_(&l, "\",\"event\":\"");
        put_escaped(&l, event, true);
        puts_(&l, "\"");
        for (size_t i = 0; i < n_fields && l.len < sizeof l.buf - 256; i++) {
            puts_(&l, ",\"");
            put_escaped(&l, fields[i].key, true);
            puts_(&l, "\":");
            put_value(&l, &fields[i], true);
        }
        puts_(&l, ",\"msg\":\"");
        /* Room is kept for the closing quote and brace whatever the message's length. */
        put_escaped_to(&l, msg, true, sizeof l.buf - 4);
        puts_(&l, "\"}");
    } else {
        put_time(&l);
        puts_(&l, " ");
        puts_(&l, devio_log_level_names[level]);
        puts_(&l, " ");
        puts_(&l, log_prog);
        puts_(&l, " ");
        put_escaped(&l, event, false);
        puts_(&l, ": ");
        put_escaped(&l, msg, false);
        for (size_t i = 0; i < n_fields && l.len < sizeof l.buf - 256; i++) {
            puts_(&l, " ");
            put_escaped(&l, fields[i].key, false);
            puts_(&l, "=");
            put_value(&l, &fields[i], false);
        }
    }
    l.buf[l.len++] = '\n';
    emit(l.buf, l.len);
}

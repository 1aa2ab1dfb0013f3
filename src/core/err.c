/* err.c: error messages and the logging callback. */
#include "core/err.h"

#include <stdio.h>
#include <string.h>

static spx_log_fn g_log_fn;   /* set once by the application before use */
static void *g_log_user;

const char *spx_status_name(spx_status s) {
    switch (s) {
    case SPX_OK: return "ok";
    case SPX_ERR_IO: return "I/O error";
    case SPX_ERR_FORMAT: return "malformed input";
    case SPX_ERR_UNSUPPORTED: return "unsupported";
    case SPX_ERR_NOMEM: return "out of memory";
    case SPX_ERR_ARG: return "invalid argument";
    case SPX_ERR_CRC: return "checksum mismatch";
    case SPX_ERR_RANGE: return "out of range";
    case SPX_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

void spx_err_clear(spx_err *e) {
    if (!e) return;
    e->code = SPX_OK;
    e->msg[0] = '\0';
}

spx_status spx_vfail(spx_err *e, spx_status code, const char *fmt, va_list ap) {
    if (e && e->code == SPX_OK) {
        e->code = code;
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    }
    return code;
}

spx_status spx_fail(spx_err *e, spx_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    spx_vfail(e, code, fmt, ap);
    va_end(ap);
    return code;
}

void spx_err_prefix(spx_err *e, const char *fmt, ...) {
    if (!e || e->code == SPX_OK) return;
    char pre[SPX_ERR_MSG_MAX], old[SPX_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    snprintf(e->msg, sizeof e->msg, "%s: %s", pre, old);
}

void spx_set_log(spx_log_fn fn, void *user) {
    g_log_fn = fn;
    g_log_user = user;
}

void spx_log(int level, const char *fmt, ...) {
    if (!g_log_fn) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_log_fn(level, buf, g_log_user);
}

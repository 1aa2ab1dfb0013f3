/* err.h: error state carried through the library.
 *
 * Every fallible internal function takes an `spx_err *` and returns an
 * spx_status. spx_fail() records the first message (later ones do not
 * overwrite it, so the innermost, most specific cause survives) and
 * returns the code, so call sites read `return spx_fail(e, SPX_ERR_FORMAT,
 * "%s: tensor '%s' ...", path, name);`. Messages name the file, the field,
 * the actual and the expected value. */
#ifndef SPX_ERR_H
#define SPX_ERR_H

#include "spectra.h"
#include <stdarg.h>

#define SPX_ERR_MSG_MAX 1024

typedef struct spx_err {
    spx_status code;
    char msg[SPX_ERR_MSG_MAX];
} spx_err;

#if defined(__GNUC__)
#define SPX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SPX_PRINTF(a, b)
#endif

void spx_err_clear(spx_err *e);
spx_status spx_fail(spx_err *e, spx_status code, const char *fmt, ...) SPX_PRINTF(3, 4);
spx_status spx_vfail(spx_err *e, spx_status code, const char *fmt, va_list ap);
/* Prefixes an existing message with context ("loading X: <old message>"). */
void spx_err_prefix(spx_err *e, const char *fmt, ...) SPX_PRINTF(2, 3);

/* Library-wide logging through the user's callback (spx_set_log). */
void spx_log(int level, const char *fmt, ...) SPX_PRINTF(2, 3);
#define SPX_LOG_ERROR 0
#define SPX_LOG_WARN 1
#define SPX_LOG_INFO 2
#define SPX_LOG_DEBUG 3

#define SPX_TRY(expr)                          \
    do {                                       \
        spx_status spx_try_s_ = (expr);        \
        if (spx_try_s_ != SPX_OK) return spx_try_s_; \
    } while (0)

#endif

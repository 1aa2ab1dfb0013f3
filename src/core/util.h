/* util.h: checked arithmetic, whole-file reads, small string helpers. */
#ifndef SPX_UTIL_H
#define SPX_UTIL_H

#include "core/err.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool spx_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool spx_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* Reads a whole (small) file into a NUL-terminated buffer. max_bytes caps
 * the size so a hostile path cannot make us allocate without bound. */
spx_status spx_read_file(const char *path, size_t max_bytes, char **out,
                         size_t *len, spx_err *e);
/* Writes a file atomically: to "<path>.tmp.<pid>", fsync, rename. */
spx_status spx_write_file_atomic(const char *path, const void *data,
                                 size_t len, spx_err *e);

/* path join into a fresh malloc'd string (NULL on OOM). */
char *spx_path_join(const char *dir, const char *name);
bool spx_file_exists(const char *path);
bool spx_is_dir(const char *path);
char *spx_strdup(const char *s);

/* Monotonic time in seconds. */
double spx_now(void);
/* Peak resident set size of this process in bytes (0 if unknown). */
size_t spx_peak_rss(void);
/* Number of online CPUs (>= 1). */
int spx_num_cpus(void);

#endif

/* util.c: file helpers, timing, process statistics. */
#define _POSIX_C_SOURCE 200809L
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

spx_status spx_read_file(const char *path, size_t max_bytes, char **out,
                         size_t *len, spx_err *e) {
    *out = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return spx_fail(e, SPX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return spx_fail(e, SPX_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return spx_fail(e, SPX_ERR_FORMAT, "%s: file is %lld bytes, more than the %zu allowed",
                        path, (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, n + 1);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return spx_fail(e, SPX_ERR_IO, "%s: read failed after %zu of %zu bytes", path, got, n);
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return SPX_OK;
}

spx_status spx_write_file_atomic(const char *path, const void *data,
                                 size_t len, spx_err *e) {
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        spx_fail(e, SPX_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return SPX_ERR_IO;
    }
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            spx_fail(e, SPX_ERR_IO, "%s: write failed: %s", path, strerror(errno));
            close(fd);
            unlink(tmp);
            free(tmp);
            return SPX_ERR_IO;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        spx_fail(e, SPX_ERR_IO, "%s: cannot flush: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return SPX_ERR_IO;
    }
    if (rename(tmp, path) != 0) {
        spx_fail(e, SPX_ERR_IO, "%s: cannot rename from %s: %s", path, tmp, strerror(errno));
        unlink(tmp);
        free(tmp);
        return SPX_ERR_IO;
    }
    free(tmp);
    return SPX_OK;
}

char *spx_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') s[k++] = '/';
    memcpy(s + k, name, b + 1);
    return s;
}

bool spx_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool spx_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *spx_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

double spx_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t spx_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024u; /* Linux reports KiB */
}

int spx_num_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

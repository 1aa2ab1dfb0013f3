/* mapfile.c: mmap wrapper. Pages are faulted in on use: a 16 GB model
 * costs no RAM until its tensors are read, and the page cache is shared
 * between processes. */
#define _POSIX_C_SOURCE 200809L
#include "core/mapfile.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

spx_status spx_map_open(const char *path, spx_map *m, spx_err *e) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return spx_fail(e, SPX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return spx_fail(e, SPX_ERR_IO, "%s: not a regular file", path);
    }
    m->path = spx_strdup(path);
    if (!m->path) {
        close(fd);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            free(m->path);
            m->path = NULL;
            return spx_fail(e, SPX_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, m->size,
                            strerror(errno));
        }
        m->data = p;
    }
    close(fd);
    return SPX_OK;
}

void spx_map_close(spx_map *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

void spx_map_release(const void *p, size_t n) {
    if (!p || n == 0) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t b = ((uintptr_t)p + page - 1) & ~(page - 1); /* only whole pages inside */
    uintptr_t e = ((uintptr_t)p + n) & ~(page - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

/* mapfile.c: mmap wrapper. Pages are faulted in on use: a 16 GB model
 * costs no RAM until its tensors are read, and the page cache is shared
 * between processes.
 *
 * Address space: each map owns [data, data + span), span = size rounded
 * up to 2 MiB, data 2 MiB-aligned (a PROT_NONE reservation, the file
 * mapped over its start). A resident copy (spx_map_make_resident) is
 * built elsewhere and moved over the whole span with mremap, so it lands
 * on huge-page boundaries and replaces nothing but the map itself. */
/* mremap, MREMAP_FIXED: _GNU_SOURCE (the Makefile defines it) */
#include "core/mapfile.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAP_ALIGN ((size_t)2 << 20)

/* span bytes of PROT_NONE address space at a MAP_ALIGN boundary, or NULL */
static void *reserve_aligned(size_t span) {
    void *r = mmap(NULL, span + MAP_ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return NULL;
    uintptr_t b = (uintptr_t)r, a = (b + MAP_ALIGN - 1) & ~(uintptr_t)(MAP_ALIGN - 1);
    if (a > b) munmap(r, a - b);
    if (a + span < b + span + MAP_ALIGN) munmap((void *)(a + span), b + span + MAP_ALIGN - (a + span));
    return (void *)a;
}

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
        const size_t span = (m->size + MAP_ALIGN - 1) & ~(MAP_ALIGN - 1);
        void *r = reserve_aligned(span);
        void *p = r ? mmap(r, m->size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) : MAP_FAILED;
        if (p == MAP_FAILED) {
            int err = errno;
            if (r) munmap(r, span);
            close(fd);
            free(m->path);
            m->path = NULL;
            return spx_fail(e, SPX_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, m->size, strerror(err));
        }
        m->data = p;
        m->span = span;
    }
    close(fd);
    return SPX_OK;
}

void spx_map_close(spx_map *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->span);
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

spx_status spx_map_make_resident(spx_map *m, spx_err *e) {
    if (!m->data || m->resident) return SPX_OK;
    void *q = reserve_aligned(m->span);
    if (!q || mprotect(q, m->span, PROT_READ | PROT_WRITE) != 0) {
        if (q) munmap(q, m->span);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: no memory for a private copy of %zu bytes", m->path, m->size);
    }
#ifdef MADV_HUGEPAGE
    madvise(q, m->span, MADV_HUGEPAGE); /* a hint: without THP the copy is still private 4 KiB pages */
#endif
    madvise((void *)m->data, m->size, MADV_SEQUENTIAL);
    memcpy(q, m->data, m->size);
    /* read-only like the map; then moved over the map's span (its pages
     * and the tail reservation are unmapped by the move) */
    if (mprotect(q, m->span, PROT_READ) != 0 ||
        mremap(q, m->span, m->span, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)m->data) == MAP_FAILED) {
        int err = errno;
        munmap(q, m->span);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: cannot move the private copy over the map: %s", m->path, strerror(err));
    }
    m->resident = 1;
    return SPX_OK;
}

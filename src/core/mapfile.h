/* mapfile.h: read-only memory maps of whole files. */
#ifndef SPX_MAPFILE_H
#define SPX_MAPFILE_H

#include "core/err.h"
#include <stddef.h>
#include <stdint.h>

typedef struct spx_map {
    const uint8_t *data;  /* NULL for an empty file; 2 MiB-aligned */
    size_t size;
    size_t span;          /* bytes of address space owned at data: size rounded up to 2 MiB */
    int resident;         /* spx_map_make_resident done: data is private memory, not the file's pages */
    char *path;           /* owned copy, for messages */
} spx_map;

spx_status spx_map_open(const char *path, spx_map *m, spx_err *e);
void spx_map_close(spx_map *m);
/* Tells the kernel the pages covering [p, p+n) of a read-only map are not
 * needed now (they are re-read from the file if touched again), so a pass
 * over a large file keeps resident memory near one tensor. Not for a
 * resident map (its pages would read as zeros). */
void spx_map_release(const void *p, size_t n);
/* Replaces the map's pages by a private copy at the same addresses (every
 * pointer into it stays valid), in transparent huge pages where the OS
 * gives them (MADV_HUGEPAGE), read-only like the map. Streaming weights
 * from it is faster than from the page cache's pages (bench/results/
 * 2026-12-04-cpu-resident.md); it costs the file's size in private RAM
 * that other processes no longer share. Idempotent. On failure (no
 * memory) the map is unchanged and usable. */
spx_status spx_map_make_resident(spx_map *m, spx_err *e);

#endif

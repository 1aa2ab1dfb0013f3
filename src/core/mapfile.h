/* mapfile.h: read-only memory maps of whole files. */
#ifndef SPX_MAPFILE_H
#define SPX_MAPFILE_H

#include "core/err.h"
#include <stddef.h>
#include <stdint.h>

typedef struct spx_map {
    const uint8_t *data;  /* NULL for an empty file */
    size_t size;
    char *path;           /* owned copy, for messages */
} spx_map;

spx_status spx_map_open(const char *path, spx_map *m, spx_err *e);
void spx_map_close(spx_map *m);
/* Tells the kernel the pages covering [p, p+n) of a read-only map are not
 * needed now (they are re-read from the file if touched again), so a pass
 * over a large file keeps resident memory near one tensor. */
void spx_map_release(const void *p, size_t n);

#endif

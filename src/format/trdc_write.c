/* trdc_write.c: the TRDC4B01 streaming writer (docs/trdc.md section 6):
 * components streamed to a temporary file with their CRC-32, the
 * manifest built in memory and appended last, the file renamed into
 * place only when complete. Every tensor and JSON input is validated with
 * the reader's rules (trdc_common.c), so it cannot produce a file the
 * reader rejects. */
#define _POSIX_C_SOURCE 200809L
#include "format/trdc_impl.h"

#include "core/util.h"
#include "refine/bundle.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ======================================================================
 * Writer
 * ====================================================================== */

struct spx_trdc_writer {
    char *path, *tmp;
    int fd;              /* -1 once closed */
    int dead;            /* an error happened: temp removed, only abort/finish */
    uint64_t pos;        /* bytes written so far */
    cJSON *tensors;      /* manifest "tensors" array, built as we go */
    trdc_nameset names;       /* keys: name strings inside `tensors` */
    unsigned version;    /* the lowest version holding every tensor added so far (1 .. 5) */
    int n_refine, n_model; /* refine4 tensors and the others: a file holds one sort */
};

/* The version a tensor needs: 3 for 2- and 3-bit codes (their packing
 * came with version 3), 2 for a tiled matrix, else 1 (every reader). A
 * file gets the largest over its tensors: the lowest that holds them. */
static unsigned quant_version(const spx_qtensor *q) {
    return q->bits != 4 ? 3u : q->layout == SPX_Q_TILED ? 2u : 1u;
}
static unsigned writer_version(const spx_trdc_writer *w) { return w->version; }

static const uint8_t k_zeros[SPX_TRDC_ALIGN];

/* Marks the writer dead: closes and deletes the temp file. */
static void writer_kill(spx_trdc_writer *w) {
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->tmp) unlink(w->tmp);
    w->dead = 1;
}

static spx_status writer_io_fail(spx_trdc_writer *w, const char *what, int err, spx_err *e) {
    char at[48] = "";
    if (!strcmp(what, "writing")) snprintf(at, sizeof at, " at byte %llu", (unsigned long long)w->pos);
    spx_fail(e, SPX_ERR_IO, "%s: %s temp file %s%s failed: %s%s", w->path, what, w->tmp, at,
             strerror(err),
             err == ENOSPC || err == EDQUOT ? " (the disk is full; the partial file was removed)"
                                            : " (the partial file was removed)");
    writer_kill(w);
    return SPX_ERR_IO;
}

static spx_status writer_arg_fail(spx_trdc_writer *w, spx_err *e, const char *fmt, ...)
    SPX_PRINTF(3, 4);
static spx_status writer_arg_fail(spx_trdc_writer *w, spx_err *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    spx_vfail(e, SPX_ERR_ARG, fmt, ap);
    va_end(ap);
    writer_kill(w);
    return SPX_ERR_ARG;
}

static spx_status writer_write(spx_trdc_writer *w, const void *data, size_t n, uLong *crc,
                               spx_err *e) {
    const uint8_t *p = data;
    while (n > 0) {
        size_t k = n < TRDC_CRC_CHUNK ? n : TRDC_CRC_CHUNK;
        if (crc) *crc = crc32(*crc, p, (uInt)k);
        size_t done = 0;
        while (done < k) {
            ssize_t r = write(w->fd, p + done, k - done);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return writer_io_fail(w, "writing", r < 0 ? errno : EIO, e);
            done += (size_t)r;
            w->pos += (uint64_t)r;
        }
        p += k;
        n -= k;
    }
    return SPX_OK;
}

spx_status spx_trdc_writer_open(const char *path, spx_trdc_writer **out, spx_err *e) {
    if (!out || !path || !*path) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_open: no path");
    *out = NULL;
    spx_trdc_writer *w = calloc(1, sizeof *w);
    size_t tl = strlen(path) + 32;
    if (!w || !(w->path = spx_strdup(path)) || !(w->tmp = malloc(tl)) ||
        !(w->tensors = cJSON_CreateArray())) {
        if (w) {
            free(w->path);
            free(w->tmp);
            free(w);
        }
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
    }
    w->fd = -1;
    w->version = 1;
    snprintf(w->tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (w->fd < 0) {
        spx_fail(e, SPX_ERR_IO, "%s: cannot create temp file %s: %s", path, w->tmp, strerror(errno));
        cJSON_Delete(w->tensors);
        free(w->path);
        free(w->tmp);
        free(w);
        return SPX_ERR_IO;
    }
    uint8_t h[SPX_TRDC_HEADER_SIZE];
    memcpy(h, SPX_TRDC_MAGIC, 8);
    trdc_wr_le64(h + 8, SPX_TRDC_VERSION);
    trdc_wr_le64(h + 16, 0); /* placeholder: rewritten by finish */
    spx_status st = writer_write(w, h, sizeof h, NULL, e);
    if (st != SPX_OK) {
        spx_trdc_writer_abort(w);
        return st;
    }
    *out = w;
    return SPX_OK;
}

uint64_t spx_trdc_writer_bytes(const spx_trdc_writer *w) { return w->pos; }

/* Starts a manifest entry: checks the name and creates the object. */
static spx_status writer_begin(spx_trdc_writer *w, const char *name, const char *kind,
                               cJSON **jt, spx_err *e) {
    if (w->dead)
        return spx_fail(e, SPX_ERR_ARG, "%s: the writer failed earlier and cannot be used", w->path);
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > SPX_TRDC_MAX_NAME)
        return writer_arg_fail(w, e, "%s: tensor name must be 1..%d bytes (got %zu)", w->path,
                               SPX_TRDC_MAX_NAME, nl);
    if (trdc_utf8_bad_at((const uint8_t *)name, nl) != nl)
        return writer_arg_fail(w, e, "%s: tensor name '%s' is not valid UTF-8", w->path, name);
    size_t dummy;
    if (trdc_nameset_find(&w->names, name, &dummy))
        return writer_arg_fail(w, e, "%s: tensor '%s' added twice", w->path, name);
    if (w->names.n >= SPX_TRDC_MAX_TENSORS)
        return writer_arg_fail(w, e, "%s: more than %u tensors", w->path, SPX_TRDC_MAX_TENSORS);
    cJSON *o = cJSON_CreateObject();
    cJSON *jn = o ? cJSON_AddStringToObject(o, "name", name) : NULL;
    if (!jn || !cJSON_AddStringToObject(o, "kind", kind)) {
        cJSON_Delete(o);
        writer_kill(w);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    }
    *jt = o;
    return SPX_OK;
}

/* Writes one component at the next aligned offset and records it. */
static spx_status writer_component(spx_trdc_writer *w, cJSON *jcomps, spx_trdc_comp c,
                                   const void *data, uint64_t size, spx_err *e) {
    uint64_t pad = (SPX_TRDC_ALIGN - w->pos % SPX_TRDC_ALIGN) % SPX_TRDC_ALIGN;
    if (w->pos + pad + size > TRDC_MAX_U53)
        return writer_arg_fail(w, e, "%s: file would exceed 2^53 bytes", w->path);
    SPX_TRY(writer_write(w, k_zeros, (size_t)pad, NULL, e));
    uint64_t off = w->pos;
    uLong crc = crc32(0L, Z_NULL, 0);
    SPX_TRY(writer_write(w, data, (size_t)size, &crc, e));
    cJSON *o = cJSON_AddObjectToObject(jcomps, trdc_comp_names[c]);
    if (!o || !cJSON_AddNumberToObject(o, "offset", (double)off) ||
        !cJSON_AddNumberToObject(o, "size", (double)size) ||
        !cJSON_AddNumberToObject(o, "crc32", (double)(uint32_t)crc)) {
        writer_kill(w);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    }
    return SPX_OK;
}

/* Adds the finished entry to the manifest and indexes its name. */
static spx_status writer_commit(spx_trdc_writer *w, cJSON *jt, spx_err *e) {
    cJSON_AddItemToArray(w->tensors, jt);
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(jt, "name");
    if (trdc_nameset_put(&w->names, jn->valuestring, w->names.n, NULL) < 0) {
        writer_kill(w);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    }
    return SPX_OK;
}

static cJSON *shape_json(int ndim, const int64_t *shape) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < ndim; i++) {
        cJSON *v = cJSON_CreateNumber((double)shape[i]);
        if (!v) {
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddItemToArray(a, v);
    }
    return a;
}

spx_status spx_trdc_writer_add_dense(spx_trdc_writer *w, const char *name, spx_dtype dtype,
                                     int ndim, const int64_t *shape, const void *data,
                                     size_t nbytes, spx_err *e) {
    if (!w) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_add_dense: writer is NULL");
    cJSON *jt;
    SPX_TRY(writer_begin(w, name, "dense", &jt, e));
    spx_status st = SPX_OK;
    uint64_t numel = 1, want = 0;
    if (!trdc_dense_dtype_ok(dtype)) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': dtype %s not allowed (F32, F16 or BF16)",
                             w->path, name, spx_dtype_name(dtype));
        goto out;
    }
    if (ndim < 1 || ndim > SPX_TRDC_MAX_DIMS || !shape) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': ndim %d, expected 1..%d", w->path, name, ndim,
                             SPX_TRDC_MAX_DIMS);
        goto out;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1 || shape[i] > SPX_TRDC_MAX_DIM ||
            __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel) || numel > (uint64_t)INT64_MAX) {
            st = writer_arg_fail(w, e, "%s: tensor '%s': shape[%d] = %lld out of range or overflowing",
                                 w->path, name, i, (long long)shape[i]);
            goto out;
        }
    if (__builtin_mul_overflow(numel, (uint64_t)spx_dtype_size(dtype), &want) || want != nbytes ||
        !data) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': %zu bytes given, expected %llu for its shape and %s",
                             w->path, name, nbytes, (unsigned long long)want, spx_dtype_name(dtype));
        goto out;
    }
    cJSON *js = shape_json(ndim, shape), *jc = NULL;
    if (!js || !cJSON_AddStringToObject(jt, "dtype", spx_dtype_name(dtype)) ||
        !cJSON_AddItemToObject(jt, "shape", js) || !(jc = cJSON_AddObjectToObject(jt, "components"))) {
        if (js && !cJSON_GetObjectItemCaseSensitive(jt, "shape")) cJSON_Delete(js);
        writer_kill(w);
        st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        goto out;
    }
    if (w->n_refine) st = writer_arg_fail(w, e, "%s: tensor '%s': a model tensor in a .refine file", w->path, name);
    if (st == SPX_OK) st = writer_component(w, jc, SPX_TRDC_C_DATA, data, nbytes, e);
    if (st == SPX_OK) {
        w->n_model++;
        return writer_commit(w, jt, e);
    }
out:
    cJSON_Delete(jt);
    return st;
}

spx_status spx_trdc_writer_add_quant(spx_trdc_writer *w, const char *name, const spx_qtensor *q,
                                     double kappa, double r, spx_err *e) {
    if (!w) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_add_quant: writer is NULL");
    cJSON *jt;
    SPX_TRY(writer_begin(w, name, "quant", &jt, e));
    spx_status st = SPX_OK;
    uint64_t sz[SPX_TRDC_C_COUNT];
    const char *why = q ? trdc_quant_sizes(q->rows, q->cols, q->bits, q->group, q->n_outliers, q->layout,
                                           SPX_TRDC_VERSION, sz)
                        : "no tensor given";
    if (why) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': %s", w->path, name, why);
        goto out;
    }
    const void *buf[SPX_TRDC_C_COUNT] = {NULL, q->codes, q->scales, q->zeros, q->outlier_idx,
                                         q->outlier_val};
    for (int c = 1; c < SPX_TRDC_C_COUNT; c++)
        if (sz[c] && !buf[c]) {
            st = writer_arg_fail(w, e, "%s: tensor '%s': component %s is NULL", w->path, name,
                                 trdc_comp_names[c]);
            goto out;
        }
    for (int64_t j = 0; j < q->n_outliers; j++)
        if (q->outlier_idx[j] < 0 || q->outlier_idx[j] >= q->cols ||
            (j > 0 && q->outlier_idx[j] <= q->outlier_idx[j - 1])) {
            st = writer_arg_fail(w, e,
                                 "%s: tensor '%s': outlier_idx[%lld] = %d: indices must be strictly "
                                 "increasing and < cols %lld",
                                 w->path, name, (long long)j, q->outlier_idx[j], (long long)q->cols);
            goto out;
        }
    int64_t shp[2] = {q->rows, q->cols};
    cJSON *js = shape_json(2, shp), *jc = NULL;
    int ok = js && cJSON_AddItemToObject(jt, "shape", js);
    if (!ok) cJSON_Delete(js);
    ok = ok && (q->layout != SPX_Q_TILED || cJSON_AddStringToObject(jt, "layout", "tile16x128")) &&
         cJSON_AddNumberToObject(jt, "bits", q->bits) &&
         cJSON_AddNumberToObject(jt, "group", q->group) &&
         cJSON_AddNumberToObject(jt, "n_outliers", (double)q->n_outliers) &&
         (isfinite(kappa) ? cJSON_AddNumberToObject(jt, "kappa", kappa) != NULL
                          : cJSON_AddNullToObject(jt, "kappa") != NULL) &&
         (isfinite(r) ? cJSON_AddNumberToObject(jt, "r", r) != NULL
                      : cJSON_AddNullToObject(jt, "r") != NULL) &&
         (jc = cJSON_AddObjectToObject(jt, "components")) != NULL;
    if (!ok) {
        writer_kill(w);
        st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        goto out;
    }
    for (int c = 1; c < SPX_TRDC_C_COUNT && st == SPX_OK; c++)
        if (sz[c]) st = writer_component(w, jc, (spx_trdc_comp)c, buf[c], sz[c], e);
    if (st == SPX_OK && w->n_refine)
        st = writer_arg_fail(w, e, "%s: tensor '%s': a model tensor in a .refine file", w->path, name);
    if (st == SPX_OK) {
        if (quant_version(q) > w->version) w->version = quant_version(q);
        w->n_model++;
        return writer_commit(w, jt, e);
    }
out:
    cJSON_Delete(jt);
    return st;
}

spx_status spx_trdc_writer_add_refine(spx_trdc_writer *w, const char *name, int64_t rows, int64_t cols,
                                      int64_t col_stride, const uint8_t *codes, const float *scales,
                                      uint32_t base_crc32, spx_err *e) {
    if (!w) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_add_refine: writer is NULL");
    cJSON *jt;
    SPX_TRY(writer_begin(w, name, "refine4", &jt, e));
    spx_status st = SPX_OK;
    if (w->n_model) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': a refine4 residual in a model file (a .refine holds only those)",
                             w->path, name);
        goto out;
    }
    if (rows < 1 || rows > SPX_TRDC_MAX_DIM || cols < 1 || cols > SPX_TRDC_MAX_DIM || col_stride < (rows + 1) / 2 ||
        col_stride > SPX_TRDC_MAX_DIM || !codes || !scales || (uint64_t)cols * (uint64_t)col_stride > TRDC_MAX_U53) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': residual [%lld, %lld] with column stride %lld is not valid",
                             w->path, name, (long long)rows, (long long)cols, (long long)col_stride);
        goto out;
    }
    int64_t shp[2] = {rows, cols};
    cJSON *js = shape_json(2, shp), *jc = NULL;
    int ok = js && cJSON_AddItemToObject(jt, "shape", js);
    if (!ok) cJSON_Delete(js);
    ok = ok && cJSON_AddNumberToObject(jt, "col_stride", (double)col_stride) &&
         cJSON_AddNumberToObject(jt, "base_crc32", (double)base_crc32) &&
         (jc = cJSON_AddObjectToObject(jt, "components")) != NULL;
    if (!ok) {
        writer_kill(w);
        st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        goto out;
    }
    st = writer_component(w, jc, SPX_TRDC_C_CODES, codes, (uint64_t)cols * (uint64_t)col_stride, e);
    if (st == SPX_OK) st = writer_component(w, jc, SPX_TRDC_C_SCALES, scales, (uint64_t)rows * 4, e);
    if (st == SPX_OK) {
        if (w->version < 4u) w->version = 4u; /* refine4 came with version 4 */
        w->n_refine++;
        return writer_commit(w, jt, e);
    }
out:
    cJSON_Delete(jt);
    return st;
}

spx_status spx_trdc_writer_add_bundles(spx_trdc_writer *w, const char *name, int64_t n, int64_t hidden, int64_t stride,
                                       const uint8_t *data, const float *scales, spx_err *e) {
    if (!w) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_add_bundles: writer is NULL");
    cJSON *jt;
    SPX_TRY(writer_begin(w, name, "bundle4", &jt, e));
    spx_status st = SPX_OK;
    if (w->n_model) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': neuron bundles in a model file (a .refine holds them)", w->path,
                             name);
        goto out;
    }
    if (n < 1 || n > SPX_TRDC_MAX_DIM || hidden < 1 || hidden > SPX_TRDC_MAX_DIM || stride < spx_bundle_bytes(hidden) ||
        stride > SPX_TRDC_MAX_DIM || !data || !scales || (uint64_t)n * (uint64_t)stride > TRDC_MAX_U53) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': %lld bundles of hidden %lld with stride %lld are not valid",
                             w->path, name, (long long)n, (long long)hidden, (long long)stride);
        goto out;
    }
    int64_t shp[2] = {n, hidden};
    cJSON *js = shape_json(2, shp), *jc = NULL;
    int ok = js && cJSON_AddItemToObject(jt, "shape", js);
    if (!ok) cJSON_Delete(js);
    ok = ok && cJSON_AddNumberToObject(jt, "bundle_stride", (double)stride) &&
         (jc = cJSON_AddObjectToObject(jt, "components")) != NULL;
    if (!ok) {
        writer_kill(w);
        st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        goto out;
    }
    st = writer_component(w, jc, SPX_TRDC_C_CODES, data, (uint64_t)n * (uint64_t)stride, e);
    if (st == SPX_OK) st = writer_component(w, jc, SPX_TRDC_C_SCALES, scales, (uint64_t)hidden * 8, e);
    if (st == SPX_OK) {
        w->version = 5u; /* bundle4 came with version 5 */
        w->n_refine++;
        return writer_commit(w, jt, e);
    }
out:
    cJSON_Delete(jt);
    return st;
}

static void writer_free(spx_trdc_writer *w) {
    cJSON_Delete(w->tensors);
    trdc_nameset_free(&w->names);
    free(w->path);
    free(w->tmp);
    free(w);
}

void spx_trdc_writer_abort(spx_trdc_writer *w) {
    if (!w) return;
    writer_kill(w);
    writer_free(w);
}

/* fsync of the directory holding path, so the rename itself is durable.
 * Best effort: some filesystems refuse fsync on directories. */
static void fsync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : spx_strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

/* Adds verbatim JSON object text (checked) under key. */
static spx_status add_raw_object(spx_trdc_writer *w, cJSON *root, const char *key,
                                 const char *text, spx_err *e) {
    char what[64];
    snprintf(what, sizeof what, "the %s JSON", key);
    /* A byte order mark would be skipped by a parser at the start of a
     * document but is invalid inside the manifest: drop it. */
    if (!strncmp(text, "\xEF\xBB\xBF", 3)) text += 3;
    /* -2: the manifest root and this key's object add levels around it */
    SPX_TRY(trdc_check_json_object_text(what, w->path, text, SPX_TRDC_MAX_DEPTH - 2, e));
    if (!cJSON_AddItemToObject(root, key, cJSON_CreateRaw(text)))
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    return SPX_OK;
}

static spx_status writer_build_manifest(spx_trdc_writer *w, const char *config_json,
                                        const char *tok_json, const char *tok_cfg_json,
                                        const char *quant_json, const char *source_json,
                                        char **out, spx_err *e) {
    *out = NULL;
    if (!config_json)
        return spx_fail(e, SPX_ERR_ARG, "%s: no config JSON given (it is required)", w->path);
    cJSON *root = cJSON_CreateObject();
    if (!root || !cJSON_AddStringToObject(root, "format", SPX_TRDC_MAGIC) ||
        !cJSON_AddNumberToObject(root, "version", writer_version(w)) ||
        !cJSON_AddStringToObject(root, "generator", "spectra") ||
        (w->n_refine && !cJSON_AddStringToObject(root, "contents", "refine"))) {
        cJSON_Delete(root);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    }
    spx_status st = add_raw_object(w, root, "config", config_json, e);
    if (st == SPX_OK && (tok_json || tok_cfg_json)) {
        cJSON *jt = cJSON_AddObjectToObject(root, "tokenizer");
        const char *keys[2] = {"tokenizer.json", "tokenizer_config.json"};
        const char *vals[2] = {tok_json, tok_cfg_json};
        if (!jt) st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        for (int k = 0; k < 2 && st == SPX_OK; k++) {
            if (!vals[k]) continue;
            size_t n = strlen(vals[k]), bad = trdc_utf8_bad_at((const uint8_t *)vals[k], n);
            if (bad != n)
                st = spx_fail(e, SPX_ERR_ARG, "%s: %s is not valid UTF-8 (byte %zu)", w->path,
                              keys[k], bad);
            else if (!cJSON_AddStringToObject(jt, keys[k], vals[k]))
                st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        }
    }
    if (st == SPX_OK) st = add_raw_object(w, root, "quantization", quant_json ? quant_json : "{}", e);
    if (st == SPX_OK && source_json) st = add_raw_object(w, root, "source", source_json, e);
    if (st == SPX_OK) {
        cJSON_AddItemToObject(root, "tensors", w->tensors);
        w->tensors = NULL; /* owned by root now */
        *out = cJSON_PrintUnformatted(root);
        if (!*out) st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory printing the manifest", w->path);
    }
    cJSON_Delete(root);
    return st;
}

spx_status spx_trdc_writer_finish(spx_trdc_writer *w, const char *config_json,
                                  const char *tokenizer_json, const char *tokenizer_config_json,
                                  const char *quant_settings_json, const char *source_info_json,
                                  spx_err *e) {
    if (!w) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_finish: writer is NULL");
    if (w->dead) {
        spx_status st = spx_fail(e, SPX_ERR_ARG, "%s: the writer failed earlier; nothing was written",
                                 w->path);
        spx_trdc_writer_abort(w);
        return st;
    }
    char *man = NULL;
    spx_status st = writer_build_manifest(w, config_json, tokenizer_json, tokenizer_config_json,
                                          quant_settings_json, source_info_json, &man, e);
    size_t mlen = man ? strlen(man) : 0;
    if (st == SPX_OK && mlen > SPX_TRDC_MAX_MANIFEST)
        st = spx_fail(e, SPX_ERR_RANGE, "%s: manifest is %zu bytes, above the %llu-byte limit",
                      w->path, mlen, (unsigned long long)SPX_TRDC_MAX_MANIFEST);
    if (st == SPX_OK) st = writer_write(w, man, mlen, NULL, e);
    free(man);
    if (st == SPX_OK) {
        uint8_t h[SPX_TRDC_HEADER_SIZE];
        memcpy(h, SPX_TRDC_MAGIC, 8);
        trdc_wr_le64(h + 8, writer_version(w));
        trdc_wr_le64(h + 16, (uint64_t)mlen);
        ssize_t r;
        do r = pwrite(w->fd, h, sizeof h, 0);
        while (r < 0 && errno == EINTR);
        if (r != (ssize_t)sizeof h) st = writer_io_fail(w, "rewriting the header of", r < 0 ? errno : EIO, e);
    }
    if (st == SPX_OK && fsync(w->fd) != 0) st = writer_io_fail(w, "flushing", errno, e);
    if (st == SPX_OK) {
        int rc = close(w->fd);
        w->fd = -1;
        if (rc != 0) st = writer_io_fail(w, "closing", errno, e);
    }
    if (st == SPX_OK && rename(w->tmp, w->path) != 0)
        st = writer_io_fail(w, "renaming", errno, e);
    if (st == SPX_OK) fsync_parent(w->path);
    if (st == SPX_OK) writer_free(w);
    else spx_trdc_writer_abort(w);
    return st;
}


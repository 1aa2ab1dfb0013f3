/* trdc.h: the TRDC4B01 container (.trdc): reader and verifier (trdc.c),
 * streaming writer (trdc_write.c), what they share (trdc_common.c). The
 * normative format is docs/trdc.md; this header is its C face.
 *
 * Layout (all integers little-endian):
 *   [0, 24)            header: "TRDC4B01", u64 version (1 to 5), u64 manifest_len
 *   [4096, ...)        payload: every tensor component at a 4096-aligned
 *                      offset, zero padding between components
 *   [file_size - manifest_len, file_size)
 *                      UTF-8 JSON manifest: config, tokenizer, quantization
 *                      settings, source info, and per tensor its name, kind,
 *                      shape and components {offset, size, crc32}.
 *
 * Reader: spx_trdc_open() maps the file and validates everything before a
 * pointer is handed out (header, manifest size/UTF-8/depth/JSON, every
 * field's type and range, shapes with overflow checks, component sizes
 * equal to those implied by src/quant/qtensor.h, alignment, bounds, no
 * overlaps, outlier indices strictly increasing and < cols). Tensor data
 * are views into the map, with one exception: the 2- and 3-bit codes of a
 * version 1 or 2 file, which the open repacks once into memory the handle
 * owns (the packing changed in version 3; docs/trdc.md section 8), so
 * every consumer sees the current packing. After a successful open the
 * handle is immutable: it may be shared by threads.
 * CRCs are not checked at open (that reads the whole file); call
 * spx_trdc_verify() for that.
 *
 * Writer: streams tensors in any order to "<path>.tmp.<pid>", computing
 * CRC32 while writing, and renames to <path> only in finish(). The file
 * gets the lowest version that holds its tensors: 5 with a bundle4, 4
 * for a .refine, 3 when a matrix has 2- or 3-bit codes, else 2 when one
 * is tiled, else 1. Memory is
 * bounded by the manifest (no payload is buffered). One writer is used by
 * one thread at a time. After any failed call the writer is dead: its temp
 * file is already removed and the only remaining calls are finish() (which
 * fails) or abort(), which free it.
 *
 * Requires a little-endian host (the payload is mapped, not converted). */
#ifndef SPX_TRDC_H
#define SPX_TRDC_H

#include "core/dtype.h"
#include "core/err.h"
#include "quant/qtensor.h"
#include <stddef.h>
#include <stdint.h>

struct cJSON;

#define SPX_TRDC_MAGIC "TRDC4B01"
#define SPX_TRDC_VERSION 5u             /* newest; read: SPX_TRDC_VERSION_MIN..this */
#define SPX_TRDC_VERSION_MIN 1u         /* 1: row-major matrices; 2: + tiled; 3: + 2-/3-bit item packing; 4: + refine4;
                                         * 5: + bundle4 */
#define SPX_TRDC_HEADER_SIZE 24u
#define SPX_TRDC_ALIGN 4096u            /* component offset alignment */
#define SPX_TRDC_MAX_MANIFEST (1ull << 30) /* 1 GiB */
#define SPX_TRDC_MAX_DEPTH 64           /* JSON nesting of the manifest */
#define SPX_TRDC_MAX_DIMS 8
#define SPX_TRDC_MAX_DIM 2147483647ll   /* every dimension in [1, 2^31-1] */
#define SPX_TRDC_MAX_NAME 1024          /* bytes in a tensor name */
#define SPX_TRDC_MAX_TENSORS (1u << 20)

typedef enum spx_trdc_kind {
    SPX_TRDC_DENSE = 0, /* "dense": F32/F16/BF16 array, any rank 1..8 */
    SPX_TRDC_QUANT = 1, /* "quant": group-quantized matrix (qtensor.h) */
    SPX_TRDC_REFINE = 2, /* "refine4" (version 4, .refine files): a matrix's 4-bit residual columns
                         * (refine/refine.h): codes cols * col_stride bytes, scales rows float32 */
    SPX_TRDC_BUNDLE = 3 /* "bundle4" (version 5, .refine files): one MLP layer's neuron bundles
                         * (refine/bundle.h), shape [intermediate, hidden]: codes intermediate *
                         * bundle_stride bytes, scales 2 * hidden float32 (d's, then the down residual's) */
} spx_trdc_kind;

/* What a file holds (the manifest's "contents"): a model, or the weight
 * refinement of one (a .refine: refine4 tensors only). */
typedef enum spx_trdc_contents_kind { SPX_TRDC_CONTENTS_MODEL = 0, SPX_TRDC_CONTENTS_REFINE = 1 } spx_trdc_contents_kind;

/* Component ids (frozen: appended, never reused). */
typedef enum spx_trdc_comp {
    SPX_TRDC_C_DATA = 0,        /* dense: numel * dtype size */
    SPX_TRDC_C_CODES = 1,       /* quant: rows * spx_q_codes_row_bytes */
    SPX_TRDC_C_SCALES = 2,      /* quant: rows * groups * 2 (fp16) */
    SPX_TRDC_C_ZEROS = 3,       /* quant: rows * spx_q_zeros_row_bytes */
    SPX_TRDC_C_OUTLIER_IDX = 4, /* quant, n_outliers > 0: n * 4 (int32) */
    SPX_TRDC_C_OUTLIER_VAL = 5, /* quant, n_outliers > 0: rows * n * 2 (fp16) */
    SPX_TRDC_C_COUNT
} spx_trdc_comp;

typedef struct spx_trdc_component {
    int present;      /* 0: the tensor has no such component */
    uint64_t offset;  /* from the start of the file; multiple of 4096 */
    uint64_t size;    /* bytes, > 0 */
    uint32_t crc32;   /* zlib crc32() of the bytes */
} spx_trdc_component;

typedef struct spx_trdc_tensor {
    const char *name;          /* non-empty, unique in the file */
    spx_trdc_kind kind;
    spx_dtype dtype;           /* dense: F32/F16/BF16; quant: SPX_DT_COUNT */
    int ndim;                  /* dense: 1..8; quant: 2 */
    int64_t shape[SPX_TRDC_MAX_DIMS];
    int64_t numel;             /* product of shape */
    const void *data;          /* dense: into the map (4096-aligned in a file) */
    size_t nbytes;             /* dense: numel * dtype size; quant: sum of components */
    spx_qtensor q;             /* quant: pointers into the map (the repacked codes of a version
                                * 1-2 file's 2-/3-bit matrix: owned by the handle); zeroed for dense */
    double kappa, r;           /* quant: saliency kurtosis, outlier ratio; NaN if absent */
    struct {                   /* refine4 and bundle4: views into the map */
        const uint8_t *codes;  /* refine4 [cols][col_stride]; bundle4 [rows][col_stride] (one bundle a row) */
        const float *scales;   /* refine4 [rows]; bundle4 [2][cols] */
        int64_t col_stride;    /* refine4: >= (rows + 1) / 2; bundle4: the bundle stride, >= spx_bundle_bytes(cols) */
        uint32_t base_crc32;   /* the base matrix's codes checksum it was made against */
        int has_base_crc;
    } refine;
    spx_trdc_component comp[SPX_TRDC_C_COUNT];
} spx_trdc_tensor;

typedef struct spx_trdc spx_trdc;

/* ---- Reader ---------------------------------------------------------- */

/* Maps and validates path. On failure *out is NULL and e names the file,
 * the field and what was wrong. */
spx_status spx_trdc_open(const char *path, spx_trdc **out, spx_err *e);
/* Validates a file image already in memory (not copied: buf must outlive
 * the handle, and be 8-byte aligned so typed pointers are aligned). label
 * names it in messages. For tests and fuzzers. */
spx_status spx_trdc_open_buffer(const uint8_t *buf, size_t len, const char *label,
                                spx_trdc **out, spx_err *e);
void spx_trdc_close(spx_trdc *f);
/* The mapped file's pages replaced by a private copy at the same addresses
 * (core/mapfile.h's spx_map_make_resident; every view stays valid); for a
 * buffer, nothing to do. resident: copied, or a buffer. */
spx_status spx_trdc_make_resident(spx_trdc *f, spx_err *e);
int spx_trdc_resident(const spx_trdc *f);

const char *spx_trdc_path(const spx_trdc *f);     /* the label/path given */
uint64_t spx_trdc_version(const spx_trdc *f);
uint64_t spx_trdc_file_size(const spx_trdc *f);
uint64_t spx_trdc_manifest_offset(const spx_trdc *f);
uint64_t spx_trdc_manifest_size(const spx_trdc *f);

size_t spx_trdc_count(const spx_trdc *f);
const spx_trdc_tensor *spx_trdc_at(const spx_trdc *f, size_t i);   /* NULL if out of range */
const spx_trdc_tensor *spx_trdc_find(const spx_trdc *f, const char *name); /* NULL if absent */

/* Manifest sections, borrowed from the handle (valid until close; do not
 * modify). config and quantization are always objects; source may be NULL. */
const struct cJSON *spx_trdc_config(const spx_trdc *f);
const struct cJSON *spx_trdc_quant_settings(const spx_trdc *f);
const struct cJSON *spx_trdc_source(const spx_trdc *f);
/* The config as a newly allocated, unformatted JSON string (caller frees
 * with free()); NULL only on out-of-memory. */
char *spx_trdc_config_json(const spx_trdc *f);
/* Tokenizer file contents as stored (borrowed; NULL if the file has none). */
const char *spx_trdc_tokenizer_json(const spx_trdc *f);
const char *spx_trdc_tokenizer_config_json(const spx_trdc *f);
const char *spx_trdc_generator(const spx_trdc *f); /* "" if absent */
spx_trdc_contents_kind spx_trdc_contents(const spx_trdc *f);
/* "source": {"bytes": N} as an integer, -1 if absent or not an integer. */
int64_t spx_trdc_source_bytes(const spx_trdc *f);

const char *spx_trdc_kind_name(spx_trdc_kind k);  /* "dense" / "quant" */
const char *spx_trdc_comp_name(spx_trdc_comp c);  /* "data", "codes", ... */

/* ---- Tuned refinement budgets (.refine files; docs/trdc.md 2.6) ------- */

#define SPX_TRDC_TUNED_SETS 4            /* k per projection set: q/k/v, o, gate/up, down */
#define SPX_TRDC_TUNED_KMAX (1 << 20)    /* largest k recorded */
#define SPX_TRDC_TUNED_NAME 256          /* platform names are 1..255 bytes */
#define SPX_TRDC_TUNED_MAX_LEVELS 64     /* budgets per platform */
#define SPX_TRDC_TUNED_MAX_PLATFORMS 256

/* One entry of the manifest's "tuned" object: the budgets `spectra tune`
 * chose on one platform under one slowdown budget. */
typedef struct spx_trdc_tuned {
    char platform[SPX_TRDC_TUNED_NAME]; /* the key (refine/tuned.h spx_refine_platform) */
    double budget;                /* the slowdown limit, a fraction in (0, 1) */
    int64_t k[SPX_TRDC_TUNED_SETS]; /* channels per 1,024, per set */
    double slowdown;              /* measured decode slowdown against the base, a fraction */
    double kl, kl_base;           /* mean KL on the tuning windows: tuned, and the base (k = 0) */
    /* optional in the file (absent: these defaults, what an entry written
     * before them meant): the MLP mode (SPX_REFINE_MLP_*, absent: channel)
     * and its neuron budget (neuron mode only; else 0), the GPU schedule
     * (thread blocks, 0: the backend's default; lag and lead in
     * half-blocks 0..4, absent: 0) */
    int32_t mlp;
    int64_t kn;
    int32_t cuda_blocks, cuda_lag, cuda_lead;
    char date[32];                /* when measured, ISO 8601 UTC */
    char windows[256];            /* informative: the tuning text and windows ("" when absent) */
} spx_trdc_tuned;

/* The entries, platform by platform in the file's order, each platform's
 * budgets ascending (validated at open). */
size_t spx_trdc_tuned_count(const spx_trdc *f);
const spx_trdc_tuned *spx_trdc_tuned_at(const spx_trdc *f, size_t i); /* NULL if out of range */
/* The entry of `platform` with the largest budget <= level (the nearest
 * not exceeding it), or NULL. */
const spx_trdc_tuned *spx_trdc_tuned_pick(const spx_trdc *f, const char *platform, double level);
/* Rewrites the .refine at path with t added to its manifest (replacing the
 * entry of the same platform and budget). The payload is copied unchanged;
 * the new file goes to "<path>.tmp.<pid>", is validated by the reader and
 * then renamed over path, so a failure leaves the original as it was
 * (and names the file and the step). SPX_ERR_ARG for a model file. */
spx_status spx_trdc_set_tuned(const char *path, const spx_trdc_tuned *t, spx_err *e);
/* SPX_OK if a file can be created beside path (what spx_trdc_set_tuned
 * needs), else SPX_ERR_IO naming it: a check before a long measurement. */
spx_status spx_trdc_writable_dir(const char *path, spx_err *e);

/* ---- Verification ---------------------------------------------------- */

typedef struct spx_trdc_verify_report {
    size_t n_tensors;
    size_t n_components;     /* components checked */
    size_t n_mismatches;
    uint64_t bytes_checked;
} spx_trdc_verify_report;

/* progress: called after each component with bytes done / total. */
typedef void (*spx_trdc_progress_fn)(void *user, uint64_t done, uint64_t total);
/* on_mismatch: called for every component whose CRC differs. */
typedef void (*spx_trdc_mismatch_fn)(void *user, const spx_trdc_tensor *t,
                                     spx_trdc_comp c, uint32_t expected,
                                     uint32_t actual);

/* Checks the CRC32 of every component of every tensor (all of them, not
 * only up to the first bad one). Returns SPX_ERR_CRC when any differs; e
 * then names the first bad tensor and component with expected and actual
 * values and the number of mismatches. Callbacks and report may be NULL. */
spx_status spx_trdc_verify(const spx_trdc *f, spx_trdc_progress_fn progress,
                           spx_trdc_mismatch_fn on_mismatch, void *user,
                           spx_trdc_verify_report *report, spx_err *e);

/* ---- Writer ---------------------------------------------------------- */

typedef struct spx_trdc_writer spx_trdc_writer;

/* Creates "<path>.tmp.<pid>" and writes a placeholder header (manifest
 * length 0, which no reader accepts, so an unfinished file is never
 * mistaken for a complete one). */
spx_status spx_trdc_writer_open(const char *path, spx_trdc_writer **out, spx_err *e);

/* A dense F32/F16/BF16 tensor; nbytes must equal numel * dtype size. */
spx_status spx_trdc_writer_add_dense(spx_trdc_writer *w, const char *name, spx_dtype dtype,
                                     int ndim, const int64_t *shape, const void *data,
                                     size_t nbytes, spx_err *e);

/* A quantized matrix: q's fields give the shape, bits, group and the
 * component buffers (sizes implied by qtensor.h; outlier buffers are read
 * only when n_outliers > 0 and their indices must be strictly increasing
 * and < cols). kappa and r are recorded (NaN is written as null). */
spx_status spx_trdc_writer_add_quant(spx_trdc_writer *w, const char *name,
                                     const spx_qtensor *q, double kappa, double r,
                                     spx_err *e);

/* A refine4 tensor (a .refine file: once one is added, the file's
 * contents are "refine" and it may hold only refine4 tensors): the
 * residual of the base matrix `name` [rows, cols], its codes column by
 * column (cols * col_stride bytes, col_stride >= (rows + 1) / 2) and one
 * float32 scale per row; base_crc32: the checksum of the base matrix's
 * codes component, recorded so a mismatched pair is refused. */
spx_status spx_trdc_writer_add_refine(spx_trdc_writer *w, const char *name, int64_t rows, int64_t cols,
                                      int64_t col_stride, const uint8_t *codes, const float *scales,
                                      uint32_t base_crc32, spx_err *e);

/* A bundle4 tensor (a .refine, like refine4; the file becomes version 5):
 * the neuron bundles of one MLP layer (refine/bundle.h) named `name`, n
 * bundles of `stride` bytes (>= spx_bundle_bytes(hidden)) and 2 * hidden
 * float32 scales (d's, then the down residual's). */
spx_status spx_trdc_writer_add_bundles(spx_trdc_writer *w, const char *name, int64_t n, int64_t hidden, int64_t stride,
                                       const uint8_t *data, const float *scales, spx_err *e);

/* Appends the manifest, rewrites the header, fsyncs and renames the temp
 * file to the final path; frees w in every case (success or not).
 * config_json: the source config.json text (an object; embedded verbatim).
 * tokenizer_json / tokenizer_config_json: file contents or NULL.
 * quant_settings_json: an object's text, or NULL for {}.
 * source_info_json: an object's text (e.g. {"bytes": N, "params": N}) or NULL. */
spx_status spx_trdc_writer_finish(spx_trdc_writer *w, const char *config_json,
                                  const char *tokenizer_json,
                                  const char *tokenizer_config_json,
                                  const char *quant_settings_json,
                                  const char *source_info_json, spx_err *e);

/* Deletes the temp file and frees w (NULL is a no-op). */
void spx_trdc_writer_abort(spx_trdc_writer *w);

/* Bytes of payload written so far (the next component's offset, before
 * alignment). */
uint64_t spx_trdc_writer_bytes(const spx_trdc_writer *w);

#endif

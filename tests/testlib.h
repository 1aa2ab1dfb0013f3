/* testlib.h: the small harness every test program uses.
 *
 * A test is a program: it runs its checks, prints one line per failure with
 * file:line, and returns tl_finish() (non-zero if anything failed). The
 * shared fixtures are found through $SPECTRA_SHARED (tests/run.sh sets it)
 * or ../shared. Tolerance comparisons follow `|got-ref| <= atol + rtol*|ref|`,
 * report the worst element and fail on NaN. */
#ifndef SPX_TESTLIB_H
#define SPX_TESTLIB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int tl_failures;
extern int tl_checks;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        tl_checks++;                                                       \
        if (!(cond)) {                                                     \
            tl_failures++;                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)

/* Path under the shared fixtures folder (static buffer rotation of 8). */
const char *tl_shared(const char *rel);
/* A fresh temporary directory (removed by tl_finish). */
const char *tl_tmpdir(void);
/* Reads a whole file; NULL on failure (prints why). */
char *tl_read(const char *path, size_t *len);
/* Writes bytes to a file; returns 0 on success. */
int tl_write(const char *path, const void *data, size_t len);
/* mkdir (0 also when it exists); entries of a folder other than . and ..
 * (-1 if it cannot be read). */
int tl_mkdir(const char *path);
int tl_dir_entries(const char *path);

typedef struct tl_cmp {
    double max_abs;     /* largest |got - ref| */
    size_t worst;       /* index of the largest violation ratio */
    int nan;            /* a NaN/inf appeared in got */
    int ok;
} tl_cmp;
tl_cmp tl_compare(const float *got, const float *ref, size_t n, double atol, double rtol);

/* Deterministic random numbers for test inputs. */
uint64_t tl_rand_u64(uint64_t *s);
float tl_rand_normal(uint64_t *s);
float tl_rand_uniform(uint64_t *s); /* [0,1) */

/* Logits [n_tok, vocab] (malloc'd) of ids fed one token a step (decode
 * steps) through a fresh float32-KV session of m; a failing step is a
 * failed check (its rows stay unwritten). */
struct spx_model;
float *tl_decode_steps(struct spx_model *m, const int32_t *ids, int n_tok);
/* max |a - b| and mean |a - b| over n floats (double sums). */
double tl_max_diff(const float *a, const float *b, size_t n);
double tl_mean_diff(const float *a, const float *b, size_t n);

/* Prints "name: N checks, M failures" and returns the exit status. */
int tl_finish(const char *name);

#endif

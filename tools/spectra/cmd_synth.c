/* cmd_synth.c: `spectra synth --shape NAME -o OUT.trdc [--refine OUT.refine] [--hf DIR]`. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "format/tokenizer.h"
#include "model/synth.h"

#include <stdio.h>
#include <stdlib.h>
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
               "  --tokenizer DIR with -o: carry DIR's tokenizer.json (+ tokenizer_config.json), whose ids must\n"
               "                  fit the shape's vocabulary (text in, random text out: for serve/chat speed)\n"
               "  --layout L      tiled (default) or rows: the matrices' storage, as for compress\n"
               "  --bits B        the codes' width: 4 (default), 3 or 2 (packed at their width, as compress)\n");
}

int cmd_synth(int argc, char **argv) {
    const char *shape = NULL, *out = NULL, *hf = NULL, *refine = NULL, *tok_dir = NULL;
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
        else if (!strcmp(a, "--tokenizer")) tok_dir = v;
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
    char *tj = NULL, *tc = NULL;
    if (tok_dir) { /* it must load and its ids fit the shape's vocabulary */
        if (!out) { cli_error("synth: --tokenizer needs -o OUT.trdc"); return 2; }
        spx_tokenizer *t = NULL;
        if (spx_tok_load_dir(tok_dir, &t, NULL, &e) != SPX_OK) return cli_fail(&e);
        const int64_t tv = spx_tok_vocab_size(t);
        spx_tok_free(t);
        if (tv > s->vocab) {
            cli_error("synth: %s/tokenizer.json has ids up to %lld, beyond the %s shape's vocabulary of %lld", tok_dir,
                      (long long)tv - 1, s->name, (long long)s->vocab);
            return 1;
        }
        char *p = spx_path_join(tok_dir, "tokenizer.json"), *q = spx_path_join(tok_dir, "tokenizer_config.json");
        size_t n;
        int bad = !p || !q || !(tj = cli_read_text(p, &n)) || (spx_file_exists(q) && !(tc = cli_read_text(q, &n)));
        free(p);
        free(q);
        if (bad) { free(tj); free(tc); return 1; }
    }
    if (out) {
        spx_status st = spx_synth_write_trdc(s, out, (int)bits, ratio, (uint64_t)seed, row_major, refine, tj, tc, &e);
        free(tj);
        free(tc);
        if (st != SPX_OK) return cli_fail(&e);
        fprintf(stderr, "wrote %s (%s shape)%s%s\n", out, s->name, refine ? " and " : "", refine ? refine : "");
    }
    if (hf) {
        if (spx_synth_write_hf(s, hf, (uint64_t)seed, &e) != SPX_OK) return cli_fail(&e);
        fprintf(stderr, "wrote %s/config.json and model.safetensors (%s shape, bf16)\n", hf, s->name);
    }
    return 0;
}

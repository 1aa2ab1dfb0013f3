/* cmd_logits.c: `spectra logits -m MODEL --ids 1,2,3 -o FILE`: float32
 * little-endian logits [T, vocab] for every position, written atomically. */
#include "cli.h"
#include "common.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra logits -m MODEL --ids LIST -o FILE [--threads N]\n"
               "  -m MODEL       Hugging Face folder or .trdc file\n"
               "  --ids LIST     token ids, comma or space separated (fed as one sequence, no BOS added)\n"
               "  -o FILE        output: float32 little-endian, row-major [T, vocab]\n"
               "  --kv TYPE      KV cache storage: f32, f16 or q4 (Group-32 4-bit; default f16)\n"
               "                  or the low-bit k2v2, k3v2, k3v3, k4v4 (docs/kv.md)\n" CLI_KV_USAGE
               "  --threads N    worker threads (int, 1..1024; default: all CPUs)\n"
               "  --backend B    cpu, cuda or auto (auto: cuda if built in and a GPU is present; default cpu)\n");
}

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *out = NULL;
    int64_t threads = 0;
    const char *backend = NULL;
    spx_kv_type kv = SPX_KV_F16;
    cli_kv_extra kvx = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((r = cli_kv_opt(argc, argv, &i, &kvx)) != 0) { if (r < 0) return 2; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!(model = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--ids")) { if (!(ids_s = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "-o")) { if (!(out = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--kv")) { if (!(v = cli_value(argc, argv, &i)) || !cli_kv(v, &kv)) return 2; }
        else if (!strcmp(a, "--backend")) { if (!(backend = cli_value(argc, argv, &i)) || !cli_backend(backend)) return 2; }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, 1024, &threads)) return 2;
        } else { cli_error("logits: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!cli_kv_check(kv, &kvx)) return 2;
    if (!ids_s || !out) { cli_error("logits: --ids and -o are required"); usage(stderr); return 2; }
    size_t n = 0;
    int32_t *ids = cli_parse_ids(ids_s, "--ids", 0, &n);
    if (!ids) return 2;
    spx_model *m = cli_open_model_on(model, threads, backend);
    if (!m) { free(ids); return 1; }
    int rc = 1;
    spx_session *s = NULL;
    int64_t V = spx_model_vocab_size(m);
    float *logits = malloc(n * (size_t)V * sizeof(float));
    spx_session_params sp = {.n_ctx = (int64_t)n, .kv = kv};
    cli_kv_apply(&kvx, &sp);
    if (!logits) cli_error("out of memory for %zu x %lld logits", n, (long long)V);
    else if (spx_session_new(m, &sp, &s) != SPX_OK) cli_error("%s", spx_model_error(m));
    else if (spx_session_eval(s, ids, n, logits, 1) != SPX_OK) cli_error("%s", spx_session_error(s));
    else {
        spx_err e;
        spx_err_clear(&e);
        if (spx_write_file_atomic(out, logits, n * (size_t)V * sizeof(float), &e) != SPX_OK) cli_fail(&e);
        else {
            fprintf(stderr, "wrote %zu x %lld logits to %s\n", n, (long long)V, out);
            rc = 0;
        }
    }
    free(logits);
    free(ids);
    spx_session_free(s);
    spx_model_free(m);
    return rc;
}

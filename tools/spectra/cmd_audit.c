/* cmd_audit.c: `spectra audit -m MODEL.trdc [--source HF_DIR] [--json]`:
 * per quantized tensor, the relative Frobenius error, SNR, cosine
 * similarity and the largest |w - w^| / s over groups spanning zero
 * (Proposition 2 says <= 1/2 plus fp16 slack), against the source
 * checkpoint; then a summary over all quantized weights. */
#include "cli.h"
#include "core/util.h"
#include "format/safetensors.h"
#include "format/trdc.h"
#include "quant/metrics.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra audit -m MODEL.trdc [--source HF_DIR] [--json]\n"
               "  -m MODEL.trdc   compressed model\n"
               "  --source DIR    the Hugging Face folder it was made from (default: the path recorded\n"
               "                  in the file's manifest at compression time)\n"
               "  --json          one JSON object: per-tensor rows and the summary\n");
}

int cmd_audit(int argc, char **argv) {
    const char *model = NULL, *source = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--source")) source = v;
        else { cli_error("audit: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!model) { cli_error("audit: -m MODEL.trdc is required"); usage(stderr); return 2; }
    spx_err e;
    spx_err_clear(&e);
    spx_trdc *f = NULL;
    spx_st *st = NULL;
    if (spx_trdc_open(model, &f, &e) != SPX_OK) return cli_fail(&e);
    if (!source) {
        const cJSON *src = spx_trdc_source(f);
        const cJSON *p = src ? cJSON_GetObjectItemCaseSensitive(src, "path") : NULL;
        if (!cJSON_IsString(p)) {
            spx_trdc_close(f);
            return cli_error("%s: no source path recorded; give --source HF_DIR", model);
        }
        source = p->valuestring;
    }
    if (spx_st_open(source, &st, &e) != SPX_OK) {
        spx_trdc_close(f);
        return cli_fail(&e);
    }
    int rc = 0;
    spx_qmetrics total;
    spx_qmetrics_init(&total);
    float *w = NULL, *scratch = NULL;
    int64_t cap = 0, n_quant = 0;
    cJSON *out = json ? cJSON_CreateObject() : NULL, *rows = json ? cJSON_AddArrayToObject(out, "tensors") : NULL;
    if (!json)
        printf("%-44s %12s %9s %8s %9s %9s %6s\n", "tensor", "shape", "rel.err", "SNR dB", "cosine", "max e/s", "outl");
    for (size_t i = 0; i < spx_trdc_count(f); i++) {
        const spx_trdc_tensor *t = spx_trdc_at(f, i);
        if (t->kind != SPX_TRDC_QUANT) continue;
        const spx_st_tensor *s = spx_st_find(st, t->name);
        if (!s || s->ndim != 2 || s->shape[0] != t->shape[0] || s->shape[1] != t->shape[1] ||
            (s->dtype != SPX_DT_F32 && s->dtype != SPX_DT_F16 && s->dtype != SPX_DT_BF16)) {
            rc = cli_error("%s: tensor '%s' is missing from %s or has another shape", model, t->name, source);
            break;
        }
        int64_t cols = t->shape[1];
        if (cols > cap) {
            free(w); free(scratch);
            w = malloc((size_t)cols * sizeof *w);
            scratch = malloc((size_t)cols * sizeof *scratch);
            cap = cols;
            if (!w || !scratch) { rc = cli_error("out of memory"); break; }
        }
        spx_qmetrics m;
        spx_qmetrics_init(&m);
        for (int64_t r = 0; r < t->shape[0]; r++) {
            spx_st_row_f32(s, r * cols, cols, w);
            spx_qmetrics_add_row(&m, &t->q, r, w, scratch);
        }
        spx_qmetrics_merge(&total, &m);
        spx_qreport rep;
        spx_qmetrics_report(&m, &rep);
        n_quant++;
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", t->name);
            cJSON_AddNumberToObject(o, "rows", (double)t->shape[0]);
            cJSON_AddNumberToObject(o, "cols", (double)cols);
            cJSON_AddNumberToObject(o, "rel_err", rep.rel_err);
            cJSON_AddNumberToObject(o, "snr_db", rep.snr_db);
            cJSON_AddNumberToObject(o, "cosine", rep.cosine);
            cJSON_AddNumberToObject(o, "max_err_over_s", rep.max_err_over_s);
            cJSON_AddNumberToObject(o, "n_outliers", (double)t->q.n_outliers);
            cJSON_AddItemToArray(rows, o);
        } else {
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)t->shape[0], (long long)cols);
            printf("%-44.44s %12s %9.5f %8.2f %9.6f %9.4f %6lld\n", t->name, shape, rep.rel_err, rep.snr_db,
                   rep.cosine, rep.max_err_over_s, (long long)t->q.n_outliers);
        }
    }
    if (rc == 0) {
        spx_qreport rep;
        spx_qmetrics_report(&total, &rep);
        if (json) {
            cJSON *sum = cJSON_AddObjectToObject(out, "summary");
            cJSON_AddNumberToObject(sum, "tensors", (double)n_quant);
            cJSON_AddNumberToObject(sum, "weights", (double)total.n);
            cJSON_AddNumberToObject(sum, "rel_err", rep.rel_err);
            cJSON_AddNumberToObject(sum, "snr_db", rep.snr_db);
            cJSON_AddNumberToObject(sum, "cosine", rep.cosine);
            cJSON_AddNumberToObject(sum, "max_err_over_s", rep.max_err_over_s);
            cJSON_AddNumberToObject(sum, "groups_spanning_zero", (double)rep.n_groups_span);
            cJSON_AddNumberToObject(sum, "groups", (double)rep.n_groups);
            char *txt = cJSON_Print(out);
            if (txt) puts(txt);
            free(txt);
        } else {
            printf("summary: %lld quantized tensors, %lld weights: rel.err %.5f, SNR %.2f dB, cosine %.6f, "
                   "max |w-w^|/s %.4f over %lld of %lld groups spanning zero\n",
                   (long long)n_quant, (long long)total.n, rep.rel_err, rep.snr_db, rep.cosine, rep.max_err_over_s,
                   (long long)rep.n_groups_span, (long long)rep.n_groups);
        }
    }
    cJSON_Delete(out);
    free(w);
    free(scratch);
    spx_st_free(st);
    spx_trdc_close(f);
    return rc;
}

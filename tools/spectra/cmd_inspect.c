/* cmd_inspect.c: `spectra inspect FILE.trdc [--json]`.
 *
 * Prints what a .trdc holds, one row per tensor (name, kind, shape,
 * dtype or bits/group, outlier count and ratio r, kurtosis kappa, stored
 * bytes, bits per weight) and totals: parameters, bytes, bits per weight
 * overall and for quantized tensors only, file size and the compression
 * ratio against the source size recorded in the manifest. Bits per weight
 * count every stored byte of a tensor (codes, scales, zero points,
 * outliers), not only its codes, as stored in the file; a table by code
 * width and group splits the quantized tensors' bits per weight into its
 * components. The file is fully validated on open; CRCs are checked by
 * `spectra verify`, not here. */
#include "cli.h"
#include "common.h"
#include "format/trdc.h"
#include "model/arch.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra inspect FILE.trdc [--json]\n"
               "  FILE.trdc   a TRDC container (see docs/trdc.md)\n"
               "  --json      print one JSON document instead of the table\n"
               "  -h, --help  this help\n");
}

/* 1234567 -> "1,234,567" into buf. */
static const char *grp(uint64_t v, char *buf, size_t n) {
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v), k = 0;
    for (int i = 0; i < len && (size_t)k + 2 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0) buf[k++] = ',';
        buf[k++] = tmp[i];
    }
    buf[k] = 0;
    return buf;
}

static void shape_text(const spx_trdc_tensor *t, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int d = 0; d < t->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? "x%lld" : "%lld", (long long)t->shape[d]);
}

typedef struct totals {
    uint64_t params, bytes, q_params, q_bytes, d_params, d_bytes;
    size_t n_quant, n_dense;
} totals;

static totals sum_up(const spx_trdc *f) {
    totals s = {0};
    for (size_t i = 0; i < spx_trdc_count(f); i++) {
        const spx_trdc_tensor *t = spx_trdc_at(f, i);
        s.params += (uint64_t)t->numel;
        s.bytes += t->nbytes;
        if (t->kind == SPX_TRDC_QUANT) {
            s.q_params += (uint64_t)t->numel;
            s.q_bytes += t->nbytes;
            s.n_quant++;
        } else {
            s.d_params += (uint64_t)t->numel;
            s.d_bytes += t->nbytes;
            s.n_dense++;
        }
    }
    return s;
}

static double bpw(uint64_t bytes, uint64_t params) { return params ? 8.0 * (double)bytes / (double)params : 0.0; }

/* The quantized tensors of one (bits, group): stored bytes by component. */
typedef struct width_sum {
    int bits, group;
    size_t n;
    uint64_t params, codes, scales, zeros, outliers;
} width_sum;

/* Sums by (bits, group), in order of bits then group, into ws[12]; the count. */
static int sum_widths(const spx_trdc *f, width_sum *ws) {
    int n = 0;
    for (int b = 2; b <= 4; b++)
        for (int gi = 0; gi < 3; gi++) {
            width_sum w = {b, 32 << gi, 0, 0, 0, 0, 0, 0};
            for (size_t i = 0; i < spx_trdc_count(f); i++) {
                const spx_trdc_tensor *t = spx_trdc_at(f, i);
                if (t->kind != SPX_TRDC_QUANT || t->q.bits != w.bits || t->q.group != w.group) continue;
                w.n++;
                w.params += (uint64_t)t->numel;
                w.codes += t->comp[SPX_TRDC_C_CODES].size;
                w.scales += t->comp[SPX_TRDC_C_SCALES].size;
                w.zeros += t->comp[SPX_TRDC_C_ZEROS].size;
                w.outliers += t->comp[SPX_TRDC_C_OUTLIER_IDX].size + t->comp[SPX_TRDC_C_OUTLIER_VAL].size;
            }
            if (w.n) ws[n++] = w;
        }
    return n;
}

static const char *model_type(const spx_trdc *f) {
    const cJSON *c = spx_trdc_config(f);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(c, "model_type");
    if (cJSON_IsString(mt)) return mt->valuestring;
    const cJSON *ar = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(c, "architectures"), 0);
    return cJSON_IsString(ar) ? ar->valuestring : "?";
}

static void print_table(const spx_trdc *f) {
    char b1[32], b2[32], b3[32];
    totals s = sum_up(f);
    char *qs = cJSON_PrintUnformatted((cJSON *)spx_trdc_quant_settings(f));
    printf("%s: TRDC4B01 version %llu, generator \"%s\", model_type %s, %zu tensors, "
           "tokenizer %s\n",
           spx_trdc_path(f), (unsigned long long)spx_trdc_version(f), spx_trdc_generator(f),
           model_type(f), spx_trdc_count(f), spx_trdc_tokenizer_json(f) ? "embedded" : "none");
    printf("quantization: %s\n", qs ? qs : "?");
    {
        char *cj = spx_trdc_config_json(f), lay[1200] = "?";
        spx_config cfg;
        spx_err e;
        spx_err_clear(&e);
        if (cj && spx_config_parse(cj, strlen(cj), spx_trdc_path(f), &cfg, &e) == SPX_OK)
            spx_arch_layers_summary(&cfg, lay, sizeof lay);
        else snprintf(lay, sizeof lay, "config not understood: %s", e.msg);
        printf("layers: %s\n\n", lay);
        free(cj);
    }
    free(qs);

    int w = 4;
    for (size_t i = 0; i < spx_trdc_count(f); i++) {
        int l = (int)strlen(spx_trdc_at(f, i)->name);
        if (l > w) w = l;
    }
    if (w > 64) w = 64;
    printf("%-*s  %-5s  %-16s  %-7s  %8s  %7s  %8s  %14s  %6s\n", w, "name", "kind", "shape",
           "type", "outliers", "r", "kappa", "bytes", "bpw");
    for (size_t i = 0; i < spx_trdc_count(f); i++) {
        const spx_trdc_tensor *t = spx_trdc_at(f, i);
        char shp[64], type[16], outl[24] = "-", rr[24] = "-", kap[24] = "-";
        shape_text(t, shp, sizeof shp);
        if (t->kind == SPX_TRDC_QUANT) {
            snprintf(type, sizeof type, "%d/g%d%s", (int)t->q.bits, (int)t->q.group,
                     t->q.layout == SPX_Q_TILED ? "/t" : ""); /* /t: tile16x128 (docs/trdc.md 2.4) */
            snprintf(outl, sizeof outl, "%lld", (long long)t->q.n_outliers);
            if (!isnan(t->r)) snprintf(rr, sizeof rr, "%.2f%%", 100.0 * t->r);
            if (!isnan(t->kappa)) snprintf(kap, sizeof kap, "%.2f", t->kappa);
        } else if (t->kind == SPX_TRDC_REFINE) {
            snprintf(type, sizeof type, "4/col"); /* residual columns (refine/refine.h) */
        } else if (t->kind == SPX_TRDC_BUNDLE) {
            snprintf(type, sizeof type, "4/neuron"); /* neuron bundles (refine/bundle.h) */
        } else {
            snprintf(type, sizeof type, "%s", spx_dtype_name(t->dtype));
        }
        printf("%-*.*s  %-5s  %-16s  %-7s  %8s  %7s  %8s  %14s  %6.3f\n", w, w, t->name,
               spx_trdc_kind_name(t->kind), shp, type, outl, rr, kap, grp(t->nbytes, b1, sizeof b1),
               bpw(t->nbytes, (uint64_t)t->numel));
    }
    uint64_t fsz = spx_trdc_file_size(f);
    printf("\ntotals\n");
    printf("  parameters        %s (%zu quantized tensors, %zu dense)\n", grp(s.params, b1, sizeof b1),
           s.n_quant, s.n_dense);
    printf("  tensor bytes      %s  (%.3f bits per weight overall)\n", grp(s.bytes, b1, sizeof b1),
           bpw(s.bytes, s.params));
    printf("  quantized only    %s params in %s bytes (%.3f bits per weight)\n",
           grp(s.q_params, b1, sizeof b1), grp(s.q_bytes, b2, sizeof b2), bpw(s.q_bytes, s.q_params));
    printf("  dense only        %s params in %s bytes (%.3f bits per weight)\n",
           grp(s.d_params, b1, sizeof b1), grp(s.d_bytes, b2, sizeof b2), bpw(s.d_bytes, s.d_params));
    width_sum ws[12];
    const int nw = sum_widths(f, ws);
    for (int i = 0; i < nw; i++) {
        const width_sum *ww = &ws[i];
        printf("  %d-bit g%-3d        %zu matrices, %s params: %.3f bits per weight = codes %.3f + scales %.3f + "
               "zero points %.3f + outliers %.3f\n",
               ww->bits, ww->group, ww->n, grp(ww->params, b1, sizeof b1),
               bpw(ww->codes + ww->scales + ww->zeros + ww->outliers, ww->params), bpw(ww->codes, ww->params),
               bpw(ww->scales, ww->params), bpw(ww->zeros, ww->params), bpw(ww->outliers, ww->params));
    }
    printf("  file size         %s bytes (manifest %s, padding and header %s)\n", grp(fsz, b1, sizeof b1),
           grp(spx_trdc_manifest_size(f), b2, sizeof b2),
           grp(fsz - spx_trdc_manifest_size(f) - s.bytes, b3, sizeof b3));
    int64_t src = spx_trdc_source_bytes(f);
    if (src >= 0 && fsz > 0)
        printf("  source            %s bytes (ratio source/file %.2fx)\n", grp((uint64_t)src, b1, sizeof b1),
               (double)src / (double)fsz);
    else
        printf("  source            not recorded in the manifest\n");
    if (spx_trdc_tuned_count(f)) printf("\ntuned refinement budgets (spectra tune; k per 1024 q/k/v,o,gate/up,down)\n");
    for (size_t i = 0; i < spx_trdc_tuned_count(f); i++) {
        const spx_trdc_tuned *t = spx_trdc_tuned_at(f, i);
        char mode[96] = "MLP channel";
        int n = t->mlp == SPX_REFINE_MLP_NEURON ? snprintf(mode, sizeof mode, "MLP neuron kn %lld", (long long)t->kn)
                                                : (int)strlen(mode);
        if (t->cuda_blocks || t->cuda_lag || t->cuda_lead)
            snprintf(mode + n, sizeof mode - (size_t)n, ", cuda blocks %d lag %g lead %g", (int)t->cuda_blocks,
                     0.5 * t->cuda_lag, 0.5 * t->cuda_lead);
        printf("  %s: budget %g%%: k %lld,%lld,%lld,%lld, %s, measured slowdown %.2f%%, KL %.5f (base %.5f), %s%s%s\n",
               t->platform, 100 * t->budget, (long long)t->k[0], (long long)t->k[1], (long long)t->k[2],
               (long long)t->k[3], mode, 100 * t->slowdown, t->kl, t->kl_base, t->date, t->windows[0] ? "; " : "",
               t->windows);
    }
}

static int print_json(const spx_trdc *f) {
    totals s = sum_up(f);
    cJSON *r = cJSON_CreateObject(), *ts = cJSON_CreateArray(), *tot = cJSON_CreateObject();
    if (!r || !ts || !tot) goto oom;
    cJSON_AddStringToObject(r, "file", spx_trdc_path(f));
    cJSON_AddStringToObject(r, "format", SPX_TRDC_MAGIC);
    cJSON_AddNumberToObject(r, "version", (double)spx_trdc_version(f));
    cJSON_AddStringToObject(r, "generator", spx_trdc_generator(f));
    cJSON_AddStringToObject(r, "model_type", model_type(f));
    cJSON_AddBoolToObject(r, "tokenizer", spx_trdc_tokenizer_json(f) != NULL);
    cJSON_AddItemToObject(r, "quantization", cJSON_Duplicate(spx_trdc_quant_settings(f), 1));
    if (spx_trdc_source(f)) cJSON_AddItemToObject(r, "source", cJSON_Duplicate(spx_trdc_source(f), 1));
    for (size_t i = 0; i < spx_trdc_count(f); i++) {
        const spx_trdc_tensor *t = spx_trdc_at(f, i);
        cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *cs = cJSON_CreateObject();
        if (!o || !sh || !cs) {
            cJSON_Delete(o);
            cJSON_Delete(sh);
            cJSON_Delete(cs);
            goto oom;
        }
        cJSON_AddItemToArray(ts, o);
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "kind", spx_trdc_kind_name(t->kind));
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToObject(o, "shape", sh);
        if (t->kind == SPX_TRDC_DENSE) {
            cJSON_AddStringToObject(o, "dtype", spx_dtype_name(t->dtype));
        } else if (t->kind == SPX_TRDC_REFINE) {
            cJSON_AddNumberToObject(o, "bits", 4);
            cJSON_AddNumberToObject(o, "col_stride", (double)t->refine.col_stride);
            if (t->refine.has_base_crc) cJSON_AddNumberToObject(o, "base_crc32", (double)t->refine.base_crc32);
        } else if (t->kind == SPX_TRDC_BUNDLE) {
            cJSON_AddNumberToObject(o, "bits", 4);
            cJSON_AddNumberToObject(o, "bundle_stride", (double)t->refine.col_stride);
        } else {
            cJSON_AddStringToObject(o, "layout", t->q.layout == SPX_Q_TILED ? "tile16x128" : "rows");
            cJSON_AddNumberToObject(o, "bits", t->q.bits);
            cJSON_AddNumberToObject(o, "group", t->q.group);
            cJSON_AddNumberToObject(o, "n_outliers", (double)t->q.n_outliers);
            if (isnan(t->r)) cJSON_AddNullToObject(o, "r");
            else cJSON_AddNumberToObject(o, "r", t->r);
            if (isnan(t->kappa)) cJSON_AddNullToObject(o, "kappa");
            else cJSON_AddNumberToObject(o, "kappa", t->kappa);
        }
        cJSON_AddNumberToObject(o, "params", (double)t->numel);
        cJSON_AddNumberToObject(o, "bytes", (double)t->nbytes);
        cJSON_AddNumberToObject(o, "bpw", bpw(t->nbytes, (uint64_t)t->numel));
        for (int c = 0; c < SPX_TRDC_C_COUNT; c++) {
            if (!t->comp[c].present) continue;
            cJSON *k = cJSON_AddObjectToObject(cs, spx_trdc_comp_name((spx_trdc_comp)c));
            if (!k) continue;
            cJSON_AddNumberToObject(k, "offset", (double)t->comp[c].offset);
            cJSON_AddNumberToObject(k, "size", (double)t->comp[c].size);
            cJSON_AddNumberToObject(k, "crc32", (double)t->comp[c].crc32);
        }
        cJSON_AddItemToObject(o, "components", cs);
    }
    cJSON_AddItemToObject(r, "tensors", ts);
    ts = NULL;
    cJSON *tu = spx_trdc_tuned_count(f) ? cJSON_AddArrayToObject(r, "tuned") : NULL; /* docs/trdc.md 2.6 */
    for (size_t i = 0; tu && i < spx_trdc_tuned_count(f); i++) {
        const spx_trdc_tuned *t = spx_trdc_tuned_at(f, i);
        cJSON *o = cJSON_CreateObject();
        if (!o) goto oom;
        cJSON_AddItemToArray(tu, o);
        cJSON_AddStringToObject(o, "platform", t->platform);
        cJSON_AddNumberToObject(o, "budget", t->budget);
        cJSON *k = cJSON_AddArrayToObject(o, "k");
        for (int j = 0; k && j < SPX_TRDC_TUNED_SETS; j++) cJSON_AddItemToArray(k, cJSON_CreateNumber((double)t->k[j]));
        cJSON_AddNumberToObject(o, "slowdown", t->slowdown);
        cJSON_AddNumberToObject(o, "kl", t->kl);
        cJSON_AddNumberToObject(o, "kl_base", t->kl_base);
        cJSON_AddStringToObject(o, "mlp", t->mlp == SPX_REFINE_MLP_NEURON ? "neuron" : "channel");
        cJSON_AddNumberToObject(o, "kn", (double)t->kn);
        cJSON_AddNumberToObject(o, "cuda_blocks", t->cuda_blocks);
        cJSON_AddNumberToObject(o, "cuda_lag", t->cuda_lag);
        cJSON_AddNumberToObject(o, "cuda_lead", t->cuda_lead);
        cJSON_AddStringToObject(o, "date", t->date);
        cJSON_AddStringToObject(o, "windows", t->windows);
    }
    uint64_t fsz = spx_trdc_file_size(f);
    cJSON_AddNumberToObject(tot, "tensors", (double)spx_trdc_count(f));
    cJSON_AddNumberToObject(tot, "params", (double)s.params);
    cJSON_AddNumberToObject(tot, "bytes", (double)s.bytes);
    cJSON_AddNumberToObject(tot, "bpw", bpw(s.bytes, s.params));
    cJSON_AddNumberToObject(tot, "quant_params", (double)s.q_params);
    cJSON_AddNumberToObject(tot, "quant_bytes", (double)s.q_bytes);
    cJSON_AddNumberToObject(tot, "quant_bpw", bpw(s.q_bytes, s.q_params));
    width_sum ws[12];
    const int nw = sum_widths(f, ws);
    cJSON *bw = cJSON_AddArrayToObject(tot, "by_width");
    for (int i = 0; bw && i < nw; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) goto oom;
        cJSON_AddItemToArray(bw, o);
        cJSON_AddNumberToObject(o, "bits", ws[i].bits);
        cJSON_AddNumberToObject(o, "group", ws[i].group);
        cJSON_AddNumberToObject(o, "matrices", (double)ws[i].n);
        cJSON_AddNumberToObject(o, "params", (double)ws[i].params);
        cJSON_AddNumberToObject(o, "bpw", bpw(ws[i].codes + ws[i].scales + ws[i].zeros + ws[i].outliers, ws[i].params));
        cJSON_AddNumberToObject(o, "codes_bpw", bpw(ws[i].codes, ws[i].params));
        cJSON_AddNumberToObject(o, "scales_bpw", bpw(ws[i].scales, ws[i].params));
        cJSON_AddNumberToObject(o, "zeros_bpw", bpw(ws[i].zeros, ws[i].params));
        cJSON_AddNumberToObject(o, "outliers_bpw", bpw(ws[i].outliers, ws[i].params));
    }
    cJSON_AddNumberToObject(tot, "dense_params", (double)s.d_params);
    cJSON_AddNumberToObject(tot, "dense_bytes", (double)s.d_bytes);
    cJSON_AddNumberToObject(tot, "file_bytes", (double)fsz);
    cJSON_AddNumberToObject(tot, "manifest_bytes", (double)spx_trdc_manifest_size(f));
    int64_t src = spx_trdc_source_bytes(f);
    if (src >= 0 && fsz > 0) {
        cJSON_AddNumberToObject(tot, "source_bytes", (double)src);
        cJSON_AddNumberToObject(tot, "ratio", (double)src / (double)fsz);
    } else {
        cJSON_AddNullToObject(tot, "source_bytes");
        cJSON_AddNullToObject(tot, "ratio");
    }
    cJSON_AddItemToObject(r, "totals", tot);
    tot = NULL;
    char *txt = cJSON_Print(r);
    cJSON_Delete(r);
    if (!txt) return cli_error("out of memory printing JSON");
    puts(txt);
    free(txt);
    return 0;
oom:
    cJSON_Delete(r);
    cJSON_Delete(ts);
    cJSON_Delete(tot);
    return cli_error("out of memory");
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0;
    const int arc = cli_file_and_flag(argc, argv, "inspect", "--json", NULL, &json, usage, &path);
    if (arc >= 0) return arc;
    spx_err e;
    spx_err_clear(&e);
    spx_trdc *f = NULL;
    if (spx_trdc_open(path, &f, &e) != SPX_OK) return cli_fail(&e);
    int rc = 0;
    if (json) rc = print_json(f);
    else print_table(f);
    spx_trdc_close(f);
    return rc;
}

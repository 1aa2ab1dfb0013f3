/* cmd_verify.c: `spectra verify FILE.trdc`.
 *
 * Validates the container (everything spx_trdc_open checks) and then the
 * CRC32 of every component of every tensor, reading the whole payload.
 * Prints "OK: N tensors, M components, X bytes checked" and exits 0, or
 * one MISMATCH line per bad component on stdout, the summary on stderr,
 * and exits 1. Progress goes to stderr when it is a terminal. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "format/trdc.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra verify FILE.trdc [-q]\n"
               "  FILE.trdc    a TRDC container (see docs/trdc.md)\n"
               "  -q, --quiet  no progress display\n"
               "  -h, --help   this help\n"
               "exit status: 0 all checksums match, 1 a mismatch or an invalid file, 2 bad usage\n");
}

typedef struct vstate {
    int tty;
    double t0, last;
} vstate;

static void on_progress(void *user, uint64_t done, uint64_t total) {
    vstate *s = user;
    if (!s->tty) return;
    double now = spx_now();
    if (done < total && now - s->last < 0.1) return;
    s->last = now;
    fprintf(stderr, "\rverifying: %5.1f%% of %.1f MiB", total ? 100.0 * (double)done / (double)total : 100.0,
            (double)total / 1048576.0);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static void on_mismatch(void *user, const spx_trdc_tensor *t, spx_trdc_comp c, uint32_t want,
                        uint32_t got) {
    vstate *s = user;
    if (s->tty) fputc('\n', stderr);
    printf("MISMATCH: tensor '%s' component '%s' (offset %llu, %llu bytes): crc32 0x%08x, expected 0x%08x\n",
           t->name, spx_trdc_comp_name(c), (unsigned long long)t->comp[c].offset,
           (unsigned long long)t->comp[c].size, got, want);
    fflush(stdout);
}

int cmd_verify(int argc, char **argv) {
    const char *path = NULL;
    int quiet = 0;
    const int arc = cli_file_and_flag(argc, argv, "verify", "--quiet", "-q", &quiet, usage, &path);
    if (arc >= 0) return arc;
    spx_err e;
    spx_err_clear(&e);
    spx_trdc *f = NULL;
    if (spx_trdc_open(path, &f, &e) != SPX_OK) return cli_fail(&e);
    vstate s = {!quiet && isatty(2), spx_now(), 0};
    spx_trdc_verify_report rep = {0};
    spx_status st = spx_trdc_verify(f, on_progress, on_mismatch, &s, &rep, &e);
    double dt = spx_now() - s.t0;
    spx_trdc_close(f);
    if (st == SPX_OK) {
        printf("OK: %zu tensors, %zu components, %llu bytes checked (%.1f MiB/s)\n", rep.n_tensors,
               rep.n_components, (unsigned long long)rep.bytes_checked,
               dt > 0 ? (double)rep.bytes_checked / 1048576.0 / dt : 0.0);
        return 0;
    }
    if (st == SPX_ERR_CRC)
        printf("FAILED: %zu of %zu components in %zu tensors have a wrong crc32 (%llu bytes checked)\n",
               rep.n_mismatches, rep.n_components, rep.n_tensors,
               (unsigned long long)rep.bytes_checked);
    return cli_fail(&e);
}

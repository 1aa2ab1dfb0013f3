/* cmd_tokenize.c: `spectra tokenize`: text -> token ids, or ids -> text,
 * with a model folder's tokenizer.json (+ tokenizer_config.json).
 *
 * Limits: MODEL must (for now) be a folder holding tokenizer.json; .trdc
 * files are not read here yet. */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "format/tokenizer.h"
#include "format/trdc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: spectra tokenize -m MODEL [--no-special] [--decode] (TEXT | -f FILE)\n"
            "\n"
            "Prints the token ids of TEXT on one line, separated by spaces.\n"
            "\n"
            "  -m, --model MODEL  folder with tokenizer.json (and optionally\n"
            "                     tokenizer_config.json); required\n"
            "  -f, --file FILE    read TEXT from FILE instead of the command line\n"
            "  --no-special       encode: do not add BOS/EOS (the tokenizer's own rules\n"
            "                     otherwise, like transformers' encode()); special-token\n"
            "                     strings written in the text still become their ids.\n"
            "                     --decode: leave special tokens out of the text\n"
            "  --decode           TEXT is a list of ids (separated by spaces and/or\n"
            "                     commas); print the decoded text instead\n"
            "  --                 end of options (for a TEXT that starts with '-')\n"
            "  -h, --help         show this help\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text = NULL;
    int no_special = 0, decode = 0, opts_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!opts_done && a[0] == '-' && a[1]) {
            if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                usage(stdout);
                return 0;
            } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
                if (!(model = cli_value(argc, argv, &i))) return 2;
            } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
                if (!(file = cli_value(argc, argv, &i))) return 2;
            } else if (!strcmp(a, "--no-special")) {
                no_special = 1;
            } else if (!strcmp(a, "--decode")) {
                decode = 1;
            } else if (!strcmp(a, "--")) {
                opts_done = 1;
            } else {
                cli_error("tokenize: unknown option '%s'", a);
                usage(stderr);
                return 2;
            }
        } else if (!text) {
            text = a;
        } else {
            cli_error("tokenize: more than one TEXT given ('%.40s'); quote the text", a);
            return 2;
        }
    }
    if (!model) {
        cli_error("tokenize: -m MODEL is required");
        usage(stderr);
        return 2;
    }
    if ((text != NULL) == (file != NULL)) {
        cli_error("tokenize: give exactly one of TEXT or -f FILE");
        usage(stderr);
        return 2;
    }

    spx_err e;
    spx_err_clear(&e);
    char *buf = NULL;
    size_t len = 0;
    if (file) {
        if (spx_read_file(file, (size_t)1 << 31, &buf, &len, &e) != SPX_OK) return cli_fail(&e);
        text = buf;
    } else {
        len = strlen(text);
    }
    spx_tokenizer *t = NULL;
    spx_status ls;
    if (spx_is_dir(model)) {
        ls = spx_tok_load_dir(model, &t, NULL, &e); /* a model folder, or tokenizer files alone */
    } else {
        /* a .trdc carries its tokenizer; no weights are bound for this */
        spx_trdc *f = NULL;
        ls = spx_trdc_open(model, &f, &e);
        if (ls == SPX_OK) {
            const char *tj = spx_trdc_tokenizer_json(f), *tc = spx_trdc_tokenizer_config_json(f);
            ls = tj ? spx_tok_load(tj, strlen(tj), tc, tc ? strlen(tc) : 0, model, &t, &e)
                    : spx_fail(&e, SPX_ERR_FORMAT, "%s: the file carries no tokenizer", model);
            spx_trdc_close(f);
        }
    }
    if (ls != SPX_OK) {
        free(buf);
        return cli_fail(&e);
    }
    int rc = 0;
    if (decode) {
        size_t n = 0;
        int32_t *ids = cli_parse_ids(text, "tokenize --decode", 1, &n);
        char *out = NULL;
        size_t ol = 0;
        if (!ids) {
            rc = 1;
        } else if (spx_tok_decode(t, ids, n, no_special, &out, &ol, &e) != SPX_OK) {
            rc = cli_fail(&e);
        } else {
            fwrite(out, 1, ol, stdout);
            fputc('\n', stdout);
        }
        free(out);
        free(ids);
    } else {
        int32_t *ids = NULL;
        size_t n = 0;
        if (spx_tok_encode(t, text, len, !no_special, &ids, &n, &e) != SPX_OK) {
            rc = cli_fail(&e);
        } else {
            for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            putchar('\n');
        }
        free(ids);
    }
    spx_tok_free(t);
    free(buf);
    if (fflush(stdout) != 0 && rc == 0) rc = cli_error("tokenize: cannot write the output");
    return rc;
}

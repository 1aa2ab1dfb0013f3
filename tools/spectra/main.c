/* main.c: `spectra` entry point; dispatches to one file per subcommand. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_experiment(int argc, char **argv);
int cmd_compress(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_kl(int argc, char **argv);
int cmd_audit(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_serve(int argc, char **argv);

static const command commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "an interactive conversation through the model's chat template"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (chat and text completions, streaming, metrics)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"logits", cmd_logits, "write float32 logits for a list of token ids"},
    {"perplexity", cmd_perplexity, "perplexity over a text file in windows"},
    {"inspect", cmd_inspect, "list the tensors, sizes and bits per weight of a .trdc"},
    {"verify", cmd_verify, "check every CRC32 of a .trdc"},
    {"convert", cmd_convert, "rewrite a .trdc with its matrices tiled or row-major (no recompression)"},
    {"compress", cmd_compress, "compress a Hugging Face model into a 4-bit .trdc (no calibration data)"},
    {"kl", cmd_kl, "KL divergence, PPL and top-1 agreement of a model against a reference"},
    {"audit", cmd_audit, "per-tensor quantization error of a .trdc against its source"},
    {"bench", cmd_bench, "prompt and generation speed, bytes per token, GB/s"},
    {"tune", cmd_tune, "search weight refinement budgets within a decode slowdown budget; record them in the .refine"},
    {"plan", cmd_plan, "hardware probe and the execution plan for a model (backend, residency, KV, context)"},
    {"probe", cmd_probe, "CPU, RAM and NVIDIA GPUs of this machine (optionally telemetry samples)"},
    {"synth", cmd_synth, "write a random model of a real shape (.trdc and/or HF folder)"},
    {"experiment", cmd_experiment, "reproduce the paper's quantization experiments A and B"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: spectra COMMAND [options]   (spectra COMMAND --help for its flags)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nMODEL is a Hugging Face folder (config.json, *.safetensors, tokenizer.json)\n"
               "or a .trdc file.\n");
}

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("spectra: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int cli_fail(const spx_err *e) {
    fprintf(stderr, "spectra: %s\n", e->msg[0] ? e->msg : spx_status_name(e->code));
    return 1;
}

int cli_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_error("%s: expected an integer in [%lld, %lld], got '%s'", flag, (long long)lo,
                  (long long)hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_layout(const char *s, int *row_major) {
    if (!strcmp(s, "tiled")) *row_major = 0;
    else if (!strcmp(s, "rows")) *row_major = 1;
    else {
        cli_error("--layout: expected tiled or rows, got '%s'", s);
        return 0;
    }
    return 1;
}

int cli_float(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        cli_error("%s: expected a number in [%g, %g], got '%s'", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_error("%s: missing value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static void log_cb(int level, const char *msg, void *user) {
    int verbose = (int)(intptr_t)user;
    if (level <= SPX_LOG_WARN || (level == SPX_LOG_INFO && verbose) || verbose > 1)
        fprintf(stderr, "%s%s\n", level == SPX_LOG_ERROR ? "error: " : level == SPX_LOG_WARN ? "warning: " : "", msg);
}

void cli_setup_log(int verbose) { spx_set_log(log_cb, (void *)(intptr_t)verbose); }

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    cli_setup_log(0);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    cli_error("unknown command '%s'", argv[1]);
    usage(stderr);
    return 2;
}

/* cli.h: the spectra command-line tool. One file per subcommand; each
 * exports `int cmd_NAME(int argc, char **argv)` (argv[0] is the subcommand
 * name) returning the process exit code, and is listed in main.c. */
#ifndef SPX_CLI_H
#define SPX_CLI_H

#include "core/err.h"
#include <stdint.h>

/* Prints "spectra: <msg>" on stderr and returns 1. */
int cli_error(const char *fmt, ...) SPX_PRINTF(1, 2);
/* Prints the error kept in e and returns its exit code (1). */
int cli_fail(const spx_err *e);

/* Option parsing helpers: parse a whole string as a number in [lo, hi];
 * on failure print "spectra: --flag: ..." and return 0. */
int cli_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_float(const char *flag, const char *s, double lo, double hi, double *out);
/* --layout tiled|rows: *row_major = 0 / 1. */
int cli_layout(const char *s, int *row_major);
/* Returns the value after argv[*i] or prints an error if missing. */
const char *cli_value(int argc, char **argv, int *i);

/* Installs a log callback that prints warnings (and info with -v). */
void cli_setup_log(int verbose);

#endif

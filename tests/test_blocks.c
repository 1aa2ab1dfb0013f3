/* test_blocks.c: the block driver (engine/blocks.h): the order it calls a
 * backend's blocks in, the first-block flag, errors that stop the pass,
 * and the load-time check naming a layer whose kind a backend lacks. */
#include "testlib.h"
#include "engine/blocks.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    char log[512];
    int fail_at; /* the call number that fails (0: none) */
    int calls;
} rec;

static spx_status note(rec *r, const char *what, spx_err *e) {
    size_t n = strlen(r->log);
    snprintf(r->log + n, sizeof r->log - n, "%s%s", n ? " " : "", what);
    if (++r->calls == r->fail_at) return spx_fail(e, SPX_ERR_IO, "call %d failed", r->calls);
    return SPX_OK;
}

static spx_status r_embed(void *ctx, spx_err *e) { return note(ctx, "E", e); }
static spx_status r_head(void *ctx, spx_err *e) { return note(ctx, "H", e); }
static spx_status r_begin(void *ctx, int64_t l, spx_err *e) {
    char b[16];
    snprintf(b, sizeof b, "[%lld", (long long)l);
    return note(ctx, b, e);
}
static spx_status r_end(void *ctx, int64_t l, spx_err *e) { return note(ctx, "]", e); }
#define BLOCK(fn, tag)                                                     \
    static spx_status fn(void *ctx, int64_t l, int first, spx_err *e) {    \
        char b[16];                                                        \
        snprintf(b, sizeof b, "%s%s", tag, first ? "*" : "");              \
        return note(ctx, b, e);                                            \
    }
BLOCK(r_attn, "A")
BLOCK(r_conv, "C")
BLOCK(r_mamba, "M")
BLOCK(r_swiglu, "S")
BLOCK(r_relu2, "R")

static spx_config cfg4(void) {
    spx_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 4;
    /* attention + SwiGLU, short conv + SwiGLU, Mamba-2 alone, ReLU^2 alone */
    c.mixer[0] = SPX_MIX_ATTN, c.ffn[0] = SPX_FFN_SWIGLU;
    c.mixer[1] = SPX_MIX_CONV, c.ffn[1] = SPX_FFN_SWIGLU;
    c.mixer[2] = SPX_MIX_MAMBA2, c.ffn[2] = SPX_FFN_NONE;
    c.mixer[3] = SPX_MIX_NONE, c.ffn[3] = SPX_FFN_RELU2;
    return c;
}

int main(void) {
    spx_config c = cfg4();
    spx_block_ops ops = {.backend = "test", .embed = r_embed, .layer_begin = r_begin, .layer_end = r_end,
                         .block = {NULL, r_attn, r_conv, r_mamba, r_swiglu, r_relu2}, .head = r_head};
    spx_err e;
    rec r = {{0}, 0, 0};
    CHECK(spx_blocks_check(&c, &ops, "m.trdc", &e) == SPX_OK, "check: %s", e.msg);
    CHECK(spx_blocks_run(&c, &ops, &r, &e) == SPX_OK, "run: %s", e.msg);
    CHECK(!strcmp(r.log, "E [0 A* S ] [1 C* S ] [2 M* ] [3 R* ] H"), "order '%s'", r.log);

    /* optional layer hooks */
    ops.layer_begin = NULL, ops.layer_end = NULL;
    memset(&r, 0, sizeof r);
    CHECK(spx_blocks_run(&c, &ops, &r, &e) == SPX_OK && !strcmp(r.log, "E A* S C* S M* R* H"), "no hooks '%s'", r.log);

    /* an error stops the pass at once and is passed up */
    memset(&r, 0, sizeof r);
    r.fail_at = 4;
    spx_err_clear(&e);
    CHECK(spx_blocks_run(&c, &ops, &r, &e) == SPX_ERR_IO && strstr(e.msg, "call 4") && !strcmp(r.log, "E A* S C*"),
          "stop '%s' %s", r.log, e.msg);

    /* a backend without a kind the model uses: the check names the layer */
    ops.block[SPX_BLK_MAMBA2] = NULL;
    spx_err_clear(&e);
    CHECK(spx_blocks_check(&c, &ops, "m.trdc", &e) == SPX_ERR_UNSUPPORTED &&
              strstr(e.msg, "m.trdc: layer 2 is a mamba2 block, which the test backend does not run"),
          "check: %s", e.msg);
    memset(&r, 0, sizeof r);
    spx_err_clear(&e);
    CHECK(spx_blocks_run(&c, &ops, &r, &e) == SPX_ERR_UNSUPPORTED && strstr(e.msg, "layer 2"), "run: %s", e.msg);
    ops.block[SPX_BLK_MAMBA2] = r_mamba;

    /* a value that is no kind is refused, not skipped */
    c.mixer[1] = 77;
    spx_err_clear(&e); /* spx_fail keeps the first error */
    CHECK(spx_blocks_check(&c, &ops, "m.trdc", &e) == SPX_ERR_UNSUPPORTED && strstr(e.msg, "layer 1") &&
              strstr(e.msg, "unknown"),
          "unknown kind: %s", e.msg);
    c.ffn[3] = 9;
    c.mixer[1] = SPX_MIX_CONV;
    spx_err_clear(&e);
    CHECK(spx_blocks_check(&c, &ops, "m.trdc", &e) == SPX_ERR_UNSUPPORTED && strstr(e.msg, "layer 3"), "unknown ffn: %s",
          e.msg);
    return tl_finish("test_blocks");
}

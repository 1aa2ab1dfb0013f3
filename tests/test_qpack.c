/* test_qpack.c: where every code of a quantized row lives (qtensor.h,
 * docs/trdc.md 2.3; src/quant/qpack.c): hand-written bytes for 2- and
 * 3-bit rows at groups 32, 64 and 128 and for the version 1-2 packing's
 * repack, then round trips on random codes (code_set / code_get, pack /
 * unpack, quantize / dequantize), the zeroed padding of a partial item,
 * and the legacy repack against packing the same codes directly.
 *
 * Buffers are poisoned (0xa5) where the code under test must write every
 * byte, zeroed where only some codes are set. */
#include "testlib.h"

#include "core/half.h"
#include "quant/g32.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A row of `cols` codes, all zero except the listed (column, code) pairs,
 * must be exactly `want` (n bytes, the rest zero). */
typedef struct cv {
    int col, code;
} cv;
typedef struct bv {
    int at, byte;
} bv;

static void golden(const char *what, int bits, int group, int cols, const cv *set, int nset, const bv *want,
                   int nwant) {
    uint8_t row[256], exp[256];
    const int nb = (int)spx_q_codes_row_bytes(cols, bits);
    memset(row, 0, sizeof row);
    memset(exp, 0, sizeof exp);
    for (int i = 0; i < nset; i++) spx_q_code_set(row, set[i].col, bits, group, set[i].code);
    for (int i = 0; i < nwant; i++) exp[want[i].at] = (uint8_t)want[i].byte;
    int bad = -1;
    for (int i = 0; i < 256 && bad < 0; i++)
        if (row[i] != exp[i]) bad = i;
    CHECK(bad < 0, "%s: byte %d is 0x%02x, expected 0x%02x", what, bad, bad >= 0 ? row[bad] : 0,
          bad >= 0 ? exp[bad] : 0);
    /* and back: every column reads its code (0 where none was set) */
    int wrong = 0;
    for (int c = 0; c < cols; c++) {
        int w = 0;
        for (int i = 0; i < nset; i++)
            if (set[i].col == c) w = set[i].code;
        wrong += spx_q_code_get(exp, c, bits, group) != w;
    }
    CHECK(wrong == 0, "%s: %d codes read back wrong from the expected bytes", what, wrong);
    CHECK(nb <= 256, "%s: row bytes %d", what, nb);
}

static void test_golden(void) {
    /* 2-bit G32, 128 columns = one item of 32 bytes; groups = blocks.
     * col 0 (block 0 lo, m 0): V0 p0 bits 0-1; col 16 (block 0 hi): V1 p0
     * bits 2-3; col 32 (block 1 lo): lane 1, p 16; col 69 (block 2 lo m
     * 5): pair 1, V2 p5 bits 4-5; col 127 (block 3 hi m 15): V3 p31 bits
     * 6-7. */
    const cv a[] = {{0, 1}, {16, 2}, {32, 3}, {69, 1}, {127, 3}};
    const bv ab[] = {{0, 0x09}, {5, 0x10}, {16, 0x03}, {31, 0xc0}};
    golden("2-bit G32", 2, 32, 128, a, 5, ab, 4);
    /* 2-bit G64: group 0's block 0 is lo cols 0-15 and hi 32-47, block 1
     * lo 16-31 and hi 48-63. col 16: block 1 lo m 0 (lane 1: p 16, V0);
     * col 32: block 0 hi m 0 (V1 p0, bits 2-3); col 100: group 1 (k 36,
     * hi, block 2 m 4): V3 p4 bits 6-7. */
    const cv b[] = {{16, 2}, {32, 1}, {100, 3}};
    const bv bb[] = {{0, 0x04}, {4, 0xc0}, {16, 0x02}};
    golden("2-bit G64", 2, 64, 128, b, 3, bb, 3);
    /* 2-bit G128: block i lo = cols 16i + m, hi = 64 + 16i + m. col 40:
     * block 2 lo m 8 (V2 p8 bits 4-5); col 64: block 0 hi (V1 p0). */
    const cv c[] = {{40, 3}, {64, 1}};
    const bv cb[] = {{0, 0x04}, {8, 0x30}};
    golden("2-bit G128", 2, 128, 128, c, 2, cb, 2);
    /* 3-bit G32, X[0..31] then Y[32..47]. col 0 = 5: X[0] bits 0-2; col 16
     * = 6: X[0] bits 3-5 (0x35); col 66 = 7 (block 2 lo m 2, V2 p2): X[2]
     * bits 6-7 = 3, Y low nibble of Y[2] bit 0 = 1; col 113 = 5 (block 3
     * hi m 1, V3 p17): high nibble of Y[1] bits 1-3 = 5 -> 0xa0; col 35 =
     * 4 (block 1 lo m 3, V0 p19): X[19] = 4; col 103 = 3 (block 3 lo m 7,
     * V2 p23): X[23] bits 6-7 = 1, high nibble of Y[7] bit 0 -> 0x10. */
    const cv d[] = {{0, 5}, {16, 6}, {66, 7}, {113, 5}, {35, 4}, {103, 3}};
    const bv db[] = {{0, 0x35}, {2, 0xc0}, {19, 0x04}, {23, 0x40}, {33, 0xa0}, {34, 0x01}, {39, 0x10}};
    golden("3-bit G32", 3, 32, 128, d, 6, db, 7);
    /* 3-bit G128: col 127 = 6 (hi m 15 of block 3, V3 p31): high nibble of
     * Y[15] = 6 << 1 -> 0xc0; col 1 = 2 (block 0 lo m 1, V0 p1): X[1] = 2. */
    const cv e2[] = {{127, 6}, {1, 2}};
    const bv eb[] = {{1, 0x02}, {47, 0xc0}};
    golden("3-bit G128", 3, 128, 128, e2, 2, eb, 2);
    /* partial items: 32 columns of 3 bits still take one 48-byte item (col
     * 31 = 7: block 0 hi m 15, V1 p15, X[15] = 0x38); 160 columns of 2
     * bits two items (col 128 = 2: item 1's block 0, byte 32). */
    const cv f[] = {{31, 7}};
    const bv fb[] = {{15, 0x38}};
    golden("3-bit G32, 32 columns", 3, 32, 32, f, 1, fb, 1);
    CHECK(spx_q_codes_row_bytes(32, 3) == 48 && spx_q_codes_row_bytes(160, 2) == 64 &&
              spx_q_codes_row_bytes(512, 3) == 192 && spx_q_codes_row_bytes(512, 2) == 128 &&
              spx_q_codes_row_bytes(512, 4) == 256,
          "row bytes");
    const cv g[] = {{128, 2}};
    const bv gb[] = {{32, 0x02}};
    golden("2-bit G32, 160 columns", 2, 32, 160, g, 1, gb, 1);
    /* 4-bit stays as it was: G32 byte k holds code k low, k + 16 high. */
    const cv h[] = {{0, 3}, {16, 9}, {47, 15}};
    const bv hb[] = {{0, 0x93}, {31, 0x0f}}; /* col 47: group 1 code 15, a low nibble */
    golden("4-bit G32", 4, 32, 64, h, 3, hb, 2);
}

/* The version 1-2 packing, repacked: 3-bit G32 nibbles (byte k = code k
 * low, code k + 16 high) and 2-bit G32 (byte k = codes k, k+8, k+16, k+24
 * at bits 0, 2, 4, 6). */
static void test_legacy_golden(void) {
    uint8_t old3[16] = {0x65, 0x0f}, old2[8] = {0xe4}, row[64];
    /* old3 byte 0: code 0 = 5, code 16 = 6 -> X[0] = 0x35; byte 1: code 1
     * = 15, a nibble a 3-bit code never fills: its top bit is dropped (7) */
    CHECK(spx_q_legacy_codes_row_bytes(32, 3) == 16 && spx_q_legacy_codes_row_bytes(32, 2) == 8, "legacy row bytes");
    memset(row, 0xa5, sizeof row);
    spx_q_repack_legacy_row(old3, 32, 3, 32, row);
    uint8_t want3[48] = {0x35, 0x07};
    CHECK(!memcmp(row, want3, 48), "legacy 3-bit: %02x %02x %02x ...", row[0], row[1], row[2]);
    /* old2 byte 0: codes 0, 8, 16, 24 = 0, 1, 2, 3: code 8 -> V0 p8 (1),
     * 16 -> V1 p0 (2 << 2), 24 -> V1 p8 (3 << 2): byte 0 = 0x08, byte 8 =
     * 0x0d */
    memset(row, 0xa5, sizeof row);
    spx_q_repack_legacy_row(old2, 32, 2, 32, row);
    uint8_t want2[32] = {[0] = 0x08, [8] = 0x0d};
    CHECK(!memcmp(row, want2, 32), "legacy 2-bit: %02x .. %02x", row[0], row[8]);
}

static const int BITS[3] = {2, 3, 4}, GROUPS[3] = {32, 64, 128};

/* Random codes: code_set / code_get, pack / unpack, and the legacy
 * packing's repack, over shapes with whole and partial items. */
static void test_roundtrip(void) {
    uint64_t rs = 99;
    static const int colsv[] = {32, 64, 96, 128, 160, 384, 544};
    for (int bi = 0; bi < 3; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (size_t ci = 0; ci < sizeof colsv / sizeof colsv[0]; ci++) {
                const int bits = BITS[bi], G = GROUPS[gi], cols = colsv[ci], n = (1 << bits) - 1;
                if (cols % G) continue;
                const int64_t rb = spx_q_codes_row_bytes(cols, bits);
                uint8_t q[544], back[544], *a = calloc((size_t)rb, 1), *b = malloc((size_t)rb), *old = NULL;
                for (int c = 0; c < cols; c++) q[c] = (uint8_t)(tl_rand_u64(&rs) % (uint64_t)(n + 1));
                for (int c = 0; c < cols; c++) spx_q_code_set(a, c, bits, G, q[c]);
                int bad = 0;
                for (int c = 0; c < cols; c++) bad += spx_q_code_get(a, c, bits, G) != q[c];
                /* pack_group of the same codes gives the same bytes, and
                 * unpack_group reads them back */
                memset(b, 0, (size_t)rb);
                for (int64_t g = 0; g < cols / G; g++) spx_q_pack_group(b, g, bits, G, q + g * G);
                bad += memcmp(a, b, (size_t)rb) != 0;
                memset(back, 0xff, sizeof back);
                for (int64_t g = 0; g < cols / G; g++) spx_q_unpack_group(a, g, bits, G, back + g * G);
                bad += memcmp(back, q, (size_t)cols) != 0;
                if (bits != 4) { /* the legacy packing of the same codes, repacked */
                    const int cpb = bits == 2 ? 4 : 2, B = G / cpb, w = 8 / cpb;
                    old = calloc((size_t)spx_q_legacy_codes_row_bytes(cols, bits), 1);
                    for (int c = 0; c < cols; c++) {
                        const int k = c % G;
                        old[(c / G) * B + k % B] |= (uint8_t)(q[c] << ((k / B) * w));
                    }
                    memset(b, 0xa5, (size_t)rb);
                    spx_q_repack_legacy_row(old, cols, bits, G, b);
                    bad += memcmp(a, b, (size_t)rb) != 0;
                }
                CHECK(bad == 0, "bits %d G%d cols %d: %d round-trip mismatches", bits, G, cols, bad);
                free(a);
                free(b);
                free(old);
            }
}

/* quantize_row writes the padding of a partial item as zeros (whatever
 * the buffer held) and every code it stores reads back through
 * dequantize_row. Padding bits: those no column's code_set touches. */
static void test_padding(void) {
    uint64_t rs = 5;
    float w[160], out[160];
    for (int bi = 0; bi < 2; bi++)
        for (int gi = 0; gi < 2; gi++) {
            const int bits = BITS[bi], G = GROUPS[gi], cols = 160;
            if (cols % G) continue;
            const int64_t rb = spx_q_codes_row_bytes(cols, bits);
            uint8_t used[128] = {0}, codes[128], zeros[8];
            uint16_t scales[8];
            for (int c = 0; c < cols; c++) spx_q_code_set(used, c, bits, G, (1 << bits) - 1);
            for (int c = 0; c < cols; c++) w[c] = tl_rand_normal(&rs);
            memset(codes, 0xa5, sizeof codes);
            CHECK(spx_q_quantize_row(w, cols, NULL, bits, G, SPX_Q_MSE, codes, scales, zeros) == SPX_OK, "quantize");
            int dirty = 0;
            for (int64_t i = 0; i < rb; i++) dirty += (codes[i] & ~used[i]) != 0;
            CHECK(dirty == 0, "bits %d G%d: %d padding bytes not zero", bits, G, dirty);
            int64_t unused = 0;
            for (int64_t i = 0; i < rb; i++) unused += used[i] != 0xff;
            CHECK(unused > 0, "bits %d G%d: 160 columns leave padding in the last item", bits, G);
            spx_q_dequantize_row(codes, scales, zeros, cols, bits, G, out);
            int bad = 0;
            for (int c = 0; c < cols; c++)
                bad += out[c] != (float)(spx_q_code_get(codes, c, bits, G) - spx_q_zero_get(zeros, c / G)) *
                                     spx_f16_to_f32(scales[c / G]);
            CHECK(bad == 0, "bits %d G%d: %d dequantized values differ from the codes", bits, G, bad);
        }
    /* bits 2 and 3 need groups of whole blocks */
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_q_check_params(3, 16, 64, &e) == SPX_ERR_ARG && strstr(e.msg, "multiple of 32"), "3-bit G16: %s",
          e.msg);
    spx_err_clear(&e);
    CHECK(spx_q_check_params(4, 16, 64, &e) == SPX_OK, "4-bit G16 stays allowed: %s", e.msg);
}

int main(void) {
    test_golden();
    test_legacy_golden();
    test_roundtrip();
    test_padding();
    return tl_finish("test_qpack");
}

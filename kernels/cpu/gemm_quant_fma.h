/* qgemm for CPUs without AVX512-BF16 (included by gemm_quant.c): float32 FMAs written once
 * against simd.h, so the same source is the AVX2 + FMA (8 lanes), AVX-512F (16 lanes) and
 * aarch64 NEON (4 lanes) variant. The packed layout is gemm_quant.c's (qgemm_pack).
 *
 * - Columns are lanes: in a U4 chunk (64 bytes, 16 columns x 8 k) the 32-bit word c holds
 *   column c's k-pairs 4t .. 4t+3 (k = 8t + 2s + h at bits 16h + 4s), in I8 the 16-bit word c
 *   of a k-pair's 32 bytes holds column c's two k's: a W-lane load is W consecutive columns.
 * - The integers are turned into exact floats without shifting them into place: U4 nibble s
 *   is `word & (15 << 4s)` (the upper half once shifted down by 16) = q 2^4s, I8's low byte
 *   `word << 24` = q 2^24 and high byte `word & ~255` = q 2^8, then int -> float. x is
 *   prepared once per call as float32 times the matching power of two (2^-4s, 2^-24, 2^-8),
 *   so each product x' q' is exactly x q (both are exact: 8 + 8 significant bits).
 * - Per output: per group, the group's 32 products in k order into a fresh partial sum (FMA),
 *   then acc = part * d + acc, then acc = m * sum(x over the group) + acc (formats with a
 *   min; Q6_K's I8H scales each half of the group on its own); groups in order. The register
 *   path (up to 4 rows U4, 8 rows I8: the integers unpacked in registers, passes over the
 *   panel's columns) and the buffered path (a group unpacked once into an L1 buffer as the same
 *   floats, register tiles of rows x columns) do exactly these operations on exactly these
 *   operands, so a row is bitwise the same alone or in any batch.
 * - AVX2 only, asked for per call (QACT_I8 / QACT_I8X2 in fmt): Q4_0/Q4_1 with the activations
 *   quantized to int8 and integer dot products on the same packed bytes (qgemm_act_i8 below).
 */
#include "simd.h"

#define QV (QPANEL / SIMD_W) /* vectors per panel row */
/* Batches up to this many rows take the register path (U4 up to QREG_ROWS_U4: from 5 rows its
 * unpacking is cheaper once into the buffer; I8's costs more, and register tiles win up to 8
 * rows: the Q8_0 head at 5-8 rows 1.1-1.5x, bench of this commit) */
#define QREG_ROWS 8
#define QREG_ROWS_U4 4
/* QB_TC x QB_TR: the buffered path's register tile (vectors of columns x rows); QR_NV(mr): the
 * register path's vectors of columns per pass over the panel for mr rows (divides QV) */
#if SIMD_W == 16
#define QB_TC 3
#define QB_TR 8
#define QR_NV(mr) 3
#elif SIMD_W == 8
#define QB_TC 3
#define QB_TR 4
#define QR_NV(mr) ((mr) == 1 ? 6 : (mr) == 2 ? 3 : (mr) <= 4 ? 2 : 1)
#else
#define QB_TC 4
#define QB_TR 4
#define QR_NV(mr) ((mr) == 1 ? 12 : (mr) == 2 ? 6 : (mr) <= 4 ? 4 : 3)
#endif
#define QB_FLOATS (QGROUP * QPANEL + 2 * QPANEL) /* unpacked group: q[32][48], d[48], m[48] */

int qgemm_available(void) { return 1; }

/* The power of two x[k] is prepared with (see the header comment). */
static inline float x_scale(int fmt, int kk) {
    if (IS_U4(fmt)) return 1.0f / (float)(1 << (4 * ((kk >> 1) & 3)));
    return (kk & 1) ? 1.0f / 256.0f : 1.0f / 16777216.0f;
}

/* Per row: x as float32 times x_scale (xp: [m, k]) and the sum of x over each group (xs:
 * [m, groups], one fixed order whatever M is). */
static void prepare_x(const uint16_t* x, int64_t m, int64_t ldx, int64_t k, int fmt, float* xp,
                      float* xs) {
    int64_t groups = k / QGROUP;
    float sc[QGROUP];
    for (int kk = 0; kk < QGROUP; ++kk) sc[kk] = x_scale(fmt, kk);
#pragma omp parallel for schedule(static) if (m > 4) num_threads(team_threads())
    for (int64_t r = 0; r < m; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            const uint16_t* p = x + r * ldx + g * QGROUP;
            float* o = xp + r * k + g * QGROUP;
            vf s = vf_zero();
            for (int i = 0; i < QGROUP; i += SIMD_W) {
                vf v = vf_load_bf16(p + i);
                s = vf_add(s, v);
                vf_store(o + i, vf_mul(v, vf_load(sc + i)));
            }
            xs[r * groups + g] = vf_hsum(s);
        }
}

/* A group's scale and min (I8H: the second half's scale, no min) for columns c .. c+W-1. */
static inline __attribute__((always_inline)) void group_scales(const uint8_t* src, int fmt,
                                                               int c, vf* dv, vf* mv) {
    const uint16_t* h = (const uint16_t*)src;
    const float* f = (const float*)src;
    *mv = vf_zero();
    if (fmt == QFMT_U4) {
        *dv = vf_load_f16(h + c);
        *mv = vf_load_f16(h + QPANEL + c);
    } else if (fmt == QFMT_I8) {
        *dv = vf_load_f16(h + c);
    } else if (fmt == QFMT_I8H) {
        *dv = vf_load(f + QPANEL + c);
    } else { /* U4F, I8M */
        *dv = vf_load(f + c);
        *mv = vf_load(f + QPANEL + c);
    }
}

/* Register path: `mr` (1 .. QREG_ROWS) rows x `nv` vectors of columns from c0, over all groups, the
 * integers unpacked in registers. xp, xs: row 0's prepared x and group sums; acc: rows of 48
 * floats, zeroed by the caller. */
static inline __attribute__((always_inline)) void qreg_tile(
    const int mr, const int nv, const int fmt, const float* xp, int64_t k, const float* xs,
    int64_t groups, const uint8_t* panel, int c0, float* acc) {
    const int64_t gb = group_bytes(fmt), sb = scale_bytes_of(fmt);
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* src = panel + g * gb;
        const uint8_t* qd = src + sb;
        const float* xg = xp + g * QGROUP;
        /* decode streams the weights: fetch QPF_ROW groups ahead (past the panel's end is this
         * thread's next panel): the default model's 30 Q4_1 layers at M = 1 with every weight
         * cold, 8.3 ms against 10.4 without (AVX2, one thread); 1-4 groups ahead within noise */
        for (int64_t b = 0; b < gb; b += 64) __builtin_prefetch(src + QPF_ROW * gb + b, 0, 3);
        vf part[QREG_ROWS][QV];
#pragma GCC unroll 32
        for (int m = 0; m < mr; ++m)
            for (int v = 0; v < nv; ++v) part[m][v] = vf_zero();
        if (IS_U4(fmt)) {
            for (int t = 0; t < 4; ++t)
#pragma GCC unroll 16
                for (int v = 0; v < nv; ++v) {
                    const int c = c0 + v * SIMD_W;
                    const vi lo = vi_load(qd + (t * 3 + c / 16) * 64 + (c % 16) * 4);
                    const vi hi = vi_srli(lo, 16);
#pragma GCC unroll 4
                    for (int s = 0; s < 4; ++s) {
                        const vi mask = vi_set1(15 << (4 * s));
                        const vf q0 = vi_to_f(vi_and(lo, mask)), q1 = vi_to_f(vi_and(hi, mask));
#pragma GCC unroll 8
                        for (int m = 0; m < mr; ++m) {
                            const float* xk = xg + m * k + 8 * t + 2 * s;
                            part[m][v] = vf_fma(vf_bcast(xk), q0, part[m][v]);
                            part[m][v] = vf_fma(vf_bcast(xk + 1), q1, part[m][v]);
                        }
                    }
                }
        } else {
            const vi himask = vi_set1(~255);
            for (int kp = 0; kp < 16; ++kp) {
#pragma GCC unroll 16
                for (int v = 0; v < nv; ++v) {
                    const int c = c0 + v * SIMD_W;
                    const vi w = vi_load_i16(qd + (kp * 3 + c / 16) * 32 + (c % 16) * 2);
                    const vf q0 = vi_to_f(vi_slli(w, 24)), q1 = vi_to_f(vi_and(w, himask));
#pragma GCC unroll 8
                    for (int m = 0; m < mr; ++m) {
                        const float* xk = xg + m * k + 2 * kp;
                        part[m][v] = vf_fma(vf_bcast(xk), q0, part[m][v]);
                        part[m][v] = vf_fma(vf_bcast(xk + 1), q1, part[m][v]);
                    }
                }
                if (fmt == QFMT_I8H && kp == 7) /* first half of the group: its own scale */
#pragma GCC unroll 16
                    for (int v = 0; v < nv; ++v) {
                        const vf d1 = vf_load((const float*)src + c0 + v * SIMD_W);
                        for (int m = 0; m < mr; ++m) {
                            float* a = acc + m * QPANEL + c0 + v * SIMD_W;
                            vf_store(a, vf_fma(part[m][v], d1, vf_load(a)));
                            part[m][v] = vf_zero();
                        }
                    }
            }
        }
#pragma GCC unroll 16
        for (int v = 0; v < nv; ++v) {
            vf dv, mv;
            group_scales(src, fmt, c0 + v * SIMD_W, &dv, &mv);
#pragma GCC unroll 8
            for (int m = 0; m < mr; ++m) {
                float* a = acc + m * QPANEL + c0 + v * SIMD_W;
                vf r = vf_fma(part[m][v], dv, vf_load(a));
                if (HAS_MIN(fmt)) r = vf_fma(mv, vf_bcast(xs + m * groups + g), r);
                vf_store(a, r);
            }
        }
    }
}

/* Unpack one packed group (48 columns) into buf: q[32][48] as the register path's floats, then
 * d[48] and m[48] (I8H: the halves' scales; I8: m = 0). */
static void qunpack_group(const uint8_t* src, int fmt, float* buf) {
    const uint8_t* qd = src + scale_bytes_of(fmt);
    float* d = buf + QGROUP * QPANEL;
    for (int c = 0; c < QPANEL; c += SIMD_W) {
        vf dv, mv;
        group_scales(src, fmt, c, &dv, &mv);
        if (fmt == QFMT_I8H) {
            mv = dv;
            dv = vf_load((const float*)src + c);
        }
        vf_store(d + c, dv);
        vf_store(d + QPANEL + c, mv);
    }
    if (IS_U4(fmt)) {
        for (int t = 0; t < 4; ++t)
            for (int c = 0; c < QPANEL; c += SIMD_W) {
                const vi lo = vi_load(qd + (t * 3 + c / 16) * 64 + (c % 16) * 4);
                const vi hi = vi_srli(lo, 16);
#pragma GCC unroll 4
                for (int s = 0; s < 4; ++s) {
                    const vi mask = vi_set1(15 << (4 * s));
                    vf_store(buf + (8 * t + 2 * s) * QPANEL + c, vi_to_f(vi_and(lo, mask)));
                    vf_store(buf + (8 * t + 2 * s + 1) * QPANEL + c, vi_to_f(vi_and(hi, mask)));
                }
            }
    } else {
        const vi himask = vi_set1(~255);
        for (int kp = 0; kp < 16; ++kp)
            for (int c = 0; c < QPANEL; c += SIMD_W) {
                const vi w = vi_load_i16(qd + (kp * 3 + c / 16) * 32 + (c % 16) * 2);
                vf_store(buf + 2 * kp * QPANEL + c, vi_to_f(vi_slli(w, 24)));
                vf_store(buf + (2 * kp + 1) * QPANEL + c, vi_to_f(vi_and(w, himask)));
            }
    }
}

/* Buffered path: `mr` rows x QB_TC vectors of columns from cb of one unpacked group. xg, xs:
 * row 0's prepared x at the group and its group sum; acc: rows of 48 floats. The same
 * operations in the same order as qreg_tile. `cls`: QFMT_U4 for every format with a min,
 * QFMT_I8H, or QFMT_I8. */
static inline __attribute__((always_inline)) void qbuf_tile(
    const int mr, const int cls, const float* xg, int64_t k, const float* xs, int64_t groups,
    const float* buf, int cb, float* acc) {
    const float* d = buf + QGROUP * QPANEL;
    vf part[QB_TR][QB_TC];
#pragma GCC unroll 32
    for (int m = 0; m < mr; ++m)
        for (int j = 0; j < QB_TC; ++j) part[m][j] = vf_zero();
    for (int half = 0; half < 2; ++half) {
#pragma GCC unroll 4
        for (int kk = 16 * half; kk < 16 * half + 16; ++kk) {
            vf w[QB_TC];
#pragma GCC unroll 4
            for (int j = 0; j < QB_TC; ++j) w[j] = vf_load(buf + kk * QPANEL + cb + j * SIMD_W);
#pragma GCC unroll 8
            for (int m = 0; m < mr; ++m) {
                const vf a = vf_bcast(xg + m * k + kk);
#pragma GCC unroll 4
                for (int j = 0; j < QB_TC; ++j) part[m][j] = vf_fma(a, w[j], part[m][j]);
            }
        }
        if (cls == QFMT_I8H && half == 0)
#pragma GCC unroll 4
            for (int j = 0; j < QB_TC; ++j) {
                const vf d1 = vf_load(d + cb + j * SIMD_W);
#pragma GCC unroll 8
                for (int m = 0; m < mr; ++m) {
                    float* a = acc + m * QPANEL + cb + j * SIMD_W;
                    vf_store(a, vf_fma(part[m][j], d1, vf_load(a)));
                    part[m][j] = vf_zero();
                }
            }
    }
#pragma GCC unroll 4
    for (int j = 0; j < QB_TC; ++j) {
        const vf dv = vf_load(d + (cls == QFMT_I8H ? QPANEL : 0) + cb + j * SIMD_W);
        const vf mv = vf_load(d + QPANEL + cb + j * SIMD_W);
#pragma GCC unroll 8
        for (int m = 0; m < mr; ++m) {
            float* a = acc + m * QPANEL + cb + j * SIMD_W;
            vf r = vf_fma(part[m][j], dv, vf_load(a));
            if (cls == QFMT_U4) r = vf_fma(mv, vf_bcast(xs + m * groups), r);
            vf_store(a, r);
        }
    }
}

/* Bias, rounding and the store of accumulated rows (acc: rows of 48 floats). */
static void qstore_rows(const float* acc, int64_t rows, const float* bias, void* y, int64_t ldy,
                        int ncols, int out_f32) {
    for (int64_t m = 0; m < rows; ++m) {
        const float* a = acc + m * QPANEL;
        float* yf = (float*)y + m * ldy;
        uint16_t* yh = (uint16_t*)y + m * ldy;
        int c = 0;
        for (; c + SIMD_W <= ncols; c += SIMD_W) {
            vf v = vf_load(a + c);
            if (bias) v = vf_add(v, vf_load(bias + c));
            if (out_f32)
                vf_store(yf + c, v);
            else
                vf_store_bf16(yh + c, v);
        }
        for (; c < ncols; ++c) {
            float v = a[c];
            if (bias) v += bias[c];
            if (out_f32)
                yf[c] = v;
            else
                yh[c] = f2bf(v);
        }
    }
}

#if QB_TR == 8
#define QBUF_CASES(CLS)                                                    \
    switch (rows) {                                                        \
        case 8: qbuf_tile(8, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        case 7: qbuf_tile(7, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        case 6: qbuf_tile(6, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        case 5: qbuf_tile(5, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        case 4: qbuf_tile(4, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        case 3: qbuf_tile(3, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        case 2: qbuf_tile(2, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        default: qbuf_tile(1, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
    }
#else
#define QBUF_CASES(CLS)                                                    \
    switch (rows) {                                                        \
        case 4: qbuf_tile(4, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        case 3: qbuf_tile(3, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        case 2: qbuf_tile(2, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
        default: qbuf_tile(1, CLS, xg, k, xsr, groups, buf, cb, ar); break; \
    }
#endif

#define QREG_PASSES(MR, FMT)                                                        \
    for (int c0 = 0; c0 < QPANEL; c0 += QR_NV(MR) * SIMD_W)                         \
        qreg_tile(MR, QR_NV(MR), FMT, xp, k, xs, groups, panel, c0, acc);
#if QREG_ROWS >= 8
#define QREG_CASES(FMT)                                  \
    switch (rows) {                                      \
        case 8: QREG_PASSES(8, FMT) break;               \
        case 7: QREG_PASSES(7, FMT) break;               \
        case 6: QREG_PASSES(6, FMT) break;               \
        case 5: QREG_PASSES(5, FMT) break;               \
        case 4: QREG_PASSES(4, FMT) break;               \
        case 3: QREG_PASSES(3, FMT) break;               \
        case 2: QREG_PASSES(2, FMT) break;               \
        default: QREG_PASSES(1, FMT) break;              \
    }
#elif QREG_ROWS >= 4
#define QREG_CASES(FMT)                                  \
    switch (rows) {                                      \
        case 4: QREG_PASSES(4, FMT) break;               \
        case 3: QREG_PASSES(3, FMT) break;               \
        case 2: QREG_PASSES(2, FMT) break;               \
        default: QREG_PASSES(1, FMT) break;              \
    }
#else
#define QREG_CASES(FMT)                                  \
    switch (rows) {                                      \
        case 2: QREG_PASSES(2, FMT) break;               \
        default: QREG_PASSES(1, FMT) break;              \
    }
#endif

/* This thread's unpacking buffer and accumulators, kept between calls. */
static _Thread_local float* tl_fbuf = NULL;
static _Thread_local int64_t tl_fcap = 0;

static float* thread_fbuffer(int64_t floats) {
    if (floats > tl_fcap) {
        free(tl_fbuf);
        tl_fbuf = (float*)aligned_alloc(64, (size_t)((floats * 4 + 63) / 64 * 64));
        tl_fcap = tl_fbuf ? floats : 0;
    }
    return tl_fbuf;
}

#if SIMD_W == 8 && defined(__AVX2__)
/* int8 activations (AVX2, U4 weights; asked for by QACT_I8 in fmt): x is quantized per row per
 * group (d1 = max|x| / 127, q1 = x / d1 rounded to nearest even, float32 ops), then each group's
 * integer dot is exact (vpmaddubsw u4 x s8 pairs, 8 of them summed in int16: |sum| <= 8 * 2 *
 * 15 * 127 < 2^15; vpmaddwd to int32) and acc = float(dot) * (d_w d) + acc, then
 * acc = m_w (d sum q) + acc, groups in order: the same operations for a row in any batch and
 * any tile. With QACT_I8X2 the residual is quantized too (r = x - q1 d1 in one rounding,
 * d = d1 / 254, q2 = r / d rounded, in -127..127): x ~ d (254 q1 + q2), dot = 254 dot1 + dot2
 * (exact below 2^24), ~16 bits per group for twice the integer work; one int8 per group loses
 * too much on the RMSNorm outputs' outlier channels (7/12 greedy prompts agree, bench_quant).
 * The U4 chunk's 32-bit word c holds column c's k = 8t + {0,4,1,5} in its low nibbles and
 * 8t + {2,6,3,7} in its high ones, so q is stored in that order (dwords 2t, 2t + 1). */
#define QACT_FORMATS (1 << QFMT_U4)
#define QA_MR(two) ((two) ? 2 : 4) /* rows per register tile */
/* vectors of columns per pass */
#define QA_NV(two, mr) ((two) ? ((mr) == 1 ? 3 : 2) : ((mr) == 1 ? 6 : (mr) == 2 ? 3 : 2))

static const uint8_t qa_order[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* xq: [m, groups, 32 (two: 64)] int8 in chunk order (two: q1 then q2); xd: [m, groups, 2]
 * (d, d * sum q) with q = q1 (two: 254 q1 + q2). */
static void qa_prepare(const uint16_t* x, int64_t m, int64_t ldx, int64_t k, int two, int8_t* xq,
                       float* xd) {
    const int64_t groups = k / QGROUP, gq = two ? 2 * QGROUP : QGROUP;
#pragma omp parallel for schedule(static) if (m > 4) num_threads(team_threads())
    for (int64_t r = 0; r < m; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            const uint16_t* p = x + r * ldx + g * QGROUP;
            vf v[4], a = vf_zero();
            const vf sign = vf_set1(-0.0f);
            for (int i = 0; i < 4; ++i) {
                v[i] = vf_load_bf16(p + 8 * i);
                a = vf_max(a, _mm256_andnot_ps(sign, v[i]));
            }
            const float d1 = vf_hmax(a) / 127.0f, d2 = d1 / 254.0f;
            int32_t q[2][QGROUP] __attribute__((aligned(32))) = {{0}};
            if (d1 > 0.0f)
                for (int i = 0; i < 4; ++i) {
                    const vf q1 = vf_round(vf_div(v[i], vf_set1(d1)));
                    _mm256_store_si256((__m256i*)(q[0] + 8 * i), vf_to_i(q1));
                    if (two && d2 > 0.0f) {
                        const vf res = _mm256_fnmadd_ps(q1, vf_set1(d1), v[i]);
                        const vf q2 = vf_round(vf_div(res, vf_set1(d2)));
                        const vf lim = vf_set1(127.0f);
                        _mm256_store_si256((__m256i*)(q[1] + 8 * i),
                                           vf_to_i(vf_min(vf_max(q2, vf_sub(vf_zero(), lim)), lim)));
                    }
                }
            int8_t* o = xq + (r * groups + g) * gq;
            int32_t sum = 0;
            for (int j = 0; j < QGROUP; ++j) {
                o[j] = (int8_t)q[0][(j / 8) * 8 + qa_order[j % 8]];
                if (two) o[QGROUP + j] = (int8_t)q[1][(j / 8) * 8 + qa_order[j % 8]];
                sum += two ? 254 * q[0][j] + q[1][j] : q[0][j];
            }
            const float d = two ? d2 : d1;
            xd[(r * groups + g) * 2] = d;
            xd[(r * groups + g) * 2 + 1] = d * (float)sum;
        }
}

/* 8 u4 x s8 pairs of one chunk row into an int16 partial sum (x: the 8 bytes of t). */
static inline __attribute__((always_inline)) __m256i qa_dot8(__m256i part, __m256i lo,
                                                             __m256i hi, const int8_t* x) {
    int32_t a, b;
    memcpy(&a, x, 4);
    memcpy(&b, x + 4, 4);
    return _mm256_add_epi16(part, _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)),
                                                   _mm256_maddubs_epi16(hi, _mm256_set1_epi32(b))));
}

/* `mr` rows x `nv` vectors of columns from c0 over every group of a U4 panel. xq, xd: row 0's;
 * acc: rows of 48 floats, zeroed by the caller. */
static inline __attribute__((always_inline)) void qa_tile_u4(const int two, const int mr,
                                                             const int nv, const int8_t* xq,
                                                             const float* xd, int64_t groups,
                                                             const uint8_t* panel, int c0,
                                                             float* acc) {
    const int64_t gb = group_bytes(QFMT_U4), sb = scale_bytes_of(QFMT_U4);
    const int64_t gq = two ? 2 * QGROUP : QGROUP;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i w254 = _mm256_set1_epi16(254);
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* src = panel + g * gb;
        const uint8_t* qd = src + sb;
        for (int64_t b = 0; b < gb; b += 64) __builtin_prefetch(src + QPF_ROW * gb + b, 0, 3);
        __m256i p1[4][QV], p2[4][QV];
#pragma GCC unroll 32
        for (int m = 0; m < mr; ++m)
            for (int v = 0; v < nv; ++v) p1[m][v] = p2[m][v] = _mm256_setzero_si256();
        /* not unrolled: GCC would reassociate the int16 sums of every t and spill them */
#pragma GCC unroll 1
        for (int t = 0; t < 4; ++t)
#pragma GCC unroll 8
            for (int v = 0; v < nv; ++v) {
                const int c = c0 + v * SIMD_W;
                const __m256i w = vi_load(qd + (t * 3 + c / 16) * 64 + (c % 16) * 4);
                const __m256i lo = _mm256_and_si256(w, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
#pragma GCC unroll 8
                for (int m = 0; m < mr; ++m) {
                    const int8_t* xg = xq + (m * groups + g) * gq + 8 * t;
                    p1[m][v] = qa_dot8(p1[m][v], lo, hi, xg);
                    if (two) p2[m][v] = qa_dot8(p2[m][v], lo, hi, xg + QGROUP);
                }
            }
#pragma GCC unroll 8
        for (int v = 0; v < nv; ++v) {
            const int c = c0 + v * SIMD_W;
            const vf dw = vf_load_f16((const uint16_t*)src + c);
            const vf mw = vf_load_f16((const uint16_t*)src + QPANEL + c);
#pragma GCC unroll 8
            for (int m = 0; m < mr; ++m) {
                const float* xdg = xd + (m * groups + g) * 2;
                float* a = acc + m * QPANEL + c;
                const __m256i i32 =
                    two ? _mm256_add_epi32(_mm256_madd_epi16(p1[m][v], w254),
                                           _mm256_madd_epi16(p2[m][v], ones))
                        : _mm256_madd_epi16(p1[m][v], ones);
                vf r = vf_fma(vi_to_f(i32), vf_mul(dw, vf_bcast(xdg)), vf_load(a));
                vf_store(a, vf_fma(mw, vf_bcast(xdg + 1), r));
            }
        }
    }
}

#define QA_PASSES(TWO, MR)                                            \
    for (int c0 = 0; c0 < QPANEL; c0 += QA_NV(TWO, MR) * SIMD_W)    \
        qa_tile_u4(TWO, MR, QA_NV(TWO, MR), xqr, xdr, groups, panel, c0, acc);

/* qgemm with int8 activations (fmt: QFMT_U4; two: the residual too). */
static int qgemm_act_i8(const uint16_t* x, int64_t m, int64_t ldx, const uint8_t* packed,
                        int64_t n, int64_t k, int two, const float* bias, void* y, int64_t ldy,
                        int out_f32) {
    const int64_t groups = k / QGROUP, panels = (n + QPANEL - 1) / QPANEL;
    const int64_t gbytes = group_bytes(QFMT_U4), gq = two ? 2 * QGROUP : QGROUP;
    const int64_t blocks = (m + QBLOCK_M - 1) / QBLOCK_M, items = blocks * panels;
    int8_t* xq = (int8_t*)malloc((size_t)(m * groups * (gq + 2 * sizeof(float))));
    if (!xq) return -3;
    float* xd = (float*)(xq + m * groups * gq);
    qa_prepare(x, m, ldx, k, two, xq, xd);
    const int step = QA_MR(two);
    TeamClock clock;
    team_clock_start(&clock);
#pragma omp parallel num_threads(team_threads())
    {
#pragma omp for schedule(static) nowait
        for (int64_t it = 0; it < items; ++it) {
            int64_t blk = it / panels, p = it % panels;
            const uint8_t* panel = packed + p * groups * gbytes;
            int ncols = n - p * QPANEL < QPANEL ? (int)(n - p * QPANEL) : QPANEL;
            const float* pb = bias ? bias + p * QPANEL : NULL;
            int64_t end = (blk + 1) * QBLOCK_M < m ? (blk + 1) * QBLOCK_M : m;
            for (int64_t r = blk * QBLOCK_M; r < end; r += step) {
                float acc[4 * QPANEL];
                memset(acc, 0, sizeof(acc));
                const int8_t* xqr = xq + r * groups * gq;
                const float* xdr = xd + r * groups * 2;
                const int rows = end - r < step ? (int)(end - r) : step;
                if (two) {
                    if (rows == 2) {
                        QA_PASSES(1, 2)
                    } else {
                        QA_PASSES(1, 1)
                    }
                } else {
                    switch (rows) {
                        case 4: QA_PASSES(0, 4) break;
                        case 3: QA_PASSES(0, 3) break;
                        case 2: QA_PASSES(0, 2) break;
                        default: QA_PASSES(0, 1) break;
                    }
                }
                int64_t yoff = r * ldy + p * QPANEL;
                void* yr = out_f32 ? (void*)((float*)y + yoff) : (void*)((uint16_t*)y + yoff);
                qstore_rows(acc, rows, pb, yr, ldy, ncols, out_f32);
            }
        }
        team_clock_done(&clock);
    }
    team_clock_report(&clock);
    free(xq);
    return 0;
}
#else
#define QACT_FORMATS 0
#endif

int qgemm_act_int8_formats(void) { return QACT_FORMATS; }

/* x: [m, k] bf16 (row stride ldx); packed: from qgemm_pack; bias: float32 [n] or NULL;
 * y: [m, n] (row stride ldy) bf16 or (out_f32) float32. 0 = ok, -2 bad k/fmt, -3 out of
 * memory. */
int qgemm(const uint16_t* x, int64_t m, int64_t ldx, const uint8_t* packed, int64_t n, int64_t k,
          int fmt, const float* bias, void* y, int64_t ldy, int out_f32) {
    const int act_i8 = (fmt & (QACT_I8 | QACT_I8X2)) != 0, two = (fmt & QACT_I8X2) != 0;
    fmt &= ~(QACT_I8 | QACT_I8X2);
    if (qgemm_packed_bytes(n, k, fmt) < 0) return -2;
    if (m <= 0 || n <= 0) return 0;
#if QACT_FORMATS
    if (act_i8 && ((QACT_FORMATS >> fmt) & 1))
        return qgemm_act_i8(x, m, ldx, packed, n, k, two, bias, y, ldy, out_f32);
#else
    (void)act_i8;
    (void)two;
#endif
    int64_t groups = k / QGROUP, panels = (n + QPANEL - 1) / QPANEL, gbytes = group_bytes(fmt);
    int64_t blocks = (m + QBLOCK_M - 1) / QBLOCK_M, items = blocks * panels;
    float* xprep = (float*)malloc((size_t)(m * k + m * groups) * sizeof(float));
    if (!xprep) return -3;
    float* xsum = xprep + m * k;
    prepare_x(x, m, ldx, k, fmt, xprep, xsum);
    const int buffered = m > (IS_U4(fmt) ? QREG_ROWS_U4 : QREG_ROWS);
    int failed = 0;
    TeamClock clock;
    team_clock_start(&clock);
#pragma omp parallel num_threads(team_threads())
    {
        float* buf = buffered ? thread_fbuffer(QB_FLOATS + QBLOCK_M * QPANEL) : NULL;
        if (buffered && !buf) failed = 1;
#pragma omp for schedule(static) nowait
        for (int64_t it = 0; it < items; ++it) {
            if (buffered && !buf) continue;
            int64_t blk = it / panels, p = it % panels;
            const uint8_t* panel = packed + p * groups * gbytes;
            int ncols = n - p * QPANEL < QPANEL ? (int)(n - p * QPANEL) : QPANEL;
            const float* pb = bias ? bias + p * QPANEL : NULL;
            int64_t r0 = blk * QBLOCK_M, end = r0 + QBLOCK_M < m ? r0 + QBLOCK_M : m;
            int64_t yoff = r0 * ldy + p * QPANEL;
            void* yr = out_f32 ? (void*)((float*)y + yoff) : (void*)((uint16_t*)y + yoff);
            if (!buffered) { /* a few rows: registers */
                float acc[QREG_ROWS * QPANEL];
                memset(acc, 0, sizeof(acc));
                const float* xp = xprep;
                const float* xs = xsum;
                int rows = (int)m;
                if (fmt == QFMT_U4) {
                    QREG_CASES(QFMT_U4)
                } else if (fmt == QFMT_U4F) {
                    QREG_CASES(QFMT_U4F)
                } else if (fmt == QFMT_I8H) {
                    QREG_CASES(QFMT_I8H)
                } else if (fmt == QFMT_I8M) {
                    QREG_CASES(QFMT_I8M)
                } else {
                    QREG_CASES(QFMT_I8)
                }
                qstore_rows(acc, m, pb, yr, ldy, ncols, out_f32);
                continue;
            }
            float* acc = buf + QB_FLOATS;
            memset(acc, 0, (size_t)((end - r0) * QPANEL) * sizeof(float));
            for (int64_t g = 0; g < groups; ++g) {
                qunpack_group(panel + g * gbytes, fmt, buf);
                for (int cb = 0; cb < QPANEL; cb += QB_TC * SIMD_W)
                    for (int64_t r = r0; r < end; r += QB_TR) {
                        const float* xg = xprep + r * k + g * QGROUP;
                        const float* xsr = xsum + r * groups + g;
                        float* ar = acc + (r - r0) * QPANEL;
                        int rows = end - r < QB_TR ? (int)(end - r) : QB_TR;
                        if (HAS_MIN(fmt)) {
                            QBUF_CASES(QFMT_U4)
                        } else if (fmt == QFMT_I8H) {
                            QBUF_CASES(QFMT_I8H)
                        } else {
                            QBUF_CASES(QFMT_I8)
                        }
                    }
            }
            qstore_rows(acc, end - r0, pb, yr, ldy, ncols, out_f32);
        }
        team_clock_done(&clock);
    }
    team_clock_report(&clock);
    free(xprep);
    return failed ? -3 : 0;
}

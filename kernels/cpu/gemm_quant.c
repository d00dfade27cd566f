/* Linear layers on weights kept quantized (GGUF Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K, int8
 * weight-only). The qgemm below is the AVX512-BF16 variant; AVX2 + FMA, AVX-512F without BF16
 * and aarch64 NEON builds get gemm_quant_fma.h's float32 FMA variant (the same packed layout,
 * packing and row lookup); any other build reports "unavailable" and the model is
 * dequantized.
 *
 * y[M, N] = x[M, K] W[N, K]^T (+ bias), x bf16, y bf16 or float32. W is stored per group of 32
 * along k as small integers q with a scale d (and a min m): w = d * q + m, exactly as GGUF
 * stores Q4_1 (Q4_0 is m = -8 d, Q8_0 and int8 have m = 0). Two formats:
 *   QFMT_U4 (0): q in 0..15, d and m float16;  QFMT_I8 (1): q in -128..127, d float16;
 *   QFMT_U4F (2): U4 with float32 d and m (Q4_K: d = d_super * sc, m = -dmin * min per 32);
 *   QFMT_I8H (3): int8 with a float32 scale per 16 (Q6_K: d * sc, q - 32): each half-group's
 *   partial sum is scaled on its own;  QFMT_I8M (4): bytes (Q5_K's 5-bit q) with float32 d and m
 *   per 32.
 * - The integers become exact bf16 operands (U4: 1 + q/16 by two integer ops, I8: converted),
 *   so VDPBF16PS multiplies x by them exactly; each group's partial sum is scaled once:
 *   acc += d * sum_k(x q) + m * sum_k(x)  (U4 as 16 d * sum x (1 + q/16) + (m - 16 d) sum x),
 *   in float32. The weights are never rounded to bf16: this is the float32 dequantize-then-
 *   matmul to float32 rounding.
 * - Packed layout: panels of 48 output columns (as gemm_bf16.c), each a run of 32-k groups;
 *   a group holds d[48] (and m[48]) as float16, then the integers laid out as VDPBF16PS
 *   operands (16 columns x one k-pair per vector): U4 packs 4 operands (k-pairs 4t .. 4t+3) in
 *   the 4 nibbles of each 16-bit word of a 64-byte chunk; I8 stores one byte per weight.
 * - Every output is one float32 accumulator walking the groups in order, each group's partial
 *   sum walking its k-pairs in order, whatever M is: rows come out bitwise the same alone or in
 *   any batch. 1-2 rows unpack the integers in registers (decode); U4 batches of up to 16 rows
 *   too, in 8-row tiles (each operand unpacked once per 8 rows); more rows (and I8) unpack one
 *   group at a time into an L1 buffer reused by every 4-row tile, the accumulators kept in
 *   memory (the same operands and operations, so the same sums).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "cpu_common.h"
#include "radixgen_kernels.h"
#include "team.h"

#define QPANEL 48 /* output columns per panel */
#define QGROUP 32 /* k per scale group */
#define QTILE_M 4 /* rows per register tile (buffered path) */
#define QPF 4 /* groups ahead the U4 register tiles prefetch */
#define QPF_ROW 8 /* groups ahead the 1-2 row tiles prefetch */
#define QREG_MAX_M 16 /* U4 batches up to this many rows unpack in registers (qtile_u4) */
#define QBLOCK_M 64 /* rows per work item */
#define QFMT_U4 0
#define QFMT_I8 1
#define QFMT_U4F 2
#define QFMT_I8H 3
#define QFMT_I8M 4
/* or'ed into fmt: quantize x to int8 per row per group (QACT_I8X2: and its residual) where
 * this build can (qgemm_act_int8_formats), else the flag is ignored */
#define QACT_I8 256
#define QACT_I8X2 512
/* U4 and U4F: nibbles with a scale and a min; the others: bytes */
#define IS_U4(fmt) ((fmt) == QFMT_U4 || (fmt) == QFMT_U4F)
#define HAS_MIN(fmt) (IS_U4(fmt) || (fmt) == QFMT_I8M)
#define BUF_GROUP (2 * QPANEL * 4 + 16 * 3 * 64) /* d, m float32 + 48 bf16 operands (bytes) */

/* float16 bits -> float32 (exact), portable: the lookup path runs without F16C too. */
static inline float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31u, f = h & 1023u, u;
    if (e == 0) {
        float v = (float)f * (1.0f / 16777216.0f); /* zero or subnormal: f * 2^-24 */
        return s ? -v : v;
    }
    u = e == 31 ? (s | 0x7f800000u | (f << 13)) : (s | ((e + 112u) << 23) | (f << 13));
    float out;
    memcpy(&out, &u, 4);
    return out;
}

/* Bytes of the scales (and mins) at the start of a packed group. */
static int64_t scale_bytes_of(int fmt) {
    return fmt == QFMT_U4 ? 4 * QPANEL : fmt == QFMT_I8 ? 2 * QPANEL : 8 * QPANEL;
}

static int64_t group_bytes(int fmt) {
    return scale_bytes_of(fmt) + (IS_U4(fmt) ? QPANEL * QGROUP / 2 : QPANEL * QGROUP);
}

int64_t qgemm_packed_bytes(int64_t n, int64_t k, int fmt) {
    if (k % QGROUP || fmt < QFMT_U4 || fmt > QFMT_I8M) return -1;
    return ((n + QPANEL - 1) / QPANEL) * (k / QGROUP) * group_bytes(fmt);
}

/* q: [n, k] bytes (u4 values or int8), d, m: [n, k / 32] float16 bits (float32 for U4F; m
 * unused for I8). */
void qgemm_pack(const uint8_t* q, const void* d, const void* m, int64_t n, int64_t k, int fmt,
                uint8_t* out) {
    int64_t groups = k / QGROUP, panels = (n + QPANEL - 1) / QPANEL, gb = group_bytes(fmt);
    int64_t scale_bytes = scale_bytes_of(fmt);
#pragma omp parallel for schedule(static) num_threads(team_threads())
    for (int64_t p = 0; p < panels; ++p) {
        for (int64_t g = 0; g < groups; ++g) {
            uint8_t* dst = out + (p * groups + g) * gb;
            memset(dst, 0, (size_t)gb);
            uint16_t* ds = (uint16_t*)dst;
            uint8_t* qd = dst + scale_bytes;
            for (int c = 0; c < QPANEL; ++c) {
                int64_t row = p * QPANEL + c;
                if (row >= n) break;
                if (fmt == QFMT_U4F || fmt == QFMT_I8M) {
                    ((float*)dst)[c] = ((const float*)d)[row * groups + g];
                    ((float*)dst)[QPANEL + c] = ((const float*)m)[row * groups + g];
                } else if (fmt == QFMT_I8H) { /* the two halves' scales */
                    ((float*)dst)[c] = ((const float*)d)[(row * groups + g) * 2];
                    ((float*)dst)[QPANEL + c] = ((const float*)d)[(row * groups + g) * 2 + 1];
                } else {
                    ds[c] = ((const uint16_t*)d)[row * groups + g];
                    if (fmt == QFMT_U4) ds[QPANEL + c] = ((const uint16_t*)m)[row * groups + g];
                }
                const uint8_t* src = q + row * k + g * QGROUP;
                int j = c / 16, i0 = (c % 16) * 2;
                for (int kk = 0; kk < QGROUP; ++kk) {
                    int kp = kk / 2, i = i0 + (kk & 1);
                    if (IS_U4(fmt)) /* chunk (kp / 4, j): word i, nibble kp % 4 */
                        qd[((kp / 4) * 3 + j) * 64 + 2 * i + (kp % 4) / 2] |=
                            (uint8_t)((src[kk] & 15) << (4 * (kp & 1)));
                    else
                        qd[(kp * 3 + j) * 32 + i] = src[kk];
                }
            }
        }
    }
}

/* Dequantized rows of a packed weight (an embedding lookup), rounded to bf16 once. */
void qgemm_rows_bf16(const uint8_t* packed, int64_t n, int64_t k, int fmt, const int64_t* rows,
                     int64_t r, uint16_t* out) {
    int64_t groups = k / QGROUP, gb = group_bytes(fmt);
    int64_t scale_bytes = scale_bytes_of(fmt);
#pragma omp parallel for schedule(static) if (r > 16) num_threads(team_threads())
    for (int64_t t = 0; t < r; ++t) {
        int64_t row = rows[t];
        uint16_t* o = out + t * k;
        if (row < 0 || row >= n) {
            memset(o, 0, (size_t)k * 2);
            continue;
        }
        int64_t p = row / QPANEL;
        int c = (int)(row % QPANEL), j = c / 16, i0 = (c % 16) * 2;
        for (int64_t g = 0; g < groups; ++g) {
            const uint8_t* src = packed + (p * groups + g) * gb;
            const uint16_t* ds = (const uint16_t*)src;
            const uint8_t* qd = src + scale_bytes;
            float dv, mv = 0.0f, dv2 = 0.0f;
            if (fmt == QFMT_U4F || fmt == QFMT_I8M) {
                dv = ((const float*)src)[c];
                mv = ((const float*)src)[QPANEL + c];
            } else if (fmt == QFMT_I8H) {
                dv = ((const float*)src)[c];
                dv2 = ((const float*)src)[QPANEL + c];
            } else {
                dv = half_to_float(ds[c]);
                if (fmt == QFMT_U4) mv = half_to_float(ds[QPANEL + c]);
            }
            for (int kk = 0; kk < QGROUP; ++kk) {
                int kp = kk / 2, i = i0 + (kk & 1);
                float qv;
                if (IS_U4(fmt))
                    qv = (float)((qd[((kp / 4) * 3 + j) * 64 + 2 * i + (kp % 4) / 2] >>
                                  (4 * (kp & 1))) & 15);
                else
                    qv = (float)(int8_t)qd[(kp * 3 + j) * 32 + i];
                o[g * QGROUP + kk] = f2bf((fmt == QFMT_I8H && kk >= 16 ? dv2 : dv) * qv + mv);
            }
        }
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)

int qgemm_available(void) { return 1; }

/* U4 operands: one 64-byte chunk holds 4 operands (k-pairs 4t .. 4t+3), nibble s of word i
 * being word i of operand s. Each nibble v becomes the bf16 1 + v/16 (0x3F80 | v << 3, exact):
 * two integer ops per operand, no shuffles. The group's scale is then 16 d and its min
 * m - 16 d:  sum x (1 + q/16) * 16 d + (m - 16 d) sum x  =  sum x (d q + m). */
static inline void u4_operands(const uint8_t* chunk, __m512bh out[4]) {
    const __m512i w = _mm512_loadu_si512(chunk);
    const __m512i mask = _mm512_set1_epi16(0x0078), one = _mm512_set1_epi16(0x3F80);
    out[0] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 3), mask, one, 0xEA);
    out[1] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 1), mask, one, 0xEA);
    out[2] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 5), mask, one, 0xEA);
    out[3] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 9), mask, one, 0xEA);
}

/* A U4 group's scale and min for the 1 + q/16 operands (see u4_operands), 16 columns. */
static inline void u4_scales(const uint8_t* src, int fmt, int j, __m512* d16, __m512* mv) {
    __m512 d, m;
    if (fmt == QFMT_U4F) {
        d = _mm512_loadu_ps((const float*)src + j * 16);
        m = _mm512_loadu_ps((const float*)src + QPANEL + j * 16);
    } else {
        d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)src + j));
        m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + 96) + j));
    }
    *d16 = _mm512_mul_ps(d, _mm512_set1_ps(16.0f));
    *mv = _mm512_fnmadd_ps(d, _mm512_set1_ps(16.0f), m);
}

/* I8 operand: 32 int8 (words in operand order) -> 32 bf16 (exact). */
static inline __m512bh i8_operand(const uint8_t* src) {
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)src)));
    __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(src + 16))));
    return _mm512_cvtne2ps_pbh(hi, lo);
}

/* Unpack one packed group (48 columns) into the buffer layout: d, m float32, operands bf16. */
static void unpack_group(const uint8_t* src, int fmt, uint8_t* buf) {
    float* d = (float*)buf;
    __m512i* ops = (__m512i*)(buf + 2 * QPANEL * 4);
    for (int j = 0; j < 3; ++j) {
        __m512 dv, mv = _mm512_setzero_ps();
        if (IS_U4(fmt)) {
            u4_scales(src, fmt, j, &dv, &mv);
        } else if (fmt == QFMT_I8H || fmt == QFMT_I8M) { /* I8H: the halves' scales */
            dv = _mm512_loadu_ps((const float*)src + j * 16);
            mv = _mm512_loadu_ps((const float*)src + QPANEL + j * 16);
        } else {
            dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)src + j));
        }
        _mm512_storeu_ps(d + j * 16, dv);
        _mm512_storeu_ps(d + QPANEL + j * 16, mv);
    }
    if (IS_U4(fmt)) {
        const uint8_t* qd = src + scale_bytes_of(fmt);
        for (int t = 0; t < 4; ++t)
            for (int j = 0; j < 3; ++j) {
                __m512bh o[4];
                u4_operands(qd + (t * 3 + j) * 64, o);
                for (int s = 0; s < 4; ++s) _mm512_storeu_si512(ops + (4 * t + s) * 3 + j, (__m512i)o[s]);
            }
    } else {
        const uint8_t* qd = src + scale_bytes_of(fmt);
        for (int i = 0; i < 48; ++i) _mm512_storeu_si512(ops + i, (__m512i)i8_operand(qd + i * 32));
    }
}

/* In-register path: `mr` (1 or 2) rows x one panel over all groups, the integers unpacked in
 * registers. xs: per row, per group, sum of x over the group (float32; read only for U4). */
static inline __attribute__((always_inline)) void qtile(
    const int mr, const int fmt, const uint16_t* x, int64_t ldx, const float* xs, int64_t groups,
    const uint8_t* panel, const float* bias, void* y, int64_t ldy, int ncols, int out_f32) {
    __m512 acc[2][3];
    const int64_t gb = group_bytes(fmt);
#pragma GCC unroll 4
    for (int m = 0; m < mr; ++m)
        for (int j = 0; j < 3; ++j) acc[m][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* src = panel + g * gb;
        const uint16_t* xg = x + g * QGROUP;
        /* decode streams the weights from memory: QPF_ROW groups ahead (past the panel's end is
         * this thread's next panel) makes the default model's Q4_1 decoder stack 6-16 % faster
         * (benchmark/ab_kernels.py); its Q8_0 head is unchanged by it */
        for (int64_t b = 0; b < gb; b += 64)
            _mm_prefetch((const char*)src + QPF_ROW * gb + b, _MM_HINT_T0);
        __m512 part[2][3];
#pragma GCC unroll 8
        for (int m = 0; m < mr; ++m)
            for (int j = 0; j < 3; ++j) part[m][j] = _mm512_setzero_ps();
        {
#pragma GCC unroll 4
            for (int t = 0; t < 4; ++t) { /* k-pairs 4t .. 4t+3 */
                __m512bh w[3][4];
                for (int j = 0; j < 3; ++j) {
                    if (IS_U4(fmt)) {
                        u4_operands(src + scale_bytes_of(fmt) + (t * 3 + j) * 64, w[j]);
                    } else {
                        const uint8_t* qd = src + scale_bytes_of(fmt);
                        for (int s = 0; s < 4; ++s) w[j][s] = i8_operand(qd + ((4 * t + s) * 3 + j) * 32);
                    }
                }
#pragma GCC unroll 2
                for (int m = 0; m < mr; ++m)
                    for (int s = 0; s < 4; ++s) {
                        int32_t pair;
                        memcpy(&pair, xg + m * ldx + 8 * t + 2 * s, 4);
                        const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
                        for (int j = 0; j < 3; ++j)
                            part[m][j] = _mm512_dpbf16_ps(part[m][j], a, w[j][s]);
                    }
                if (fmt == QFMT_I8H && t == 1) /* first half of the group: its own scale */
                    for (int j = 0; j < 3; ++j) {
                        const __m512 d1 = _mm512_loadu_ps((const float*)src + j * 16);
                        for (int m = 0; m < mr; ++m) {
                            acc[m][j] = _mm512_fmadd_ps(part[m][j], d1, acc[m][j]);
                            part[m][j] = _mm512_setzero_ps();
                        }
                    }
            }
        }
        for (int j = 0; j < 3; ++j) {
            __m512 dv, mv = _mm512_setzero_ps();
            if (IS_U4(fmt))
                u4_scales(src, fmt, j, &dv, &mv);
            else if (fmt == QFMT_I8H) /* the second half's scale */
                dv = _mm512_loadu_ps((const float*)src + QPANEL + j * 16);
            else if (fmt == QFMT_I8M) {
                dv = _mm512_loadu_ps((const float*)src + j * 16);
                mv = _mm512_loadu_ps((const float*)src + QPANEL + j * 16);
            }
            else
                dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)src + j));
#pragma GCC unroll 8
            for (int m = 0; m < mr; ++m) {
                acc[m][j] = _mm512_fmadd_ps(part[m][j], dv, acc[m][j]);
                if (HAS_MIN(fmt))
                    acc[m][j] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[m * groups + g]), acc[m][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; ++m)
        for (int j = 0; j < 3 && j * 16 < ncols; ++j) {
            int left = ncols - j * 16;
            __mmask16 keep = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            __m512 v = acc[m][j];
            if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, bias + j * 16));
            if (out_f32)
                _mm512_mask_storeu_ps((float*)y + m * ldy + j * 16, keep, v);
            else
                _mm256_mask_storeu_epi16((uint16_t*)y + m * ldy + j * 16, keep,
                                         (__m256i)_mm512_cvtneps_pbh(v));
        }
}


/* Buffered path: one unpacked group (L1) for `mr` rows, the accumulators in memory (acc: rows of
 * 48 floats). The same operations in the same order as `qtile`. */
static inline __attribute__((always_inline)) void qgroup_tile(
    const int mr, const int fmt, const uint16_t* xg, int64_t ldx, const float* xs,
    int64_t groups, const uint8_t* buf, float* acc) {
    __m512 part[QTILE_M][3];
    const __m512i* ops = (const __m512i*)(buf + 2 * QPANEL * 4);
#pragma GCC unroll 8
    for (int m = 0; m < mr; ++m)
        for (int j = 0; j < 3; ++j) part[m][j] = _mm512_setzero_ps();
    for (int kp = 0; kp < 16; ++kp) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(ops + kp * 3);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(ops + kp * 3 + 1);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(ops + kp * 3 + 2);
#pragma GCC unroll 8
        for (int m = 0; m < mr; ++m) {
            int32_t pair;
            memcpy(&pair, xg + m * ldx + 2 * kp, 4);
            const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            part[m][0] = _mm512_dpbf16_ps(part[m][0], a, w0);
            part[m][1] = _mm512_dpbf16_ps(part[m][1], a, w1);
            part[m][2] = _mm512_dpbf16_ps(part[m][2], a, w2);
        }
        if (fmt == QFMT_I8H && kp == 7) /* first half of the group: its own scale */
            for (int j = 0; j < 3; ++j) {
                const __m512 d1 = _mm512_loadu_ps((const float*)buf + j * 16);
                for (int m = 0; m < mr; ++m) {
                    float* a = acc + m * QPANEL + j * 16;
                    _mm512_storeu_ps(a, _mm512_fmadd_ps(part[m][j], d1, _mm512_loadu_ps(a)));
                    part[m][j] = _mm512_setzero_ps();
                }
            }
    }
    for (int j = 0; j < 3; ++j) {
        const __m512 dv = _mm512_loadu_ps((const float*)buf + (fmt == QFMT_I8H ? QPANEL : 0) + j * 16);
        const __m512 mv = _mm512_loadu_ps((const float*)buf + QPANEL + j * 16);
#pragma GCC unroll 8
        for (int m = 0; m < mr; ++m) {
            __m512 v = _mm512_fmadd_ps(part[m][j], dv, _mm512_loadu_ps(acc + m * QPANEL + j * 16));
            if (HAS_MIN(fmt)) v = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[m * groups]), v);
            _mm512_storeu_ps(acc + m * QPANEL + j * 16, v);
        }
    }
}

/* U4 register tile for small batches (3 .. QREG_MAX_M rows): `mr` (<= 8) rows x one panel over
 * all groups, each operand unpacked in registers once per tile and used by all its rows (no
 * buffer: for few rows, storing and reloading the operands costs more than unpacking them), the
 * accumulators in memory (acc: rows of 48 floats). The same operations in the same order as
 * `qtile`: per output, k-pairs 0..15 of a group into a fresh partial sum, then scale and min. */
static inline __attribute__((always_inline)) void qtile_u4(
    const int mr, const int fmt, const uint16_t* x, int64_t ldx, const float* xs, int64_t groups,
    const uint8_t* panel, float* acc) {
    const int64_t gb = group_bytes(fmt);
    const __m512i mask = _mm512_set1_epi16(0x0078), one = _mm512_set1_epi16(0x3F80);
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* src = panel + g * gb;
        const uint8_t* qd = src + scale_bytes_of(fmt);
        const uint16_t* xg = x + g * QGROUP;
        /* cold weights: prefetching QPF groups ahead pays from 3 rows on (M = 3..7 1.2-1.4x,
         * 8 rows 1.07x, bench_qgemm_shapes.py --cold); the decode path (1-2 rows, qtile): QPF_ROW */
        if (mr >= 3)
            for (int64_t b = 0; b < gb; b += 64)
                _mm_prefetch((const char*)src + QPF * gb + b, _MM_HINT_T0);
        __m512 part[8][3];
#pragma GCC unroll 8
        for (int m = 0; m < mr; ++m)
            for (int j = 0; j < 3; ++j) part[m][j] = _mm512_setzero_ps();
        for (int t = 0; t < 4; ++t) /* k-pairs 4t .. 4t+3 */
#pragma GCC unroll 4
            for (int s = 0; s < 4; ++s) { /* operand s of each chunk: as u4_operands */
                __m512bh op[3];
                for (int j = 0; j < 3; ++j) {
                    const __m512i w = _mm512_loadu_si512(qd + (t * 3 + j) * 64);
                    const __m512i sh = s == 0 ? _mm512_slli_epi16(w, 3) : _mm512_srli_epi16(w, 4 * s - 3);
                    op[j] = (__m512bh)_mm512_ternarylogic_epi32(sh, mask, one, 0xEA);
                }
#pragma GCC unroll 8
                for (int m = 0; m < mr; ++m) {
                    int32_t pair;
                    memcpy(&pair, xg + m * ldx + 8 * t + 2 * s, 4);
                    const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
                    for (int j = 0; j < 3; ++j) part[m][j] = _mm512_dpbf16_ps(part[m][j], a, op[j]);
                }
            }
        for (int j = 0; j < 3; ++j) {
            __m512 dv, mv;
            u4_scales(src, fmt, j, &dv, &mv);
#pragma GCC unroll 8
            for (int m = 0; m < mr; ++m) {
                float* a = acc + m * QPANEL + j * 16;
                __m512 v = _mm512_fmadd_ps(part[m][j], dv, _mm512_loadu_ps(a));
                _mm512_storeu_ps(a, _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[m * groups + g]), v));
            }
        }
    }
}

/* Bias, rounding and the store of accumulated rows (acc: rows of 48 floats). */
static void store_rows(const float* acc, int64_t rows, const float* bias, void* y, int64_t ldy,
                       int ncols, int out_f32) {
    for (int64_t m = 0; m < rows; ++m)
        for (int j = 0; j < 3 && j * 16 < ncols; ++j) {
            int left = ncols - j * 16;
            __mmask16 keep = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            __m512 v = _mm512_loadu_ps(acc + m * QPANEL + j * 16);
            if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, bias + j * 16));
            if (out_f32)
                _mm512_mask_storeu_ps((float*)y + m * ldy + j * 16, keep, v);
            else
                _mm256_mask_storeu_epi16((uint16_t*)y + m * ldy + j * 16, keep,
                                         (__m256i)_mm512_cvtneps_pbh(v));
        }
}

#define QGROUP_CASES(FMT)                                                        \
    switch (rows) {                                                              \
        case 4: qgroup_tile(4, FMT, xg, ldx, xsr, groups, buf, ar); break;       \
        case 3: qgroup_tile(3, FMT, xg, ldx, xsr, groups, buf, ar); break;       \
        case 2: qgroup_tile(2, FMT, xg, ldx, xsr, groups, buf, ar); break;       \
        default: qgroup_tile(1, FMT, xg, ldx, xsr, groups, buf, ar); break;      \
    }

#define QU4_CASES(FMT)                                                        \
    switch (rows) {                                                           \
        case 8: qtile_u4(8, FMT, xr, ldx, xsr, groups, panel, ar); break;     \
        case 7: qtile_u4(7, FMT, xr, ldx, xsr, groups, panel, ar); break;     \
        case 6: qtile_u4(6, FMT, xr, ldx, xsr, groups, panel, ar); break;     \
        case 5: qtile_u4(5, FMT, xr, ldx, xsr, groups, panel, ar); break;     \
        case 4: qtile_u4(4, FMT, xr, ldx, xsr, groups, panel, ar); break;     \
        case 3: qtile_u4(3, FMT, xr, ldx, xsr, groups, panel, ar); break;     \
        case 2: qtile_u4(2, FMT, xr, ldx, xsr, groups, panel, ar); break;     \
        default: qtile_u4(1, FMT, xr, ldx, xsr, groups, panel, ar); break;    \
    }

#define QTILE_CASES(FMT)                                                                    \
    if (rows == 2) qtile(2, FMT, xr, ldx, xsr, groups, panel, pb, yr, ldy, ncols, out_f32); \
    else qtile(1, FMT, xr, ldx, xsr, groups, panel, pb, yr, ldy, ncols, out_f32);

/* This thread's unpacking buffer, kept between calls (a fresh one per call costs page faults). */
static _Thread_local uint8_t* tl_buf = NULL;
static _Thread_local int64_t tl_cap = 0;

static uint8_t* thread_buffer(int64_t bytes) {
    if (bytes > tl_cap) {
        free(tl_buf);
        tl_buf = (uint8_t*)aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
        tl_cap = tl_buf ? bytes : 0;
    }
    return tl_buf;
}

/* Sum of x over each group of 32, per row: a fixed order, whatever M is. */
static void group_sums(const uint16_t* x, int64_t m, int64_t ldx, int64_t groups, float* xs) {
#pragma omp parallel for schedule(static) if (m > 4) num_threads(team_threads())
    for (int64_t r = 0; r < m; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            const uint16_t* p = x + r * ldx + g * QGROUP;
            xs[r * groups + g] = _mm512_reduce_add_ps(_mm512_add_ps(load16_bf16(p), load16_bf16(p + 16)));
        }
}

/* x: [m, k] bf16 (row stride ldx); packed: from qgemm_pack; bias: float32 [n] or NULL;
 * y: [m, n] (row stride ldy) bf16 or (out_f32) float32. 0 = ok, -1 unavailable, -2 bad k/fmt,
 * -3 out of memory. */
int qgemm_act_int8_formats(void) { return 0; }

int qgemm(const uint16_t* x, int64_t m, int64_t ldx, const uint8_t* packed, int64_t n, int64_t k,
          int fmt, const float* bias, void* y, int64_t ldy, int out_f32) {
    fmt &= ~(QACT_I8 | QACT_I8X2); /* no int8-activation path in this variant */
    if (qgemm_packed_bytes(n, k, fmt) < 0) return -2;
    int64_t groups = k / QGROUP, panels = (n + QPANEL - 1) / QPANEL, gbytes = group_bytes(fmt);
    int64_t blocks = (m + QBLOCK_M - 1) / QBLOCK_M, items = blocks * panels;
    float* xs = NULL;
    if (HAS_MIN(fmt)) {
        xs = (float*)malloc((size_t)(m * groups) * sizeof(float));
        if (!xs) return -3;
        group_sums(x, m, ldx, groups, xs);
    }
    const int buffered = m > 2; /* in-register unpacking pays off for 1-2 rows only */
    int failed = 0;
    TeamClock clock;
    team_clock_start(&clock);
#pragma omp parallel num_threads(team_threads())
    {
        uint8_t* buf = buffered ? thread_buffer(BUF_GROUP + QBLOCK_M * QPANEL * 4) : NULL;
        if (buffered && !buf) failed = 1;
#pragma omp for schedule(static) nowait
        for (int64_t it = 0; it < items; ++it) {
            if (buffered && !buf) continue;
            int64_t blk = it / panels, p = it % panels;
            const uint8_t* panel = packed + p * groups * gbytes;
            int ncols = n - p * QPANEL < QPANEL ? (int)(n - p * QPANEL) : QPANEL;
            const float* pb = bias ? bias + p * QPANEL : NULL;
            int64_t end = (blk + 1) * QBLOCK_M < m ? (blk + 1) * QBLOCK_M : m;
            if (buffered && IS_U4(fmt) && m <= QREG_MAX_M) {
                float* acc = (float*)(buf + BUF_GROUP);
                memset(acc, 0, (size_t)((end - blk * QBLOCK_M) * QPANEL) * sizeof(float));
                for (int64_t r = blk * QBLOCK_M; r < end; r += 8) {
                    const uint16_t* xr = x + r * ldx;
                    const float* xsr = xs + r * groups;
                    float* ar = acc + (r - blk * QBLOCK_M) * QPANEL;
                    int rows = end - r < 8 ? (int)(end - r) : 8;
                    if (fmt == QFMT_U4) {
                        QU4_CASES(QFMT_U4)
                    } else {
                        QU4_CASES(QFMT_U4F)
                    }
                }
                int64_t yoff = blk * QBLOCK_M * ldy + p * QPANEL;
                void* yr = out_f32 ? (void*)((float*)y + yoff) : (void*)((uint16_t*)y + yoff);
                store_rows(acc, end - blk * QBLOCK_M, pb, yr, ldy, ncols, out_f32);
                continue;
            }
            if (buffered) {
                float* acc = (float*)(buf + BUF_GROUP);
                memset(acc, 0, (size_t)((end - blk * QBLOCK_M) * QPANEL) * sizeof(float));
                for (int64_t g = 0; g < groups; ++g) {
                    unpack_group(panel + g * gbytes, fmt, buf);
                    for (int64_t r = blk * QBLOCK_M; r < end; r += QTILE_M) {
                        const uint16_t* xg = x + r * ldx + g * QGROUP;
                        const float* xsr = xs ? xs + r * groups + g : NULL;
                        float* ar = acc + (r - blk * QBLOCK_M) * QPANEL;
                        int rows = end - r < QTILE_M ? (int)(end - r) : QTILE_M;
                        /* one buffer layout for every format with a min */
                        if (HAS_MIN(fmt)) {
                            QGROUP_CASES(QFMT_U4)
                        } else if (fmt == QFMT_I8H) {
                            QGROUP_CASES(QFMT_I8H)
                        } else {
                            QGROUP_CASES(QFMT_I8)
                        }
                    }
                }
                int64_t yoff = blk * QBLOCK_M * ldy + p * QPANEL;
                void* yr = out_f32 ? (void*)((float*)y + yoff) : (void*)((uint16_t*)y + yoff);
                store_rows(acc, end - blk * QBLOCK_M, pb, yr, ldy, ncols, out_f32);
                continue;
            }
            { /* m <= 2: one register tile */
                const uint16_t* xr = x;
                const float* xsr = xs;
                void* yr = out_f32 ? (void*)((float*)y + p * QPANEL) : (void*)((uint16_t*)y + p * QPANEL);
                int rows = (int)m;
                if (fmt == QFMT_U4) {
                    QTILE_CASES(QFMT_U4)
                } else if (fmt == QFMT_U4F) {
                    QTILE_CASES(QFMT_U4F)
                } else if (fmt == QFMT_I8H) {
                    QTILE_CASES(QFMT_I8H)
                } else if (fmt == QFMT_I8M) {
                    QTILE_CASES(QFMT_I8M)
                } else {
                    QTILE_CASES(QFMT_I8)
                }
            }
        }
        team_clock_done(&clock);
    }
    team_clock_report(&clock);
    free(xs);
    return failed ? -3 : 0;
}

#elif (defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512F__) || \
    (defined(__aarch64__) && defined(__ARM_NEON))

/* AVX2 + FMA, AVX-512F without BF16, aarch64 NEON: float32 FMAs, one width-generic source */
#include "gemm_quant_fma.h"

#else /* no SIMD variant: report unavailable */

int qgemm_available(void) { return 0; }
int qgemm_act_int8_formats(void) { return 0; }

int qgemm(const uint16_t* x, int64_t m, int64_t ldx, const uint8_t* packed, int64_t n, int64_t k,
          int fmt, const float* bias, void* y, int64_t ldy, int out_f32) {
    (void)x; (void)m; (void)ldx; (void)packed; (void)n; (void)k; (void)fmt; (void)bias; (void)y;
    (void)ldy; (void)out_f32;
    return -1;
}
#endif

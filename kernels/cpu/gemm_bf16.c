/* bf16 matrix multiply for the linear layers on CPUs with AVX512-BF16 (compiled with the other
 * kernels; without AVX512-BF16 every entry point reports "unavailable" and callers use oneDNN).
 *
 * y[M, N] = x[M, K] W[N, K]^T (+ bias), bf16 in and out, float32 accumulation.
 * - The weight is packed once into panels of 48 output columns, each k-pair of a column stored
 *   next to each other (the operand layout of VDPBF16PS): panel p, pair kp, column c at
 *   ((p * K2 + kp) * 48 + c) * 2, zero-padded past N and K.
 * - Every output element is one float32 accumulator walking k-pairs 0, 1, 2, ... in order,
 *   whatever M is and whichever rows share a tile, so a row comes out bitwise the same alone or
 *   in any batch (seeded sampling and the cache on/off equality rely on that).
 * - Tiles of 8 rows x 48 columns keep 24 accumulators in registers; each k-pair loads 3 weight
 *   vectors and 8 broadcasts for 24 VDPBF16PS. Work items are (64-row block, panel) pairs split
 *   statically over threads, so at decode sizes each thread streams its own half of the weight.
 */
#include <stdint.h>
#include <string.h>
#include <omp.h>

#include "radixgen_kernels.h"
#include "team.h"

#define PANEL 48 /* output columns per packed panel: 3 vectors of 16 float32 lanes */
#define TILE_M 8 /* rows per register tile */
#define BLOCK_M 64 /* rows per work item (the A block a panel is reused over) */

int64_t gemm_bf16_packed_elems(int64_t n, int64_t k) {
    return ((n + PANEL - 1) / PANEL) * ((k + 1) / 2) * PANEL * 2;
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

int gemm_bf16_available(void) { return 1; }

/* w: [n, k] bf16 row-major (as nn.Linear stores it) -> out: gemm_bf16_packed_elems(n, k). */
void gemm_bf16_pack(const uint16_t* w, int64_t n, int64_t k, uint16_t* out) {
    int64_t k2 = (k + 1) / 2, panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(team_threads())
    for (int64_t p = 0; p < panels; ++p) {
        uint16_t* dst = out + p * k2 * PANEL * 2;
        for (int c = 0; c < PANEL; ++c) {
            int64_t row = p * PANEL + c;
            const uint16_t* src = w + row * k;
            for (int64_t kp = 0; kp < k2; ++kp) {
                uint16_t lo = 0, hi = 0;
                if (row < n) {
                    lo = src[2 * kp];
                    hi = 2 * kp + 1 < k ? src[2 * kp + 1] : 0;
                }
                dst[(kp * PANEL + c) * 2] = lo;
                dst[(kp * PANEL + c) * 2 + 1] = hi;
            }
        }
    }
}

/* One tile: `mr` (<= TILE_M, a constant after inlining) rows x one panel, over all k-pairs. */
static inline __attribute__((always_inline)) void tile(const int mr, const uint16_t* x,
                                                       int64_t ldx, const uint16_t* panel,
                                                       int64_t k2, const float* bias, void* y,
                                                       int64_t ldy, int ncols, int out_f32) {
    __m512 acc[TILE_M][3];
#pragma GCC unroll 8
    for (int m = 0; m < mr; ++m)
        for (int j = 0; j < 3; ++j) acc[m][j] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < k2; ++kp) {
        const uint16_t* b = panel + kp * PANEL * 2;
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 32);
        const __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + 64);
#pragma GCC unroll 8
        for (int m = 0; m < mr; ++m) {
            int32_t pair;
            memcpy(&pair, x + m * ldx + 2 * kp, 4);
            const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], a, b0);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], a, b1);
            acc[m][2] = _mm512_dpbf16_ps(acc[m][2], a, b2);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < mr; ++m)
        for (int j = 0; j < 3 && j * 16 < ncols; ++j) {
            int left = ncols - j * 16;
            __mmask16 keep = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            __m512 v = acc[m][j];
            if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, bias + j * 16));
            if (out_f32) {
                _mm512_mask_storeu_ps((float*)y + m * ldy + j * 16, keep, v);
            } else { /* VCVTNEPS2BF16 rounds to nearest even, as torch does */
                _mm256_mask_storeu_epi16((uint16_t*)y + m * ldy + j * 16, keep,
                                         (__m256i)_mm512_cvtneps_pbh(v));
            }
        }
}

/* x: [m, k] bf16 with row stride ldx, readable up to k rounded up to even (callers pad odd k);
 * packed: from gemm_bf16_pack; bias: float32 [n] or NULL; y: [m, n] with row stride ldy, bf16
 * or (out_f32) float32, for outputs that go straight into the float32 residual stream. */
int gemm_bf16(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* packed, int64_t n,
              int64_t k, const float* bias, void* y, int64_t ldy, int out_f32) {
    int64_t k2 = (k + 1) / 2, panels = (n + PANEL - 1) / PANEL;
    int64_t blocks = (m + BLOCK_M - 1) / BLOCK_M, items = blocks * panels;
    TeamClock clock;
    team_clock_start(&clock);
#pragma omp parallel num_threads(team_threads())
    {
#pragma omp for schedule(static) nowait
        for (int64_t it = 0; it < items; ++it) {
            int64_t blk = it / panels, p = it % panels;
            const uint16_t* panel = packed + p * k2 * PANEL * 2;
            int ncols = n - p * PANEL < PANEL ? (int)(n - p * PANEL) : PANEL;
            const float* pb = bias ? bias + p * PANEL : NULL;
            int64_t end = (blk + 1) * BLOCK_M < m ? (blk + 1) * BLOCK_M : m;
            for (int64_t r = blk * BLOCK_M; r < end; r += TILE_M) {
                const uint16_t* xr = x + r * ldx;
                int64_t yoff = r * ldy + p * PANEL;
                void* yr = out_f32 ? (void*)((float*)y + yoff) : (void*)((uint16_t*)y + yoff);
                switch (end - r < TILE_M ? (int)(end - r) : TILE_M) {
                    case 8: tile(8, xr, ldx, panel, k2, pb, yr, ldy, ncols, out_f32); break;
                    case 7: tile(7, xr, ldx, panel, k2, pb, yr, ldy, ncols, out_f32); break;
                    case 6: tile(6, xr, ldx, panel, k2, pb, yr, ldy, ncols, out_f32); break;
                    case 5: tile(5, xr, ldx, panel, k2, pb, yr, ldy, ncols, out_f32); break;
                    case 4: tile(4, xr, ldx, panel, k2, pb, yr, ldy, ncols, out_f32); break;
                    case 3: tile(3, xr, ldx, panel, k2, pb, yr, ldy, ncols, out_f32); break;
                    case 2: tile(2, xr, ldx, panel, k2, pb, yr, ldy, ncols, out_f32); break;
                    default: tile(1, xr, ldx, panel, k2, pb, yr, ldy, ncols, out_f32); break;
                }
            }
        }
        team_clock_done(&clock);
    }
    team_clock_report(&clock);
    return 0;
}

#else /* no AVX512-BF16: report unavailable */

int gemm_bf16_available(void) { return 0; }

void gemm_bf16_pack(const uint16_t* w, int64_t n, int64_t k, uint16_t* out) {
    (void)w; (void)n; (void)k; (void)out;
}

int gemm_bf16(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* packed, int64_t n,
              int64_t k, const float* bias, void* y, int64_t ldy, int out_f32) {
    (void)x; (void)m; (void)ldx; (void)packed; (void)n; (void)k; (void)bias; (void)y; (void)ldy;
    (void)out_f32;
    return -1;
}
#endif

/* Attention over a paged KV pool for CPUs (compiled at first use by kernels/cpu/build.py).
 *
 * One code path serves every query row, decode or prefill: each row attends to the pool slots
 * of its own request's visible keys, read in place (no gather copy). Work is split over
 * (row, kv head, fixed-size key block) tasks; partial results merge by log-sum-exp in block
 * order, so a row's output is bitwise the same however the batch was formed.
 * Accumulation is float32 whatever the storage dtype: float32 or bfloat16 like q, or another
 * KV cache format (int8 with per-token, per-head scales, fp8 e4m3; attention_kvq.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "cpu_common.h"
#include "radixgen_kernels.h"

#define MAX_GROUP 16
#define MAX_DIM 256

/* One (request, kv head, key block): writes unnormalised output, running max and sum. */
#define DEFINE_BLOCK(NAME, T, LOAD)                                                           \
static void NAME(const T* q, int64_t q_head_stride, const T* k, const T* v,                    \
                 const int64_t* idx, int64_t n, int64_t tok_stride, int G, int D, float scale, \
                 float* acc, float* m_out, float* l_out, float* scores) {                     \
    float qf[MAX_GROUP][MAX_DIM];                                                             \
    for (int g = 0; g < G; ++g)                                                               \
        for (int d = 0; d < D; ++d) qf[g][d] = LOAD(q[g * q_head_stride + d]) * scale;        \
    float m[MAX_GROUP];                                                                       \
    for (int g = 0; g < G; ++g) m[g] = -INFINITY;                                             \
    for (int64_t j = 0; j < n; ++j) {                                                         \
        const T* kr = k + idx[j] * tok_stride;                                                \
        if (j + 8 < n) __builtin_prefetch(k + idx[j + 8] * tok_stride);                        \
        for (int g = 0; g < G; ++g) {                                                         \
            float s = 0.f;                                                                    \
            _Pragma("omp simd reduction(+:s)")                                                \
            for (int d = 0; d < D; ++d) s += qf[g][d] * LOAD(kr[d]);                          \
            scores[g * n + j] = s;                                                            \
            if (s > m[g]) m[g] = s;                                                           \
        }                                                                                     \
    }                                                                                         \
    float l[MAX_GROUP];                                                                       \
    for (int g = 0; g < G; ++g) {                                                             \
        float sum = 0.f;                                                                      \
        for (int64_t j = 0; j < n; ++j) {                                                     \
            float p = expf(scores[g * n + j] - m[g]);                                         \
            scores[g * n + j] = p;                                                            \
            sum += p;                                                                         \
        }                                                                                     \
        l[g] = sum;                                                                           \
        for (int d = 0; d < D; ++d) acc[g * D + d] = 0.f;                                     \
    }                                                                                         \
    for (int64_t j = 0; j < n; ++j) {                                                         \
        const T* vr = v + idx[j] * tok_stride;                                                \
        if (j + 8 < n) __builtin_prefetch(v + idx[j + 8] * tok_stride);                        \
        for (int g = 0; g < G; ++g) {                                                         \
            float p = scores[g * n + j];                                                      \
            float* a = acc + g * D;                                                           \
            _Pragma("omp simd")                                                               \
            for (int d = 0; d < D; ++d) a[d] += p * LOAD(vr[d]);                              \
        }                                                                                     \
    }                                                                                         \
    for (int g = 0; g < G; ++g) { m_out[g] = m[g]; l_out[g] = l[g]; }                         \
}

#define LOAD_F32(x) (x)
#define LOAD_BF16(x) bf16f(x)
DEFINE_BLOCK(block_f32, float, LOAD_F32)
DEFINE_BLOCK(block_bf16, uint16_t, LOAD_BF16)

#ifdef __AVX512F__
/* Sum each of 16 vectors: result lane j = horizontal sum of v[j] (a transposing add tree). */
static inline __m512 reduce16(const __m512* v) {
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; ++i)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
        __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                         _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}

/* Same contract as block_*; D must be a multiple of 16 (every common head size). Keys are taken
 * 16 at a time: each key row is converted once for all G heads, and the 16 dot products per
 * head are summed by one transposing add tree instead of 16 horizontal reductions. */
#define DEFINE_BLOCK_AVX512(NAME, T, LOAD16)                                                   \
static void NAME(const T* q, int64_t q_head_stride, const T* k, const T* v,                    \
                 const int64_t* idx, int64_t n, int64_t tok_stride, int G, int D, float scale, \
                 float* acc, float* m_out, float* l_out, float* scores) {                     \
    const int C = D / 16;                                                                     \
    __m512 qv[MAX_GROUP * (MAX_DIM / 16)];                                                    \
    for (int g = 0; g < G; ++g)                                                               \
        for (int c = 0; c < C; ++c)                                                           \
            qv[g * C + c] = _mm512_mul_ps(LOAD16(q + g * q_head_stride + c * 16),             \
                                          _mm512_set1_ps(scale));                              \
    __m512 mx[MAX_GROUP];                                                                     \
    for (int g = 0; g < G; ++g) mx[g] = _mm512_set1_ps(-INFINITY);                            \
    __m512 part[MAX_GROUP][16];                                                               \
    for (int64_t j0 = 0; j0 < n; j0 += 16) {                                                  \
        int nj = n - j0 < 16 ? (int)(n - j0) : 16;                                            \
        for (int jj = 0; jj < 16; ++jj) {                                                     \
            if (jj >= nj) {                                                                   \
                for (int g = 0; g < G; ++g) part[g][jj] = _mm512_setzero_ps();                \
                continue;                                                                     \
            }                                                                                 \
            int64_t j = j0 + jj;                                                              \
            const T* kr = k + idx[j] * tok_stride;                                            \
            if (j + 8 < n) {                                                                  \
                const char* pf = (const char*)(k + idx[j + 8] * tok_stride);                  \
                for (int b_ = 0; b_ < D * (int)sizeof(T); b_ += 64) __builtin_prefetch(pf + b_); \
            }                                                                                 \
            __m512 kv[MAX_DIM / 16];                                                          \
            for (int c = 0; c < C; ++c) kv[c] = LOAD16(kr + c * 16);                          \
            for (int g = 0; g < G; ++g) {                                                     \
                __m512 s = _mm512_mul_ps(qv[g * C], kv[0]);                                   \
                for (int c = 1; c < C; ++c) s = _mm512_fmadd_ps(qv[g * C + c], kv[c], s);     \
                part[g][jj] = s;                                                              \
            }                                                                                 \
        }                                                                                     \
        __mmask16 valid = (__mmask16)((1u << nj) - 1u);                                       \
        for (int g = 0; g < G; ++g) {                                                         \
            __m512 sc = reduce16(part[g]);                                                    \
            _mm512_mask_storeu_ps(scores + g * n + j0, valid, sc);                            \
            mx[g] = _mm512_mask_max_ps(mx[g], valid, mx[g], sc);                              \
        }                                                                                     \
    }                                                                                         \
    float m[MAX_GROUP], l[MAX_GROUP];                                                         \
    for (int g = 0; g < G; ++g) {                                                             \
        m[g] = _mm512_reduce_max_ps(mx[g]);                                                   \
        __m512 mv = _mm512_set1_ps(m[g]);                                                     \
        __m512 sum = _mm512_setzero_ps();                                                     \
        for (int64_t j0 = 0; j0 < n; j0 += 16) {                                              \
            int nj = n - j0 < 16 ? (int)(n - j0) : 16;                                        \
            __mmask16 valid = (__mmask16)((1u << nj) - 1u);                                   \
            __m512 s = _mm512_maskz_loadu_ps(valid, scores + g * n + j0);                     \
            __m512 p = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(s, mv)));       \
            _mm512_mask_storeu_ps(scores + g * n + j0, valid, p);                             \
            sum = _mm512_add_ps(sum, p);                                                      \
        }                                                                                     \
        l[g] = _mm512_reduce_add_ps(sum);                                                     \
    }                                                                                         \
    __m512 av[MAX_GROUP * (MAX_DIM / 16)];                                                    \
    for (int i = 0; i < G * C; ++i) av[i] = _mm512_setzero_ps();                              \
    for (int64_t j = 0; j < n; ++j) {                                                         \
        const T* vr = v + idx[j] * tok_stride;                                                \
        if (j + 8 < n) {                                                                      \
            const char* pf = (const char*)(v + idx[j + 8] * tok_stride);                      \
            for (int b_ = 0; b_ < D * (int)sizeof(T); b_ += 64) __builtin_prefetch(pf + b_);   \
        }                                                                                     \
        for (int c = 0; c < C; ++c) {                                                         \
            __m512 vv = LOAD16(vr + c * 16);                                                  \
            for (int g = 0; g < G; ++g)                                                       \
                av[g * C + c] = _mm512_fmadd_ps(_mm512_set1_ps(scores[g * n + j]), vv,        \
                                                av[g * C + c]);                                \
        }                                                                                     \
    }                                                                                         \
    for (int g = 0; g < G; ++g) {                                                             \
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + g * D + c * 16, av[g * C + c]);    \
        m_out[g] = m[g];                                                                      \
        l_out[g] = l[g];                                                                      \
    }                                                                                         \
}
DEFINE_BLOCK_AVX512(block_f32_avx512, float, load16_f32)
DEFINE_BLOCK_AVX512(block_bf16_avx512, uint16_t, load16_bf16)


#if defined(__AVX512BF16__)
#define PF_DIST 16 /* tokens ahead to prefetch (random slots: DRAM latency) */
/* acc[g, :] = sum_j p[g, j] v_j over bf16 value rows, float32 accumulation in key order. With
 * G and C (= D / 16) constant after inlining the accumulators stay in registers. */
static inline __attribute__((always_inline)) void value_pass(
    const int G, const int C, const uint16_t* v, const int64_t* idx, int64_t n,
    int64_t tok_stride, int pf_bytes, const float* p, float* acc) {
    __m512 av[MAX_GROUP * (MAX_DIM / 16)];
#pragma GCC unroll 64
    for (int i = 0; i < G * C; ++i) av[i] = _mm512_setzero_ps();
    /* NOTE: zero-filled once, outside the key loop, so every lane is defined on every path: with
     * a run-time G (the generic path) gcc cannot match the unrolled writes to the unrolled reads
     * and warns (-Wmaybe-uninitialized). */
    __m512 pv[MAX_GROUP] = {0};
    for (int64_t j = 0; j < n; ++j) {
        const uint16_t* vr = v + idx[j] * tok_stride;
        if (j + PF_DIST < n) {
            const char* pf = (const char*)(v + idx[j + PF_DIST] * tok_stride);
            for (int b_ = 0; b_ < pf_bytes; b_ += 64) __builtin_prefetch(pf + b_);
        }
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) pv[g] = _mm512_set1_ps(p[g * n + j]);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
            __m512 vv = load16_bf16(vr + c * 16);
#pragma GCC unroll 16
            for (int g = 0; g < G; ++g) av[g * C + c] = _mm512_fmadd_ps(pv[g], vv, av[g * C + c]);
        }
    }
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + g * C * 16 + c * 16, av[g * C + c]);
}
#endif

#if defined(__AVX512BF16__)
/* bf16 storage with D a multiple of 32: q.k by VDPBF16PS straight from the bf16 rows (products
 * of bf16 values are exact in float32), scaled after the sum; values as in value_pass. G and
 * C2 (= D / 32) are constants after inlining for the common shapes, which keeps q and the
 * accumulators in registers. */
static inline __attribute__((always_inline)) void block_dp(
    const int G, const int C2, const uint16_t* q, int64_t q_head_stride, const uint16_t* k,
    const uint16_t* v, const int64_t* idx, int64_t n, int64_t tok_stride, int pf_bytes,
    float scale, float* acc, float* m_out, float* l_out, float* scores) {
    __m512bh qv[MAX_GROUP * (MAX_DIM / 32)];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
        for (int c = 0; c < C2; ++c)
            qv[g * C2 + c] = (__m512bh)_mm512_loadu_si512(q + g * q_head_stride + c * 32);
    const __m512 sv = _mm512_set1_ps(scale);
    __m512 mx[MAX_GROUP];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) mx[g] = _mm512_set1_ps(-INFINITY);
    __m512 part[MAX_GROUP][16];
    __m512bh kv[MAX_DIM / 32] = {0}; /* zero-filled once: see value_pass's pv */
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        int nj = n - j0 < 16 ? (int)(n - j0) : 16;
        for (int jj = 0; jj < 16; ++jj) {
            if (jj >= nj) {
#pragma GCC unroll 16
                for (int g = 0; g < G; ++g) part[g][jj] = _mm512_setzero_ps();
                continue;
            }
            int64_t j = j0 + jj;
            const uint16_t* kr = k + idx[j] * tok_stride;
            if (j + PF_DIST < n) {
                const char* pf = (const char*)(k + idx[j + PF_DIST] * tok_stride);
                for (int b_ = 0; b_ < pf_bytes; b_ += 64) __builtin_prefetch(pf + b_);
            }
#pragma GCC unroll 8
            for (int c = 0; c < C2; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(kr + c * 32);
#pragma GCC unroll 16
            for (int g = 0; g < G; ++g) {
                __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[g * C2], kv[0]);
#pragma GCC unroll 8
                for (int c = 1; c < C2; ++c) s = _mm512_dpbf16_ps(s, qv[g * C2 + c], kv[c]);
                part[g][jj] = s;
            }
        }
        __mmask16 valid = (__mmask16)((1u << nj) - 1u);
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) {
            __m512 sc = _mm512_mul_ps(reduce16(part[g]), sv);
            _mm512_mask_storeu_ps(scores + g * n + j0, valid, sc);
            mx[g] = _mm512_mask_max_ps(mx[g], valid, mx[g], sc);
        }
    }
    float m[MAX_GROUP], l[MAX_GROUP];
    for (int g = 0; g < G; ++g) {
        m[g] = _mm512_reduce_max_ps(mx[g]);
        __m512 mv = _mm512_set1_ps(m[g]);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            int nj = n - j0 < 16 ? (int)(n - j0) : 16;
            __mmask16 valid = (__mmask16)((1u << nj) - 1u);
            __m512 s = _mm512_maskz_loadu_ps(valid, scores + g * n + j0);
            __m512 p = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(s, mv)));
            _mm512_mask_storeu_ps(scores + g * n + j0, valid, p);
            sum = _mm512_add_ps(sum, p);
        }
        l[g] = _mm512_reduce_add_ps(sum);
    }
    value_pass(G, 2 * C2, v, idx, n, tok_stride, pf_bytes, scores, acc);
    for (int g = 0; g < G; ++g) {
        m_out[g] = m[g];
        l_out[g] = l[g];
    }
}

static void block_dp_any(int G, int C2, const uint16_t* q, int64_t q_head_stride,
                         const uint16_t* k, const uint16_t* v, const int64_t* idx, int64_t n,
                         int64_t tok_stride, int pf_bytes, float scale, float* acc, float* m_out,
                         float* l_out, float* scores) {
    /* NOTE: ragged_attention rejects G > MAX_GROUP before any block runs. Saying so here keeps
     * gcc from unrolling this run-time G past MAX_GROUP into copies that index outside `part`
     * (a false -Warray-bounds for code that never runs). */
    if (G > MAX_GROUP) __builtin_unreachable();
    block_dp(G, C2, q, q_head_stride, k, v, idx, n, tok_stride, pf_bytes, scale, acc, m_out,
             l_out, scores);
}

#define BLOCK_DP_CASE(G_, C2_)                                                                 \
    case G_ * 16 + C2_:                                                                        \
        block_dp(G_, C2_, q, q_head_stride, k, v, idx, n, tok_stride, pf_bytes, scale, acc,      \
                 m_out, l_out, scores);                                                        \
        break;

/* pf_bytes: how much of each upcoming token's row to prefetch from k / v: the first kv head
 * fetches the whole row (every head's part) so the other heads, run next on the same thread,
 * find it in cache; whole rows are what the memory system streams well. */
static void block_bf16_dp(const uint16_t* q, int64_t q_head_stride, const uint16_t* k,
                          const uint16_t* v, const int64_t* idx, int64_t n, int64_t tok_stride,
                          int pf_bytes, int G, int D, float scale, float* acc, float* m_out,
                          float* l_out, float* scores) {
    switch (G * 16 + D / 32) {
        BLOCK_DP_CASE(1, 2) BLOCK_DP_CASE(2, 2) BLOCK_DP_CASE(3, 2) BLOCK_DP_CASE(4, 2)
        BLOCK_DP_CASE(5, 2) BLOCK_DP_CASE(6, 2) BLOCK_DP_CASE(1, 4) BLOCK_DP_CASE(2, 4)
        BLOCK_DP_CASE(3, 4)
        default:
            block_dp_any(G, D / 32, q, q_head_stride, k, v, idx, n, tok_stride, pf_bytes, scale,
                         acc, m_out, l_out, scores);
    }
}
#endif
#endif

#include "attention_kvq.h"

/* Keys are processed in blocks of this many tokens, counted from the first visible key, whatever
 * the batch: a query row's result then depends only on its own keys (never on batch size, chunk
 * boundaries or what was cached), which seeded sampling relies on; blocks also keep every core
 * busy for a single long request. */
#define KEY_BLOCK 256

typedef struct {
    int64_t row;    /* query row in q/out */
    int64_t first;  /* offset of the block's first key in `indices` */
    int64_t n;      /* keys in the block */
    int64_t slot;   /* partial-result slot (-1: single block, write the output directly) */
} Task;

static void write_out(void* out, int dtype, int64_t off, const float* o, float inv, int D) {
    if (dtype == 0) {
        float* op = (float*)out + off;
        for (int d = 0; d < D; ++d) op[d] = o[d] * inv;
    } else {
        uint16_t* op = (uint16_t*)out + off;
        for (int d = 0; d < D; ++d) op[d] = f2bf(o[d] * inv);
    }
}

static void run_block(const void* q, int64_t qoff, const void* k, const void* v, int h, int D,
                      const int64_t* idx, int64_t n, int64_t tok_stride, int G, float scale,
                      int dtype, float* acc, float* m, float* l, float* scores) {
#ifdef __AVX512F__
#if defined(__AVX512BF16__)
    if (dtype == 1 && D % 32 == 0) {
        int pf_bytes = h == 0 ? (int)(tok_stride * 2) : D * 2;
        block_bf16_dp((const uint16_t*)q + qoff, D, (const uint16_t*)k + h * D,
                      (const uint16_t*)v + h * D, idx, n, tok_stride, pf_bytes, G, D, scale, acc,
                      m, l, scores);
        return;
    }
#endif
    if (D % 16 == 0) {
        if (dtype == 0)
            block_f32_avx512((const float*)q + qoff, D, (const float*)k + h * D,
                             (const float*)v + h * D, idx, n, tok_stride, G, D, scale, acc, m, l,
                             scores);
        else
            block_bf16_avx512((const uint16_t*)q + qoff, D, (const uint16_t*)k + h * D,
                              (const uint16_t*)v + h * D, idx, n, tok_stride, G, D, scale, acc, m,
                              l, scores);
        return;
    }
#endif
    if (dtype == 0)
        block_f32((const float*)q + qoff, D, (const float*)k + h * D, (const float*)v + h * D, idx,
                  n, tok_stride, G, D, scale, acc, m, l, scores);
    else
        block_bf16((const uint16_t*)q + qoff, D, (const uint16_t*)k + h * D,
                   (const uint16_t*)v + h * D, idx, n, tok_stride, G, D, scale, acc, m, l, scores);
}

/* Causal attention for a ragged batch over the paged KV pool.
 *
 * Request r owns query rows [q_indptr[r], q_indptr[r+1]) of q/out, the first at position
 * q_pos0[r]; its keys' pool slots are indices[kv_indptr[r] + k] for positions k. The query at
 * position p sees keys (p - window, p] (window <= 0: all of [0, p]). Decode is a request with one
 * query row at position seq_len - 1. q: [N, H, D] with row stride q_row_stride; k/v: [S, Hkv, D];
 * out: [N, H, D] contiguous; dtype 0 = float32, 1 = bfloat16 (q and out). kv_dtype: the pool's
 * format (kv_quant.h: the same code as dtype for plain pools, 2 = int8, 3 = fp8 e4m3);
 * k_scale / v_scale: float32 [S, Hkv] per-token, per-head scales, or NULL (scale 1; int8 needs
 * them). Returns 0 on success. */
int ragged_attention(const void* q, int64_t q_row_stride, const void* k, const void* v,
                     const int64_t* indices, const int64_t* kv_indptr, const int64_t* q_indptr,
                     const int64_t* q_pos0, int R, void* out, int H, int Hkv, int D, float scale,
                     int dtype, int64_t window, int kv_dtype, const float* k_scale,
                     const float* v_scale) {
    int G = H / Hkv;
    if (G > MAX_GROUP || D > MAX_DIM || H % Hkv != 0) return -1;
    if (kv_dtype < KV_F32 || kv_dtype > KV_FP8_E4M3 || (kv_dtype == KV_INT8 && !k_scale) ||
        (kv_dtype == KV_INT8 && !v_scale))
        return -3;
    const int mixed = kv_dtype != dtype;
    const int q_bytes = dtype ? 2 : 4;
    int64_t N = q_indptr[R];
    /* plan: one task per (row, key block); rows with several blocks get partial slots */
    int64_t ntasks = 0, nslots = 0;
    for (int r = 0; r < R; ++r)
        for (int64_t i = q_indptr[r]; i < q_indptr[r + 1]; ++i) {
            int64_t p = q_pos0[r] + (i - q_indptr[r]);
            int64_t lo = window > 0 && p + 1 > window ? p + 1 - window : 0;
            int64_t nb = (p + 1 - lo + KEY_BLOCK - 1) / KEY_BLOCK;
            ntasks += nb;
            if (nb > 1) nslots += nb;
        }
    Task* tasks = (Task*)malloc(sizeof(Task) * (ntasks > 0 ? ntasks : 1));
    int64_t* row_slot0 = (int64_t*)malloc(sizeof(int64_t) * (N > 0 ? N : 1));
    int64_t* row_nb = (int64_t*)malloc(sizeof(int64_t) * (N > 0 ? N : 1));
    int64_t per_slot = (int64_t)Hkv * G * (D + 2);
    float* partial = (float*)malloc(sizeof(float) * (nslots > 0 ? nslots * per_slot : 1));
    if (!tasks || !row_slot0 || !row_nb || !partial) {
        free(tasks); free(row_slot0); free(row_nb); free(partial);
        return -2;
    }
    int64_t t = 0, slot = 0;
    for (int r = 0; r < R; ++r)
        for (int64_t i = q_indptr[r]; i < q_indptr[r + 1]; ++i) {
            int64_t p = q_pos0[r] + (i - q_indptr[r]);
            int64_t lo = window > 0 && p + 1 > window ? p + 1 - window : 0;
            int64_t nb = (p + 1 - lo + KEY_BLOCK - 1) / KEY_BLOCK;
            row_nb[i] = nb;
            row_slot0[i] = nb > 1 ? slot : -1;
            for (int64_t b = 0; b < nb; ++b, ++t) {
                int64_t first = lo + b * KEY_BLOCK;
                int64_t last = first + KEY_BLOCK < p + 1 ? first + KEY_BLOCK : p + 1;
                tasks[t].row = i;
                tasks[t].first = kv_indptr[r] + first;
                tasks[t].n = last - first;
                tasks[t].slot = nb > 1 ? slot + b : -1;
            }
            if (nb > 1) slot += nb;
        }
    int64_t tok_stride = (int64_t)Hkv * D;
    int64_t jobs = ntasks * Hkv;
    /* a thread takes every head of a task in turn (the first prefetches whole token rows for the
     * rest) unless there are too few tasks to keep the threads busy */
    int chunk = ntasks >= 2 * (int64_t)omp_get_max_threads() ? Hkv : 1;
#pragma omp parallel
    {
        float* scores = (float*)malloc(sizeof(float) * G * KEY_BLOCK);
        float acc[MAX_GROUP * MAX_DIM], m[MAX_GROUP], l[MAX_GROUP];
#pragma omp for schedule(dynamic, chunk)
        for (int64_t j = 0; j < jobs; ++j) {
            const Task* tk = &tasks[j / Hkv];
            int h = (int)(j % Hkv);
            int64_t qoff = tk->row * q_row_stride + (int64_t)h * G * D;
            if (tk->slot < 0) {
                if (mixed)
                    run_block_kvq((const char*)q + qoff * q_bytes, dtype, k, v, kv_dtype, k_scale,
                                  v_scale, Hkv, h, D, indices + tk->first, tk->n, G, scale, acc,
                                  m, l, scores);
                else
                    run_block(q, qoff, k, v, h, D, indices + tk->first, tk->n, tok_stride, G,
                              scale, dtype, acc, m, l, scores);
                for (int g = 0; g < G; ++g) {
                    float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
                    write_out(out, dtype, (tk->row * H + (int64_t)h * G + g) * D, acc + g * D, inv, D);
                }
            } else {
                float* base = partial + tk->slot * per_slot + (int64_t)h * G * (D + 2);
                if (mixed)
                    run_block_kvq((const char*)q + qoff * q_bytes, dtype, k, v, kv_dtype, k_scale,
                                  v_scale, Hkv, h, D, indices + tk->first, tk->n, G, scale, base,
                                  base + G * D, base + G * D + G, scores);
                else
                    run_block(q, qoff, k, v, h, D, indices + tk->first, tk->n, tok_stride, G,
                              scale, dtype, base, base + G * D, base + G * D + G, scores);
            }
        }
        free(scores);
#pragma omp for schedule(dynamic, 8)
        for (int64_t j = 0; j < N * Hkv; ++j) {
            int64_t i = j / Hkv;
            int h = (int)(j % Hkv);
            if (row_nb[i] <= 1) continue;
            for (int g = 0; g < G; ++g) {
                float mx = -INFINITY;
                for (int64_t b = 0; b < row_nb[i]; ++b) {
                    const float* base = partial + (row_slot0[i] + b) * per_slot + (int64_t)h * G * (D + 2);
                    float mb = base[G * D + g];
                    if (mb > mx) mx = mb;
                }
                float o[MAX_DIM];
                float lsum = 0.f;
                for (int d = 0; d < D; ++d) o[d] = 0.f;
                for (int64_t b = 0; b < row_nb[i]; ++b) {
                    const float* base = partial + (row_slot0[i] + b) * per_slot + (int64_t)h * G * (D + 2);
                    float w = expf(base[G * D + g] - mx);
                    lsum += w * base[G * D + G + g];
                    const float* a = base + g * D;
                    for (int d = 0; d < D; ++d) o[d] += w * a[d];
                }
                float inv = lsum > 0.f ? 1.f / lsum : 0.f;
                write_out(out, dtype, (i * H + (int64_t)h * G + g) * D, o, inv, D);
            }
        }
    }
    free(tasks);
    free(row_slot0);
    free(row_nb);
    free(partial);
    return 0;
}

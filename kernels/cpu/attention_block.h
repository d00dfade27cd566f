/* ragged_attention's AVX-512 key-block kernels for one query row (the G heads of one kv head):
 * included by ragged_attention.c only, which runs them for a task of a single row (decode, a
 * sliding window's rows); attention_rows.h runs the same float operations for many rows.
 * Same contract as the block_* functions of ragged_attention.c.
 */
#ifndef RADIXGEN_ATTENTION_BLOCK_H
#define RADIXGEN_ATTENTION_BLOCK_H

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

#endif /* RADIXGEN_ATTENTION_BLOCK_H */

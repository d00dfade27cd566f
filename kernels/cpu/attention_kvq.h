/* ragged_attention's key blocks over a KV pool stored in another dtype than q (int8 with
 * per-token, per-head scales, fp8 e4m3, or bf16 under a float32 model): included by
 * ragged_attention.c only.
 *
 * Each stored row is decoded in registers as it is read (no dequantized copy of the pool): q.k
 * is summed over the raw values and multiplied by the key's scale afterwards; each softmax
 * weight is multiplied by its value row's scale before the value pass. Same contract as the
 * block_* functions of ragged_attention.c (unnormalised output, running max and sum).
 */
#ifndef RADIXGEN_ATTENTION_KVQ_H
#define RADIXGEN_ATTENTION_KVQ_H

#include <math.h>
#include <stdint.h>

#include "kv_quant.h"

/* q: G heads of D values (q_dtype 0 float32 / 1 bf16) -> qf[g * D + d] = q * scale. */
static inline void kvq_load_q(const void* q, int q_dtype, int G, int D, float scale, float* qf) {
    for (int g = 0; g < G; ++g)
        for (int d = 0; d < D; ++d)
            qf[g * D + d] = (q_dtype ? bf16f(((const uint16_t*)q)[g * D + d])
                                     : ((const float*)q)[g * D + d]) * scale;
}

/* The scale of row idx (1 without a scale tensor). */
static inline float kvq_scale(const float* s, int64_t idx, int64_t Hkv, int h) {
    return s ? s[idx * Hkv + h] : 1.0f;
}

/* Portable version: any kind, any D. k / v point at head h of slot 0. */
static void block_kvq_scalar(const float* qf, const void* k, const void* v, int kind,
                             const float* ks, const float* vs, int64_t Hkv, int h,
                             const int64_t* idx, int64_t n, int64_t tok_stride, int G, int D,
                             float* acc, float* m_out, float* l_out, float* scores) {
    const int eb = kv_elem_bytes(kind);
    for (int g = 0; g < G; ++g) m_out[g] = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
        const char* kr = (const char*)k + idx[j] * tok_stride * eb;
        float sk = kvq_scale(ks, idx[j], Hkv, h);
        for (int g = 0; g < G; ++g) {
            float s = 0.f;
            for (int d = 0; d < D; ++d) s += qf[g * D + d] * kv_load(kr, d, kind);
            s *= sk;
            scores[g * n + j] = s;
            if (s > m_out[g]) m_out[g] = s;
        }
    }
    for (int g = 0; g < G; ++g) {
        float sum = 0.f;
        for (int64_t j = 0; j < n; ++j) {
            float p = expf(scores[g * n + j] - m_out[g]);
            sum += p;
            scores[g * n + j] = p * kvq_scale(vs, idx[j], Hkv, h);
        }
        l_out[g] = sum;
        for (int d = 0; d < D; ++d) acc[g * D + d] = 0.f;
    }
    for (int64_t j = 0; j < n; ++j) {
        const char* vr = (const char*)v + idx[j] * tok_stride * eb;
        for (int g = 0; g < G; ++g) {
            float p = scores[g * n + j];
            for (int d = 0; d < D; ++d) acc[g * D + d] += p * kv_load(vr, d, kind);
        }
    }
}

#ifdef __AVX512F__
/* D a multiple of 16: 16 keys at a time, each key row decoded once for all G heads and the 16
 * dot products per head summed by reduce16 (ragged_attention.c), then scaled by the 16 keys'
 * scales in one multiply. */
#define DEFINE_BLOCK_KVQ(NAME, T, LOAD16)                                                      \
static inline __attribute__((always_inline)) void NAME##_body(                                \
    const int G, const int C, const float* qf, const T* k, const T* v, const float* ks,       \
    const float* vs, int64_t Hkv, int h, const int64_t* idx, int64_t n, int64_t tok_stride,   \
    float* acc, float* m_out, float* l_out, float* scores) {                                  \
    const int D = C * 16;                                                                     \
    const int pf_bytes = h == 0 ? (int)(tok_stride * sizeof(T)) : D * (int)sizeof(T);         \
    __m512 qv[MAX_GROUP * (MAX_DIM / 16)];                                                    \
    _Pragma("GCC unroll 64") for (int i = 0; i < G * C; ++i) qv[i] = _mm512_loadu_ps(qf + i * 16); \
    __m512 mx[MAX_GROUP];                                                                     \
    for (int g = 0; g < G; ++g) mx[g] = _mm512_set1_ps(-INFINITY);                            \
    __m512 part[MAX_GROUP][16];                                                               \
    float sk[16];                                                                             \
    /* NOTE: zero-filled once, outside the loops (see value_pass in ragged_attention.c) */    \
    __m512 kv[MAX_DIM / 16] = {0};                                                            \
    __m512 pv[MAX_GROUP] = {0};                                                               \
    for (int64_t j0 = 0; j0 < n; j0 += 16) {                                                  \
        int nj = n - j0 < 16 ? (int)(n - j0) : 16;                                            \
        for (int jj = 0; jj < 16; ++jj) {                                                     \
            if (jj >= nj) {                                                                   \
                sk[jj] = 0.f;                                                                 \
                for (int g = 0; g < G; ++g) part[g][jj] = _mm512_setzero_ps();                \
                continue;                                                                     \
            }                                                                                 \
            int64_t j = j0 + jj;                                                              \
            const T* kr = k + idx[j] * tok_stride;                                            \
            sk[jj] = kvq_scale(ks, idx[j], Hkv, h);                                           \
            if (j + 16 < n) {                                                                 \
                const char* pf = (const char*)(k + idx[j + 16] * tok_stride);                 \
                for (int b_ = 0; b_ < pf_bytes; b_ += 64) __builtin_prefetch(pf + b_);        \
            }                                                                                 \
            _Pragma("GCC unroll 16") for (int c = 0; c < C; ++c) kv[c] = LOAD16(kr + c * 16); \
            _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g) {                            \
                __m512 s = _mm512_mul_ps(qv[g * C], kv[0]);                                   \
                _Pragma("GCC unroll 16") for (int c = 1; c < C; ++c)                          \
                    s = _mm512_fmadd_ps(qv[g * C + c], kv[c], s);                             \
                part[g][jj] = s;                                                              \
            }                                                                                 \
        }                                                                                     \
        __mmask16 valid = (__mmask16)((1u << nj) - 1u);                                       \
        __m512 skv = _mm512_loadu_ps(sk);                                                     \
        for (int g = 0; g < G; ++g) {                                                         \
            __m512 sc = _mm512_mul_ps(reduce16(part[g]), skv);                                \
            _mm512_mask_storeu_ps(scores + g * n + j0, valid, sc);                            \
            mx[g] = _mm512_mask_max_ps(mx[g], valid, mx[g], sc);                              \
        }                                                                                     \
    }                                                                                         \
    for (int g = 0; g < G; ++g) {                                                             \
        m_out[g] = _mm512_reduce_max_ps(mx[g]);                                               \
        __m512 mv = _mm512_set1_ps(m_out[g]);                                                 \
        __m512 sum = _mm512_setzero_ps();                                                     \
        for (int64_t j0 = 0; j0 < n; j0 += 16) {                                              \
            int nj = n - j0 < 16 ? (int)(n - j0) : 16;                                        \
            __mmask16 valid = (__mmask16)((1u << nj) - 1u);                                   \
            __m512 s = _mm512_maskz_loadu_ps(valid, scores + g * n + j0);                     \
            __m512 p = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(s, mv)));              \
            sum = _mm512_add_ps(sum, p);                                                      \
            _mm512_mask_storeu_ps(scores + g * n + j0, valid, p);                             \
        }                                                                                     \
        l_out[g] = _mm512_reduce_add_ps(sum);                                                 \
    }                                                                                         \
    __m512 av[MAX_GROUP * (MAX_DIM / 16)];                                                    \
    _Pragma("GCC unroll 64") for (int i = 0; i < G * C; ++i) av[i] = _mm512_setzero_ps();     \
    for (int64_t j = 0; j < n; ++j) {                                                         \
        const T* vr = v + idx[j] * tok_stride;                                                \
        if (j + 16 < n) {                                                                     \
            const char* pf = (const char*)(v + idx[j + 16] * tok_stride);                     \
            for (int b_ = 0; b_ < pf_bytes; b_ += 64) __builtin_prefetch(pf + b_);            \
        }                                                                                     \
        float sv = kvq_scale(vs, idx[j], Hkv, h);                                             \
        _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g)                                  \
            pv[g] = _mm512_set1_ps(scores[g * n + j] * sv);                                   \
        _Pragma("GCC unroll 16") for (int c = 0; c < C; ++c) {                                \
            __m512 vv = LOAD16(vr + c * 16);                                                  \
            _Pragma("GCC unroll 16") for (int g = 0; g < G; ++g)                              \
                av[g * C + c] = _mm512_fmadd_ps(pv[g], vv, av[g * C + c]);                    \
        }                                                                                     \
    }                                                                                         \
    for (int i = 0; i < G * C; ++i) _mm512_storeu_ps(acc + i * 16, av[i]);                    \
}                                                                                             \
static void NAME(const float* qf, const T* k, const T* v, const float* ks, const float* vs,   \
                 int64_t Hkv, int h, const int64_t* idx, int64_t n, int64_t tok_stride, int G, \
                 int D, float* acc, float* m_out, float* l_out, float* scores) {              \
    if (G > MAX_GROUP) __builtin_unreachable(); /* checked by ragged_attention */              \
    switch (G * 16 + D / 16) {                                                                \
        KVQ_CASE(NAME, 1, 4) KVQ_CASE(NAME, 2, 4) KVQ_CASE(NAME, 3, 4) KVQ_CASE(NAME, 4, 4)    \
        KVQ_CASE(NAME, 6, 4) KVQ_CASE(NAME, 1, 8) KVQ_CASE(NAME, 2, 8) KVQ_CASE(NAME, 3, 8)    \
        default:                                                                              \
            NAME##_body(G, D / 16, qf, k, v, ks, vs, Hkv, h, idx, n, tok_stride, acc, m_out,  \
                        l_out, scores);                                                       \
    }                                                                                         \
}
#define KVQ_CASE(NAME, G_, C_)                                                                \
    case G_ * 16 + C_:                                                                        \
        NAME##_body(G_, C_, qf, k, v, ks, vs, Hkv, h, idx, n, tok_stride, acc, m_out, l_out,  \
                    scores);                                                                  \
        break;
DEFINE_BLOCK_KVQ(block_kvq_bf16, uint16_t, load16_bf16)
DEFINE_BLOCK_KVQ(block_kvq_i8, int8_t, load16_i8)
DEFINE_BLOCK_KVQ(block_kvq_fp8, uint8_t, load16_fp8)
#endif /* __AVX512F__ */

#include "attention_simd.h"

/* One (row, kv head, key block) task over a pool stored as `kind` (not q's dtype). */
static void run_block_kvq(const void* q, int q_dtype, const void* k, const void* v, int kind,
                          const float* ks, const float* vs, int64_t Hkv, int h, int D,
                          const int64_t* idx, int64_t n, int G, float scale, float* acc,
                          float* m, float* l, float* scores) {
#if defined(SIMD_W) && !defined(__AVX512F__)
    if (D % SIMD_W == 0) {
        block_simd(q, q_dtype, k, v, kind, ks, vs, Hkv, h, D, idx, n, G, scale, acc, m, l,
                   scores);
        return;
    }
#endif
    float qf[MAX_GROUP * MAX_DIM];
    kvq_load_q(q, q_dtype, G, D, scale, qf);
    const int64_t tok_stride = Hkv * D;
    const int64_t off = (int64_t)h * D;
#ifdef __AVX512F__
    if (D % 16 == 0) {
        if (kind == KV_INT8)
            block_kvq_i8(qf, (const int8_t*)k + off, (const int8_t*)v + off, ks, vs, Hkv, h, idx,
                         n, tok_stride, G, D, acc, m, l, scores);
        else if (kind == KV_FP8_E4M3)
            block_kvq_fp8(qf, (const uint8_t*)k + off, (const uint8_t*)v + off, ks, vs, Hkv, h,
                          idx, n, tok_stride, G, D, acc, m, l, scores);
        else if (kind == KV_BF16)
            block_kvq_bf16(qf, (const uint16_t*)k + off, (const uint16_t*)v + off, ks, vs, Hkv,
                           h, idx, n, tok_stride, G, D, acc, m, l, scores);
        if (kind != KV_F32) return;
    }
#endif
    const int eb = kv_elem_bytes(kind);
    block_kvq_scalar(qf, (const char*)k + off * eb, (const char*)v + off * eb, kind, ks, vs, Hkv,
                     h, idx, n, tok_stride, G, D, acc, m, l, scores);
}

#endif /* RADIXGEN_ATTENTION_KVQ_H */

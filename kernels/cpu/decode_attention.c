/* Decode attention over a paged KV pool, for CPUs (compiled at first use by kernels/cpu/__init__.py).
 *
 * Each request attends with its one new query token to the KV slots listed for it in a CSR
 * (indices, indptr). Keys and values are read in place from the pool (no gather copy). Work is
 * split over (request, kv-head) pairs, and over key blocks when there are fewer pairs than
 * threads, so a single long request still uses every core; partial results merge by log-sum-exp.
 * Accumulation is float32 whatever the storage dtype (float32 or bfloat16).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

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
#define LOAD_BF16(x) bf16_to_f32(x)
DEFINE_BLOCK(block_f32, float, LOAD_F32)
DEFINE_BLOCK(block_bf16, uint16_t, LOAD_BF16)

#ifdef __AVX512F__
#include <immintrin.h>

static inline __m512 load16_bf16(const uint16_t* p) {
    __m256i raw = _mm256_loadu_si256((const __m256i*)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
static inline __m512 load16_f32(const float* p) { return _mm512_loadu_ps(p); }

/* Same contract as block_*; D must be a multiple of 16 (every common head size). The group's
 * queries stay in registers; each key/value row is converted once and used by all G heads. */
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
    float m[MAX_GROUP];                                                                       \
    for (int g = 0; g < G; ++g) m[g] = -INFINITY;                                             \
    for (int64_t j = 0; j < n; ++j) {                                                         \
        const T* kr = k + idx[j] * tok_stride;                                                \
        if (j + 8 < n) {                                                                      \
            const char* pf = (const char*)(k + idx[j + 8] * tok_stride);                      \
            for (int b_ = 0; b_ < D * (int)sizeof(T); b_ += 64) __builtin_prefetch(pf + b_);   \
        }                                                                                     \
        __m512 kv[MAX_DIM / 16];                                                              \
        for (int c = 0; c < C; ++c) kv[c] = LOAD16(kr + c * 16);                              \
        for (int g = 0; g < G; ++g) {                                                         \
            __m512 s = _mm512_mul_ps(qv[g * C], kv[0]);                                       \
            for (int c = 1; c < C; ++c) s = _mm512_fmadd_ps(qv[g * C + c], kv[c], s);         \
            float sc = _mm512_reduce_add_ps(s);                                               \
            scores[g * n + j] = sc;                                                           \
            if (sc > m[g]) m[g] = sc;                                                         \
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
#endif

/* q: [B, H, D] with row stride q_row_stride (elements); k/v: pool [S, Hkv, D] contiguous;
 * out: [B, H, D] contiguous. dtype: 0 = float32, 1 = bfloat16. Returns 0 on success. */
int decode_attention(const void* q, int64_t q_row_stride, const void* k, const void* v,
                     const int64_t* indices, const int64_t* indptr, void* out, int B, int H,
                     int Hkv, int D, float scale, int dtype, int64_t max_len) {
    int G = H / Hkv;
    if (G > MAX_GROUP || D > MAX_DIM || H % Hkv != 0) return -1;
    int threads = omp_get_max_threads();
    int pairs = B * Hkv;
    /* Split keys into blocks when there are too few (request, head) pairs to feed every thread. */
    int64_t block = max_len;
    if (pairs < 2 * threads && max_len > 256) {
        int64_t want = (int64_t)(2 * threads + pairs - 1) / pairs;
        block = (max_len + want - 1) / want;
        if (block < 128) block = 128;
    }
    int64_t nblocks_max = (max_len + block - 1) / block;
    int64_t tasks = (int64_t)pairs * nblocks_max;
    float* acc = (float*)malloc(sizeof(float) * tasks * G * D);
    float* ms = (float*)malloc(sizeof(float) * tasks * G);
    float* ls = (float*)malloc(sizeof(float) * tasks * G);
    if (!acc || !ms || !ls) { free(acc); free(ms); free(ls); return -2; }
    int64_t tok_stride = (int64_t)Hkv * D;
#pragma omp parallel
    {
        float* scores = (float*)malloc(sizeof(float) * G * block);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
            int64_t pair = t / nblocks_max, blk = t % nblocks_max;
            int b = (int)(pair / Hkv), h = (int)(pair % Hkv);
            int64_t start = indptr[b] + blk * block, end = indptr[b + 1];
            float* m_t = ms + t * G;
            if (start >= end) { for (int g = 0; g < G; ++g) m_t[g] = -INFINITY; continue; }
            int64_t n = end - start < block ? end - start : block;
            int64_t qoff = (int64_t)b * q_row_stride + (int64_t)h * G * D;
#ifdef __AVX512F__
            if (D % 16 == 0) {
                if (dtype == 0)
                    block_f32_avx512((const float*)q + qoff, D, (const float*)k + h * D,
                                     (const float*)v + h * D, indices + start, n, tok_stride, G, D,
                                     scale, acc + t * G * D, m_t, ls + t * G, scores);
                else
                    block_bf16_avx512((const uint16_t*)q + qoff, D, (const uint16_t*)k + h * D,
                                      (const uint16_t*)v + h * D, indices + start, n, tok_stride, G,
                                      D, scale, acc + t * G * D, m_t, ls + t * G, scores);
                continue;
            }
#endif
            if (dtype == 0)
                block_f32((const float*)q + qoff, D, (const float*)k + h * D, (const float*)v + h * D,
                          indices + start, n, tok_stride, G, D, scale, acc + t * G * D, m_t,
                          ls + t * G, scores);
            else
                block_bf16((const uint16_t*)q + qoff, D, (const uint16_t*)k + h * D,
                           (const uint16_t*)v + h * D, indices + start, n, tok_stride, G, D, scale,
                           acc + t * G * D, m_t, ls + t * G, scores);
        }
        free(scores);
#pragma omp for
        for (int64_t pair = 0; pair < pairs; ++pair) {
            int b = (int)(pair / Hkv), h = (int)(pair % Hkv);
            for (int g = 0; g < G; ++g) {
                float m = -INFINITY;
                for (int64_t blk = 0; blk < nblocks_max; ++blk) {
                    float mb = ms[(pair * nblocks_max + blk) * G + g];
                    if (mb > m) m = mb;
                }
                float o[MAX_DIM];
                float l = 0.f;
                for (int d = 0; d < D; ++d) o[d] = 0.f;
                for (int64_t blk = 0; blk < nblocks_max; ++blk) {
                    int64_t t = pair * nblocks_max + blk;
                    float mb = ms[t * G + g];
                    if (mb == -INFINITY) continue;
                    float w = expf(mb - m);
                    l += w * ls[t * G + g];
                    const float* a = acc + (t * G + g) * D;
                    for (int d = 0; d < D; ++d) o[d] += w * a[d];
                }
                float inv = l > 0.f ? 1.f / l : 0.f;
                int64_t ooff = ((int64_t)b * H + (int64_t)h * G + g) * D;
                if (dtype == 0) {
                    float* op = (float*)out + ooff;
                    for (int d = 0; d < D; ++d) op[d] = o[d] * inv;
                } else {
                    uint16_t* op = (uint16_t*)out + ooff;
                    for (int d = 0; d < D; ++d) op[d] = f32_to_bf16(o[d] * inv);
                }
            }
        }
    }
    free(acc);
    free(ms);
    free(ls);
    return 0;
}

/* Fused elementwise kernels for the decoder layer on CPUs (compiled with ragged_attention.c).
 *
 * Each replaces a chain of small torch ops whose per-op dispatch cost dominates a decode step
 * at small batch sizes. Every output element is computed from its own row only, with the same
 * roundings as the torch/Hugging Face reference (bf16 after each op where they round), so rows
 * stay batch-invariant. dtype: 0 = float32, 1 = bfloat16 for the activations and weights.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#include "cpu_common.h"
#include "kv_quant.h"
#include "radixgen_kernels.h"
#include "simd.h"

static inline float load(const void* p, int64_t i, int dtype) {
    return dtype ? bf16f(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

static inline void store(void* p, int64_t i, float v, int dtype) {
    if (dtype)
        ((uint16_t*)p)[i] = f2bf(v);
    else
        ((float*)p)[i] = v;
}

#define PAR_MIN_ELEMS 65536

/* residual (float32, [N, H]) += x (dtype, may be NULL); out = (norm(residual) rounded) * w.
 * The norm is x / sqrt(mean(x^2) + eps) in float32, as F.rms_norm on a float32 tensor. */
#ifdef __AVX512F__
/* One row of add_rmsnorm, 16 lanes at a time (H a multiple of 16). The sum of squares is kept in
 * float64 lanes and reduced in a fixed order, so the row's result does not depend on the batch. */
static void add_rmsnorm_row16(const void* x, float* r, const void* weight, void* out, int64_t H,
                              float eps, int dtype, int x_dtype) {
    __m512d ss0 = _mm512_setzero_pd(), ss1 = _mm512_setzero_pd();
    for (int64_t h = 0; h < H; h += 16) {
        __m512 v = _mm512_loadu_ps(r + h);
        if (x) {
            v = _mm512_add_ps(v, x_dtype ? load16_bf16((const uint16_t*)x + h)
                                         : _mm512_loadu_ps((const float*)x + h));
            _mm512_storeu_ps(r + h, v);
        }
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        ss0 = _mm512_fmadd_pd(lo, lo, ss0);
        ss1 = _mm512_fmadd_pd(hi, hi, ss1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(ss0, ss1));
    __m512 inv = _mm512_set1_ps(1.0f / sqrtf((float)(ss / (double)H) + eps));
    for (int64_t h = 0; h < H; h += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(r + h), inv);
        if (dtype) {
            v = _mm512_mul_ps(round16_bf16(v), load16_bf16((const uint16_t*)weight + h));
            store16_bf16((uint16_t*)out + h, v);
        } else {
            _mm512_storeu_ps((float*)out + h, _mm512_mul_ps(v, _mm512_loadu_ps((const float*)weight + h)));
        }
    }
}
#elif defined(SIMD_W)
/* One row of add_rmsnorm over simd.h (H a multiple of SIMD_W): the AVX-512 row's arithmetic at
 * this width (float64 sum of squares reduced in a fixed order, so batch-invariant). */
static void add_rmsnorm_row_simd(const void* x, float* r, const void* weight, void* out,
                                 int64_t H, float eps, int dtype, int x_dtype) {
    vd ss0 = vd_zero(), ss1 = vd_zero();
    for (int64_t h = 0; h < H; h += SIMD_W) {
        vf v = vf_load(r + h);
        if (x) {
            v = vf_add(v, x_dtype ? vf_load_bf16((const uint16_t*)x + h)
                                  : vf_load((const float*)x + h));
            vf_store(r + h, v);
        }
        vd_sqacc(v, &ss0, &ss1);
    }
    double ss = vd_hsum2(ss0, ss1);
    vf inv = vf_set1(1.0f / sqrtf((float)(ss / (double)H) + eps));
    for (int64_t h = 0; h < H; h += SIMD_W) {
        vf v = vf_mul(vf_load(r + h), inv);
        if (dtype)
            vf_store_bf16((uint16_t*)out + h,
                          vf_mul(vf_round_bf16(v), vf_load_bf16((const uint16_t*)weight + h)));
        else
            vf_store((float*)out + h, vf_mul(v, vf_load((const float*)weight + h)));
    }
}
#endif

/* residual (float32, [N, H]) += x (x_dtype, may be NULL); out = (norm(residual) rounded) * w
 * (dtype). The norm is x / sqrt(mean(x^2) + eps) in float32, as F.rms_norm on float32. */
void add_rmsnorm(const void* x, float* residual, const void* weight, void* out, int64_t N,
                 int64_t H, float eps, int dtype, int x_dtype) {
#pragma omp parallel for if (N * H >= PAR_MIN_ELEMS) schedule(static) num_threads(team_threads())
    for (int64_t n = 0; n < N; ++n) {
        float* r = residual + n * H;
        const void* xr = x ? (const char*)x + n * H * (x_dtype ? 2 : 4) : NULL;
        void* o = (char*)out + n * H * (dtype ? 2 : 4);
#ifdef __AVX512F__
        if (H % 16 == 0) {
            add_rmsnorm_row16(xr, r, weight, o, H, eps, dtype, x_dtype);
            continue;
        }
#elif defined(SIMD_W)
        if (H % SIMD_W == 0) {
            add_rmsnorm_row_simd(xr, r, weight, o, H, eps, dtype, x_dtype);
            continue;
        }
#endif
        if (xr)
            for (int64_t h = 0; h < H; ++h) r[h] += load(xr, h, x_dtype);
        double ss = 0.0;
        for (int64_t h = 0; h < H; ++h) ss += (double)r[h] * r[h];
        float inv = 1.0f / sqrtf((float)(ss / (double)H) + eps);
        for (int64_t h = 0; h < H; ++h) {
            float v = r[h] * inv;
            if (dtype) v = rbf(v);
            store(o, h, v * load(weight, h, dtype), dtype);
        }
    }
}

/* qkv: [N, (H + 2 Hkv) * D] rows (row stride qkv_stride) in in_dtype. Rotates q (half-split /
 * NeoX layout) into q_out [N, H, D]; rotates k and copies v into the pools at slot loc[n]
 * ([S, Hkv, D]); q in dtype. cos/sin: float32 tables [max_pos, D]. bf16 in and out: the
 * tables are rounded first, and each product and the sum are rounded, as
 * `x * cos + rotate_half(x) * sin` in bf16; float32 in (an unrounded projection): the rotation
 * is float32 and each output is rounded once. kv_dtype: the pools' format (kv_quant.h); another
 * one than dtype stores each k / v head row as it would be in dtype, then converted (int8: with
 * its scale at k_scale / v_scale[loc[n] * Hkv + head]; fp8: scaled too when they are given). */
void rope_store_kv(const void* qkv, int64_t qkv_stride, const int64_t* pos, const float* cos_t,
                   const float* sin_t, void* q_out, void* k_pool, void* v_pool,
                   const int64_t* loc, int64_t N, int H, int Hkv, int D, int dtype,
                   int in_dtype, int kv_dtype, float* k_scale, float* v_scale) {
    const int bf16_math = dtype && in_dtype; /* round as torch does in bf16 */
    const int convert = kv_dtype != dtype;   /* a KV format other than the model dtype */
    int half = D / 2;
#pragma omp parallel for if (N * (H + 2 * Hkv) * D >= PAR_MIN_ELEMS) schedule(static) num_threads(team_threads())
    for (int64_t n = 0; n < N; ++n) {
        const float* c = cos_t + pos[n] * D;
        const float* s = sin_t + pos[n] * D;
        int64_t base = n * qkv_stride;
        float row[1024]; /* one head's values before conversion (D <= 1024) */
        for (int head = 0; head < H + Hkv; ++head) {
            int64_t src = base + (int64_t)head * D;
            void* dst;
            int64_t doff;
            float* tmp = NULL; /* set: write floats here, converted into the pool below */
            if (head < H) {
                dst = q_out;
                doff = (n * H + head) * (int64_t)D;
            } else {
                dst = k_pool;
                doff = (loc[n] * Hkv + (head - H)) * (int64_t)D;
                if (convert) tmp = row;
            }
            int d = 0;
            /* every variant's vector path (simd.h maps AVX-512F onto the same intrinsics the
             * AVX-512 code used) */
#if defined(SIMD_W)
            if (half % SIMD_W == 0) {
                for (; d < D; d += SIMD_W) {
                    int partner = d < half ? d + half : d - half;
                    vf xv, pv;
                    if (in_dtype) {
                        xv = vf_load_bf16((const uint16_t*)qkv + src + d);
                        pv = vf_load_bf16((const uint16_t*)qkv + src + partner);
                    } else {
                        xv = vf_load((const float*)qkv + src + d);
                        pv = vf_load((const float*)qkv + src + partner);
                    }
                    vf rot = d < half ? vf_sub(vf_zero(), pv) : pv;
                    vf cv = vf_load(c + d), sv = vf_load(s + d);
                    if (bf16_math) {
                        vf a = vf_round_bf16(vf_mul(xv, vf_round_bf16(cv)));
                        vf b = vf_round_bf16(vf_mul(rot, vf_round_bf16(sv)));
                        if (tmp)
                            vf_store(tmp + d, vf_round_bf16(vf_add(a, b)));
                        else
                            vf_store_bf16((uint16_t*)dst + doff + d, vf_add(a, b));
                    } else {
                        vf o = vf_fma(xv, cv, vf_mul(rot, sv));
                        if (tmp)
                            vf_store(tmp + d, dtype ? vf_round_bf16(o) : o);
                        else if (dtype)
                            vf_store_bf16((uint16_t*)dst + doff + d, o);
                        else
                            vf_store((float*)dst + doff + d, o);
                    }
                }
            }
#endif
            for (; d < D; ++d) {
                float xv = load(qkv, src + d, in_dtype);
                float rot = d < half ? -load(qkv, src + d + half, in_dtype)
                                     : load(qkv, src + d - half, in_dtype);
                float cv = c[d], sv = s[d];
                float out;
                if (bf16_math) {
                    out = rbf(xv * rbf(cv)) + rbf(rot * rbf(sv));
                } else {
                    out = xv * cv + rot * sv;
                }
                if (tmp)
                    tmp[d] = dtype ? rbf(out) : out;
                else
                    store(dst, doff + d, out, dtype);
            }
            if (tmp)
                kv_store_row(tmp, D, kv_dtype, k_pool, doff, k_scale, loc[n] * Hkv + (head - H));
        }
        int64_t vsrc = base + (int64_t)(H + Hkv) * D;
        int64_t vdst = loc[n] * Hkv * (int64_t)D;
        if (convert) {
            for (int hh = 0; hh < Hkv; ++hh) {
                for (int d = 0; d < D; ++d) {
                    float x = load(qkv, vsrc + (int64_t)hh * D + d, in_dtype);
                    row[d] = dtype ? rbf(x) : x;
                }
                kv_store_row(row, D, kv_dtype, v_pool, vdst + (int64_t)hh * D, v_scale,
                             loc[n] * Hkv + hh);
            }
        } else if (in_dtype == dtype) {
            size_t bytes = (size_t)Hkv * D * (dtype ? 2 : 4);
            memcpy((char*)v_pool + vdst * (dtype ? 2 : 4), (const char*)qkv + vsrc * (dtype ? 2 : 4), bytes);
        } else {
            for (int64_t e = 0; e < (int64_t)Hkv * D; ++e)
                store(v_pool, vdst + e, load(qkv, vsrc + e, in_dtype), dtype);
        }
    }
}

/* gate_up: [N, 2 I] (gate then up) in in_dtype; out: [N, I] = silu(gate) * up in dtype. bf16 in
 * and out rounds after each op, as torch in bf16; float32 in rounds the product once. */
void silu_mul(const void* gate_up, void* out, int64_t N, int64_t I, int dtype, int in_dtype) {
    const int bf16_math = dtype && in_dtype;
#pragma omp parallel for if (N * I >= PAR_MIN_ELEMS) schedule(static) num_threads(team_threads())
    for (int64_t n = 0; n < N; ++n) {
        int64_t i = 0;
#ifdef __AVX512F__
        const __m512 one = _mm512_set1_ps(1.0f);
        for (; i + 16 <= I; i += 16) {
            int64_t gi = n * 2 * I + i, ui = gi + I, oi = n * I + i;
            __m512 g, u;
            if (in_dtype) {
                g = load16_bf16((const uint16_t*)gate_up + gi);
                u = load16_bf16((const uint16_t*)gate_up + ui);
            } else {
                g = _mm512_loadu_ps((const float*)gate_up + gi);
                u = _mm512_loadu_ps((const float*)gate_up + ui);
            }
            __m512 a = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
            if (bf16_math)
                store16_bf16((uint16_t*)out + oi, _mm512_mul_ps(round16_bf16(a), u));
            else if (dtype)
                store16_bf16((uint16_t*)out + oi, _mm512_mul_ps(a, u));
            else
                _mm512_storeu_ps((float*)out + oi, _mm512_mul_ps(a, u));
        }
#elif defined(SIMD_W)
        const vf one = vf_set1(1.0f);
        for (; i + SIMD_W <= I; i += SIMD_W) {
            int64_t gi = n * 2 * I + i, ui = gi + I, oi = n * I + i;
            vf g, u;
            if (in_dtype) {
                g = vf_load_bf16((const uint16_t*)gate_up + gi);
                u = vf_load_bf16((const uint16_t*)gate_up + ui);
            } else {
                g = vf_load((const float*)gate_up + gi);
                u = vf_load((const float*)gate_up + ui);
            }
            vf a = vf_div(g, vf_add(one, vf_exp(vf_sub(vf_zero(), g))));
            if (bf16_math)
                vf_store_bf16((uint16_t*)out + oi, vf_mul(vf_round_bf16(a), u));
            else if (dtype)
                vf_store_bf16((uint16_t*)out + oi, vf_mul(a, u));
            else
                vf_store((float*)out + oi, vf_mul(a, u));
        }
#endif
        for (; i < I; ++i) {
            float g = load(gate_up, n * 2 * I + i, in_dtype);
            float u = load(gate_up, n * 2 * I + I + i, in_dtype);
            float a = g / (1.0f + expf(-g));
            if (bf16_math) a = rbf(a);
            store(out, n * I + i, a * u, dtype);
        }
    }
}

/* Float32 dot product of a bf16 hidden row with a bf16 weight row, in index order. */
static float exact_dot(const uint16_t* h, const uint16_t* w, int64_t H) {
    float acc = 0.f;
    for (int64_t k = 0; k < H; ++k) acc += bf16f(h[k]) * bf16f(w[k]);
    return acc;
}

/* A bf16 logit carries 8 significant bits: every token within two bf16 ulps of the row maximum
 * may truly be the maximum. These helpers re-score exactly those candidates as float32 dot
 * products of the row's hidden state [*, H] with the token's weight row [V, H]. */
static inline float near_max_tolerance(float mx) { return fabsf(mx) * (2.0f / 128.0f) + 1e-6f; }

/* Token v is allowed by a packed grammar bitmask row of W int32 words (NULL: every token). */
static inline int allowed(const int32_t* mask, int64_t W, int64_t v) {
    if (!mask) return 1;
    int64_t w = v >> 5;
    return w < W && ((uint32_t)mask[w] >> (v & 31)) & 1u;
}

#ifdef __AVX512F__
/* The 16 mask bits of tokens v .. v + 15 (v a multiple of 16). */
static inline __mmask16 allowed16(const int32_t* mask, int64_t W, int64_t v) {
    if (!mask) return 0xffff;
    int64_t w = v >> 5;
    return w < W ? (__mmask16)(((uint32_t)mask[w] >> (v & 31)) & 0xffffu) : 0;
}
#elif defined(SIMD_W)
/* The mask bits of tokens v .. v + SIMD_W - 1 (v a multiple of SIMD_W), as lanes. */
static inline vm allowed_w(const int32_t* mask, int64_t W, int64_t v) {
    if (!mask) return vm_from_bits((1u << SIMD_W) - 1u);
    int64_t w = v >> 5;
    return vm_from_bits(w < W ? ((uint32_t)mask[w] >> (v & 31)) & ((1u << SIMD_W) - 1u) : 0u);
}
#endif

/* Largest allowed value of a bf16 row (-inf if none is allowed). */
static float row_max_bf16(const uint16_t* row, int64_t V, const int32_t* mask, int64_t W) {
    float mx = -INFINITY;
    int64_t v = 0;
#ifdef __AVX512F__
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (; v + 16 <= V; v += 16)
        m = _mm512_mask_max_ps(m, allowed16(mask, W, v), m, load16_bf16(row + v));
    mx = _mm512_reduce_max_ps(m);
#elif defined(SIMD_W)
    vf m = vf_set1(-INFINITY);
    const vf ninf = m;
    for (; v + SIMD_W <= V; v += SIMD_W)
        m = vf_max(m, mask ? vf_select(allowed_w(mask, W, v), vf_load_bf16(row + v), ninf)
                           : vf_load_bf16(row + v));
    mx = vf_hmax(m);
#endif
    for (; v < V; ++v) {
        float x = bf16f(row[v]);
        if (x > mx && allowed(mask, W, v)) mx = x;
    }
    return mx;
}

/* Greedy choice over bf16 logits [M, V] (row stride ld) after re-scoring: the best allowed
 * candidate (lowest id on ties). rows: which logits rows; hidden rows follow the same indices.
 * masks: NULL, or R packed grammar bitmask rows of W words (row r for rows[r]); a row that allows
 * nothing yields token 0, as an argmax over all -inf logits does. */
void greedy_refine_bf16(const uint16_t* logits, int64_t ld, const uint16_t* hidden,
                        const uint16_t* weight, const int64_t* rows, int64_t R, int64_t V,
                        int64_t H, const int32_t* masks, int64_t W, int64_t* out_ids) {
#pragma omp parallel for if (R >= 4) schedule(static) num_threads(team_threads())
    for (int64_t r = 0; r < R; ++r) {
        const uint16_t* row = logits + rows[r] * ld;
        const int32_t* mask = masks ? masks + r * W : NULL;
        float mx = row_max_bf16(row, V, mask, W);
        float floor_ = mx - near_max_tolerance(mx);
        float best = -INFINITY;
        int64_t best_id = 0;
        int64_t v = 0;
#ifdef __AVX512F__
        /* Candidates are rare: test 16 logits at once and visit only the lanes at the floor. */
        __m512 fl = _mm512_set1_ps(floor_);
        for (; v + 16 <= V; v += 16) {
            __mmask16 hit = _mm512_mask_cmp_ps_mask(allowed16(mask, W, v), load16_bf16(row + v),
                                                    fl, _CMP_GE_OQ);
            while (hit) {
                int lane = __builtin_ctz(hit);
                hit &= hit - 1;
                float x = exact_dot(hidden + rows[r] * H, weight + (v + lane) * H, H);
                if (x > best) {
                    best = x;
                    best_id = v + lane;
                }
            }
        }
#elif defined(SIMD_W)
        const vf fl = vf_set1(floor_);
        for (; v + SIMD_W <= V; v += SIMD_W) {
            vm ge = vf_ge(vf_load_bf16(row + v), fl);
            uint32_t hit = vm_bits(mask ? vm_and(allowed_w(mask, W, v), ge) : ge);
            while (hit) {
                int lane = __builtin_ctz(hit);
                hit &= hit - 1;
                float x = exact_dot(hidden + rows[r] * H, weight + (v + lane) * H, H);
                if (x > best) {
                    best = x;
                    best_id = v + lane;
                }
            }
        }
#endif
        for (; v < V; ++v) {
            if (bf16f(row[v]) < floor_ || !allowed(mask, W, v)) continue;
            float x = exact_dot(hidden + rows[r] * H, weight + v * H, H);
            if (x > best) {
                best = x;
                best_id = v;
            }
        }
        out_ids[r] = best_id;
    }
}

/* Greedy choice over exact float32 logits [*, V] (row stride ld; a quantized LM head's): the
 * first allowed maximum of each given row, as torch's argmax over the row with the disallowed
 * tokens at -inf (a row whose allowed values are all -inf, or that allows nothing, yields 0;
 * a NaN wins, the first one). rows: NULL for rows 0 .. R-1; masks as greedy_refine_bf16's. */
void argmax_f32(const float* logits, int64_t ld, const int64_t* rows, int64_t R, int64_t V,
                const int32_t* masks, int64_t W, int64_t* out_ids) {
#pragma omp parallel for if (R >= 4) schedule(static) num_threads(team_threads())
    for (int64_t r = 0; r < R; ++r) {
        const float* row = logits + (rows ? rows[r] : r) * ld;
        const int32_t* mask = masks ? masks + r * W : NULL;
        float best = -INFINITY;
        int64_t best_id = 0, v = 0;
#ifdef __AVX512F__
        int64_t nan_at = -1;
        /* per lane: the first maximum of its tokens; then the lowest id among the lanes' best */
        __m512 bv = _mm512_set1_ps(-INFINITY);
        __m512i bi = _mm512_setzero_si512();
        __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i step = _mm512_set1_epi32(16);
        for (; v + 16 <= V && V < (1LL << 31); v += 16) {
            __mmask16 ok = allowed16(mask, W, v);
            __m512 x = _mm512_maskz_loadu_ps(ok, row + v);
            if (_mm512_mask_cmp_ps_mask(ok, x, x, _CMP_UNORD_Q)) {
                nan_at = v;
                break;
            }
            __mmask16 up = _mm512_mask_cmp_ps_mask(ok, x, bv, _CMP_GT_OQ);
            bv = _mm512_mask_mov_ps(bv, up, x);
            bi = _mm512_mask_mov_epi32(bi, up, idx);
            idx = _mm512_add_epi32(idx, step);
        }
        if (nan_at < 0) {
            float lanes[16];
            int32_t ids[16];
            _mm512_storeu_ps(lanes, bv);
            _mm512_storeu_si512(ids, bi);
            for (int l = 0; l < 16; ++l)
                if (lanes[l] > best || (lanes[l] == best && lanes[l] > -INFINITY && ids[l] < best_id)) {
                    best = lanes[l];
                    best_id = ids[l];
                }
        } else {
            v = nan_at; /* the scalar loop below finds that block's first NaN */
        }
#elif defined(SIMD_W)
        /* two passes: the largest allowed value (stopping at a block with a NaN, whose first
         * NaN the scalar loop below finds), then the first allowed token holding it */
        const vf ninf = vf_set1(-INFINITY);
        vf mxv = ninf;
        const int64_t body = V - V % SIMD_W;
        int nan_seen = 0;
        for (; v < body; v += SIMD_W) {
            vf x = vf_load(row + v);
            if (mask) x = vf_select(allowed_w(mask, W, v), x, ninf);
            if (vm_bits(vf_isnan(x))) {
                nan_seen = 1;
                break;
            }
            mxv = vf_max(mxv, x);
        }
        if (!nan_seen) {
            float top = vf_hmax(mxv);
            int64_t t;
            for (t = body; t < V; ++t) { /* the tail: a NaN there wins, else its maximum counts */
                if (!allowed(mask, W, t)) continue;
                float x = row[t];
                if (x != x) break;
                if (x > top) top = x;
            }
            if (t < V) {
                out_ids[r] = t;
                continue;
            }
            int64_t id = 0;
            if (top > -INFINITY) {
                const vf tv = vf_set1(top);
                for (id = 0; id < body; id += SIMD_W) {
                    vf x = vf_load(row + id);
                    if (mask) x = vf_select(allowed_w(mask, W, id), x, ninf);
                    uint32_t hit = vm_bits(vf_ge(x, tv));
                    if (hit) {
                        id += __builtin_ctz(hit);
                        break;
                    }
                }
                if (id >= body)
                    for (id = body; id < V; ++id)
                        if (allowed(mask, W, id) && row[id] == top) break;
            }
            out_ids[r] = id;
            continue;
        }
#endif
        for (; v < V; ++v) {
            if (!allowed(mask, W, v)) continue;
            float x = row[v];
            if (x != x) {
                best_id = v;
                break;
            }
            if (x > best) {
                best = x;
                best_id = v;
            }
        }
        out_ids[r] = best_id;
    }
}

/* In place on float32 logits [R, V] (row stride ld) converted from bf16: replace the near-max
 * candidates by their exact values (same candidates and dot products as greedy_refine_bf16). */
void refine_near_max_f32(float* logits, int64_t ld, const uint16_t* hidden, int64_t hld,
                         const uint16_t* weight, int64_t R, int64_t V, int64_t H) {
#pragma omp parallel for if (R >= 4) schedule(static) num_threads(team_threads())
    for (int64_t r = 0; r < R; ++r) {
        float* row = logits + r * ld;
        float mx = -INFINITY;
        for (int64_t v = 0; v < V; ++v)
            if (row[v] > mx) mx = row[v];
        float floor_ = mx - near_max_tolerance(mx);
        for (int64_t v = 0; v < V; ++v)
            if (row[v] >= floor_) row[v] = exact_dot(hidden + r * hld, weight + v * H, H);
    }
}

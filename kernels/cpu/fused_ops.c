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

static inline float bf16f(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Round a float to the nearest bf16 value (as float): models torch's bf16 op outputs. */
static inline float rbf(float f) { return bf16f(f2bf(f)); }

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
void add_rmsnorm(const void* x, float* residual, const void* weight, void* out, int64_t N,
                 int64_t H, float eps, int dtype) {
#pragma omp parallel for if (N * H >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        float* r = residual + n * H;
        if (x)
            for (int64_t h = 0; h < H; ++h) r[h] += load(x, n * H + h, dtype);
        double ss = 0.0;
        for (int64_t h = 0; h < H; ++h) ss += (double)r[h] * r[h];
        float inv = 1.0f / sqrtf((float)(ss / (double)H) + eps);
        for (int64_t h = 0; h < H; ++h) {
            float v = r[h] * inv;
            if (dtype) v = rbf(v);
            store(out, n * H + h, v * load(weight, h, dtype), dtype);
        }
    }
}

/* qkv: [N, (H + 2 Hkv) * D] rows (row stride qkv_stride). Rotates q (half-split / NeoX layout)
 * into q_out [N, H, D]; rotates k and copies v into the pools at slot loc[n] ([S, Hkv, D]).
 * cos/sin: float32 tables [max_pos, D]; in bf16 they are rounded first, and each product and
 * the sum are rounded, as `x * cos + rotate_half(x) * sin` in bf16. */
void rope_store_kv(const void* qkv, int64_t qkv_stride, const int64_t* pos, const float* cos_t,
                   const float* sin_t, void* q_out, void* k_pool, void* v_pool,
                   const int64_t* loc, int64_t N, int H, int Hkv, int D, int dtype) {
    int half = D / 2;
#pragma omp parallel for if (N * (H + 2 * Hkv) * D >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const float* c = cos_t + pos[n] * D;
        const float* s = sin_t + pos[n] * D;
        int64_t base = n * qkv_stride;
        for (int head = 0; head < H + Hkv; ++head) {
            int64_t src = base + (int64_t)head * D;
            void* dst;
            int64_t doff;
            if (head < H) {
                dst = q_out;
                doff = (n * H + head) * (int64_t)D;
            } else {
                dst = k_pool;
                doff = (loc[n] * Hkv + (head - H)) * (int64_t)D;
            }
            for (int d = 0; d < D; ++d) {
                float xv = load(qkv, src + d, dtype);
                float rot = d < half ? -load(qkv, src + d + half, dtype) : load(qkv, src + d - half, dtype);
                float cv = c[d], sv = s[d];
                float out;
                if (dtype) {
                    out = rbf(xv * rbf(cv)) + rbf(rot * rbf(sv));
                } else {
                    out = xv * cv + rot * sv;
                }
                store(dst, doff + d, out, dtype);
            }
        }
        int64_t vsrc = base + (int64_t)(H + Hkv) * D;
        int64_t vdst = loc[n] * Hkv * (int64_t)D;
        size_t bytes = (size_t)Hkv * D * (dtype ? 2 : 4);
        memcpy((char*)v_pool + vdst * (dtype ? 2 : 4), (const char*)qkv + vsrc * (dtype ? 2 : 4), bytes);
    }
}

/* gate_up: [N, 2 I] (gate then up); out: [N, I] = silu(gate) * up, rounding after each op in bf16. */
void silu_mul(const void* gate_up, void* out, int64_t N, int64_t I, int dtype) {
#pragma omp parallel for if (N * I >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t i = 0; i < I; ++i) {
            float g = load(gate_up, n * 2 * I + i, dtype);
            float u = load(gate_up, n * 2 * I + I + i, dtype);
            float a = g / (1.0f + expf(-g));
            if (dtype) a = rbf(a);
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

/* Greedy choice over bf16 logits [M, V] (row stride ld) after re-scoring: the best candidate
 * (lowest id on ties). rows: which logits rows; hidden rows follow the same indices. */
void greedy_refine_bf16(const uint16_t* logits, int64_t ld, const uint16_t* hidden,
                        const uint16_t* weight, const int64_t* rows, int64_t R, int64_t V,
                        int64_t H, int64_t* out_ids) {
#pragma omp parallel for if (R >= 4) schedule(static)
    for (int64_t r = 0; r < R; ++r) {
        const uint16_t* row = logits + rows[r] * ld;
        float mx = -INFINITY;
        for (int64_t v = 0; v < V; ++v) {
            float x = bf16f(row[v]);
            if (x > mx) mx = x;
        }
        float floor_ = mx - near_max_tolerance(mx);
        float best = -INFINITY;
        int64_t best_id = 0;
        for (int64_t v = 0; v < V; ++v) {
            if (bf16f(row[v]) < floor_) continue;
            float x = exact_dot(hidden + rows[r] * H, weight + v * H, H);
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
#pragma omp parallel for if (R >= 4) schedule(static)
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

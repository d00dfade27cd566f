/* Every function the native CPU library exports: its whole ABI, in one place.
 *
 * Each .c file includes this header, so the compiler checks every definition against its
 * prototype here; test/kernels/test_native_abi.py checks the ctypes table in bindings.py against
 * these prototypes. Change a signature here, in its .c file and in bindings.py together.
 * dtype codes: 0 = float32, 1 = bfloat16; KV pool formats add 2 = int8 (with float32
 * per-token, per-head scales) and 3 = fp8 e4m3 (kv_quant.h). Layouts and roundings are documented at each
 * definition.
 */
#ifndef RADIXGEN_KERNELS_H
#define RADIXGEN_KERNELS_H

#include <stdint.h>

/* ragged_attention.c: causal attention of a ragged batch over the paged KV pool (0 = ok). */
int ragged_attention(const void* q, int64_t q_row_stride, const void* k, const void* v,
                     const int64_t* indices, const int64_t* kv_indptr, const int64_t* q_indptr,
                     const int64_t* q_pos0, int R, void* out, int H, int Hkv, int D, float scale,
                     int dtype, int64_t window, int kv_dtype, const float* k_scale,
                     const float* v_scale);

/* fused_ops.c: residual += x; out = RMSNorm(residual) * weight. */
void add_rmsnorm(const void* x, float* residual, const void* weight, void* out, int64_t N,
                 int64_t H, float eps, int dtype, int x_dtype);

/* fused_ops.c: rotary on q and k, k and v stored (quantized) into the pools at their slots. */
void rope_store_kv(const void* qkv, int64_t qkv_stride, const int64_t* pos, const float* cos_t,
                   const float* sin_t, void* q_out, void* k_pool, void* v_pool,
                   const int64_t* loc, int64_t N, int H, int Hkv, int D, int dtype,
                   int in_dtype, int kv_dtype, float* k_scale, float* v_scale);

/* fused_ops.c: out = silu(gate) * up over [gate | up] rows. */
void silu_mul(const void* gate_up, void* out, int64_t N, int64_t I, int dtype, int in_dtype);

/* fused_ops.c: greedy token of bf16 logits rows, near-max candidates re-scored exactly. */
void greedy_refine_bf16(const uint16_t* logits, int64_t ld, const uint16_t* hidden,
                        const uint16_t* weight, const int64_t* rows, int64_t R, int64_t V,
                        int64_t H, const int32_t* masks, int64_t W, int64_t* out_ids);

/* fused_ops.c: greedy token of exact float32 logits rows (torch's argmax, under grammar masks). */
void argmax_f32(const float* logits, int64_t ld, const int64_t* rows, int64_t R, int64_t V,
                const int32_t* masks, int64_t W, int64_t* out_ids);

/* fused_ops.c: near-max candidates of float32 rows (converted from bf16) re-scored exactly. */
void refine_near_max_f32(float* logits, int64_t ld, const uint16_t* hidden, int64_t hld,
                         const uint16_t* weight, int64_t R, int64_t V, int64_t H);

/* gemm_bf16.c: elements of the packed layout of an [n, k] bf16 weight. */
int64_t gemm_bf16_packed_elems(int64_t n, int64_t k);

/* gemm_bf16.c: 1 where this build has the AVX512-BF16 GEMM, 0 where its entry points are stubs. */
int gemm_bf16_available(void);

/* gemm_bf16.c: pack an [n, k] bf16 weight once, at load time. */
void gemm_bf16_pack(const uint16_t* w, int64_t n, int64_t k, uint16_t* out);

/* gemm_bf16.c: y = x W^T (+ bias) from the packed weight (0 = ok, -1 = unavailable). */
int gemm_bf16(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* packed, int64_t n,
              int64_t k, const float* bias, void* y, int64_t ldy, int out_f32);

/* gemm_quant.c: bytes of the packed layout of an [n, k] quantized weight (fmt 0 = u4 with
 * float16 scale and min, 1 = int8 with scale, 2 = u4 with float32 scale and min, per 32 along
 * k; 3 = int8 with a float32 scale per 16; 4 = bytes with float32 scale and min), -1 for a bad
 * k or fmt. */
int64_t qgemm_packed_bytes(int64_t n, int64_t k, int fmt);

/* gemm_quant.c: 1 where this build has the quantized GEMM, 0 where it is a stub. */
int qgemm_available(void);

/* gemm_quant.c: pack integers q [n, k] with scales d (and mins m) [n, k / 32]: float16, or
 * float32 for fmt 2 (u4 with float32 scales and mins), 3 (int8, d [n, k / 16]) and 4 (bytes
 * with float32 scales and mins). */
void qgemm_pack(const uint8_t* q, const void* d, const void* m, int64_t n, int64_t k, int fmt,
                uint8_t* out);

/* gemm_quant.c: dequantized rows of a packed weight as bf16 (an embedding lookup). */
void qgemm_rows_bf16(const uint8_t* packed, int64_t n, int64_t k, int fmt, const int64_t* rows,
                     int64_t r, uint16_t* out);

/* gemm_quant.c: bit f set where qgemm quantizes x to int8 for format f when fmt has 256
 * (QACT_I8) or 512 (QACT_I8X2: the residual too) or'ed in (0: no such path in this build; the
 * flags are then ignored). */
int qgemm_act_int8_formats(void);

/* gemm_quant.c: y = x W^T (+ bias) from the packed weight (0 = ok, < 0 an error); fmt may
 * carry 256 or 512 (int8 activations, see qgemm_act_int8_formats). */
int qgemm(const uint16_t* x, int64_t m, int64_t ldx, const uint8_t* packed, int64_t n, int64_t k,
          int fmt, const float* bias, void* y, int64_t ldy, int out_f32);

/* decoder_stack.c: int64 words per layer of the decoder stack's layer table. */
int decoder_stack_words(void);

/* decoder_stack.c: bytes of the workspace decoder_stack_forward needs for N rows. */
int64_t decoder_stack_workspace_bytes(int64_t N, int64_t hidden, int H, int Hkv, int D,
                                      int64_t inter);

/* decoder_stack.c: every layer of a Llama-family decoder over N rows from their embeddings, and
 * the final norm of the M rows the logits need (0 = ok; DECODER_STACK_CANCELLED when the flag
 * `cancel` points to was set before a layer). */
#define DECODER_STACK_CANCELLED 1000
int decoder_stack_forward(const int64_t* layers, int n_layers, const int64_t* dims, float eps,
                          float scale, const float* cos_t, const float* sin_t, const uint16_t* x,
                          const void* final_norm, const int64_t* rows, int64_t M, void* out,
                          const int64_t* pos, const int64_t* loc, int64_t N,
                          const int64_t* kv_indices, const int64_t* kv_indptr,
                          const int64_t* q_indptr, const int64_t* q_pos0, int R, void* work,
                          const int32_t* cancel);

/* team.c: threads for the calling thread's next parallel region: omp_get_max_threads(), or 1
 * while its recent regions found the machine oversubscribed (results never depend on it). */
int team_threads(void);

/* team.c: a timed region of `threads` threads began at t0 and ended at t1 (omp_get_wtime), its
 * threads' finish times `spread` seconds apart (team.h's team_clock_report calls this). */
void team_report(int threads, double t0, double spread, double t1);

/* team.c: the calling thread's counters: int64 [6] = team regions timed, of them late, solo
 * periods, regions left to run alone, the next solo period's length, adaptive (0 / 1). */
void team_stats(int64_t* out);

/* team.c: the calling thread's counters and solo state back to their start. */
void team_reset(void);

#endif /* RADIXGEN_KERNELS_H */

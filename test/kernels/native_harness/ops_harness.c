/* The fused ops, ragged attention (bf16, int8 with scales, fp8 pools; a decode row and a
 * 5-row chunk over 300 keys; four decode rows on one cached prefix) and argmax_f32 on fixed pseudo-random inputs, printed one line per
 * kernel ("name v0 v1 ..."): built for the neon variant (run under qemu-user) and for an x86
 * variant, whose outputs test_neon_ops.py compares. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "radixgen_kernels.h"
static uint32_t st = 12345;
static float rnd(void) { st = st * 1664525u + 1013904223u; return ((st >> 8) / 16777216.0f) * 2.f - 1.f; }
static uint16_t bf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static float fb(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
int main(void) {
  enum { H = 9, HKV = 3, D = 64, CTX = 300, NQ = 5 };
  int64_t pool = 2 * CTX + 1;
  uint16_t *k = malloc(pool * HKV * D * 2), *v = malloc(pool * HKV * D * 2);
  int8_t *k8 = malloc(pool * HKV * D), *v8 = malloc(pool * HKV * D);
  uint8_t *f8k = malloc(pool * HKV * D), *f8v = malloc(pool * HKV * D);
  float *ks = malloc(pool * HKV * 4), *vs = malloc(pool * HKV * 4);
  for (int64_t i = 0; i < pool * HKV * D; ++i) { k[i] = bf(rnd()); v[i] = bf(rnd()); k8[i] = (int8_t)(rnd() * 127); v8[i] = (int8_t)(rnd() * 127);
    rnd(); f8k[i] = (uint8_t)((st >> 8) & 0xbf); rnd(); f8v[i] = (uint8_t)((st >> 8) & 0xbf); } /* |x| < 2 */
  for (int64_t i = 0; i < pool * HKV; ++i) { ks[i] = 0.01f + fabsf(rnd()) * 0.02f; vs[i] = 0.01f + fabsf(rnd()) * 0.02f; }
  int64_t idx[2 * CTX]; for (int i = 0; i < 2 * CTX; ++i) idx[i] = (i * 7919) % (pool - 1) + 1;
  int64_t kv_indptr[3] = {0, CTX, 2 * CTX}, q_indptr[3] = {0, 1, 1 + NQ}, q_pos0[2] = {CTX - 1, CTX - NQ};
  uint16_t q[(1 + NQ) * H * D], out[(1 + NQ) * H * D];
  for (int i = 0; i < (1 + NQ) * H * D; ++i) q[i] = bf(rnd());
  for (int kind = 1; kind <= 3; ++kind) {
    const void *kk = kind == 1 ? (const void*)k : kind == 2 ? (const void*)k8 : (const void*)f8k;
    const void *vv = kind == 1 ? (const void*)v : kind == 2 ? (const void*)v8 : (const void*)f8v;
    int rc = ragged_attention(q, H * D, kk, vv, idx, kv_indptr, q_indptr, q_pos0, 2, out, H, HKV, D, 0.125f, 1, 0, kind, kind == 2 ? ks : NULL, kind == 2 ? vs : NULL);
    printf("attn%d rc %d", kind, rc);
    for (int i = 0; i < (1 + NQ) * H * D; i += 7) printf(" %.9g", fb(out[i]));
    printf("\n");
    /* each of the NQ rows alone, as a decode row at its position: bitwise the batched result */
    int differ = 0;
    for (int r = 0; r < NQ; ++r) {
      uint16_t one[H * D];
      int64_t kvp[2] = {0, CTX - NQ + r + 1}, qp[2] = {0, 1}, pos[1] = {CTX - NQ + r};
      int rc1 = ragged_attention(q + (1 + r) * H * D, H * D, kk, vv, idx + CTX, kvp, qp, pos, 1, one, H, HKV, D, 0.125f, 1, 0, kind, kind == 2 ? ks : NULL, kind == 2 ? vs : NULL);
      differ += rc1 != 0 || memcmp(one, out + (1 + r) * H * D, sizeof one) != 0;
    }
    printf("alone%d %d\n", kind, differ);
    /* four decode rows on one cached prefix (the same slots for 520 positions: two whole key
     * blocks, read once for all four): each bitwise its decode alone */
    enum { SP = 520, SR = 4 };
    int64_t sidx[SR * (SP + 16)], skv[SR + 1], sq[SR + 1], spos[SR];
    uint16_t sout[SR * H * D];
    skv[0] = 0;
    for (int r = 0; r < SR; ++r) {
      int64_t len = SP + 10 + r;
      for (int64_t j = 0; j < len; ++j) sidx[skv[r] + j] = j < SP ? idx[j] : idx[CTX + 40 * r + j - SP];
      skv[r + 1] = skv[r] + len; sq[r] = r; spos[r] = len - 1;
    }
    sq[SR] = SR;
    int src = ragged_attention(q, H * D, kk, vv, sidx, skv, sq, spos, SR, sout, H, HKV, D, 0.125f, 1, 0, kind, kind == 2 ? ks : NULL, kind == 2 ? vs : NULL);
    int sdiffer = src != 0;
    for (int r = 0; r < SR; ++r) {
      uint16_t one[H * D];
      int64_t kvp[2] = {0, skv[r + 1] - skv[r]}, qp[2] = {0, 1}, pos[1] = {spos[r]};
      int rc1 = ragged_attention(q + r * H * D, H * D, kk, vv, sidx + skv[r], kvp, qp, pos, 1, one, H, HKV, D, 0.125f, 1, 0, kind, kind == 2 ? ks : NULL, kind == 2 ? vs : NULL);
      sdiffer += rc1 != 0 || memcmp(one, sout + r * H * D, sizeof one) != 0;
    }
    printf("shared%d %d\n", kind, sdiffer);
  }
  enum { N = 3, I = 200, HID = 576 };
  uint16_t gu[N * 2 * I], so[N * I];
  for (int i = 0; i < N * 2 * I; ++i) gu[i] = bf(rnd() * 8);
  silu_mul(gu, so, N, I, 1, 1);
  printf("silu"); for (int i = 0; i < N * I; ++i) printf(" %.9g", fb(so[i])); printf("\n");
  float res[N * HID]; uint16_t x[N * HID], w[HID], no[N * HID];
  for (int i = 0; i < N * HID; ++i) { res[i] = rnd(); x[i] = bf(rnd()); }
  for (int i = 0; i < HID; ++i) w[i] = bf(1 + rnd() * 0.1f);
  add_rmsnorm(x, res, w, no, N, HID, 1e-5f, 1, 1);
  printf("norm"); for (int i = 0; i < N * HID; i += 3) printf(" %.9g", fb(no[i])); printf("\n");
  enum { V = 1000 };
  float lg[2 * V]; int64_t ids[2], rows[2] = {0, 1};
  for (int i = 0; i < 2 * V; ++i) lg[i] = rnd();
  lg[123] = 5; lg[456] = 5; lg[V + 999] = 7; lg[V + 17] = NAN; lg[V + 500] = NAN;
  argmax_f32(lg, V, rows, 2, V, NULL, 0, ids);
  printf("argmax %lld %lld\n", (long long)ids[0], (long long)ids[1]);
  return 0;
}

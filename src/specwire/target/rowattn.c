/* The row-invariant attention behind the invariant attention on CPU (built with rowdot.c, loaded by
 * specwire/target/rowdot.py, called by specwire/target/attention.py).
 *
 * out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j]) v[j] over the keys j that query row i may see, in
 * float32, with query head h reading key/value head h / (H / Hkv) (grouped-query attention).
 *
 * The one rule: a row's result depends only on its own query and on the sequence of keys it sees, in
 * order (the cached prefix 0..past-1, then the keys of this pass that its mask row allows, in pass order),
 * never on how many rows share the pass, which thread computes it, or how many hidden keys lie between
 * its keys. Hidden keys are skipped, not zeroed. Each (row, head) is computed whole by one thread:
 *   1. every score is one chain: an 8-lane accumulator over the head dimension in steps of 8 by fused
 *      multiply-adds, its lanes folded in a fixed tree, the tail (dk mod 8) added in order, times scale;
 *   2. the maximum over the row's scores (exact in any order);
 *   3. e = exp(s - max) by a fixed lane-wise polynomial (`exp8`), and the denominator: the e of the row's
 *      rank-j key into lane j mod 8, in rank order, the 8 lanes folded in a fixed tree;
 *   4. each output lane d: sum over ranks in order of e * v[key][d], one fused multiply-add each;
 *   5. each output lane divided by the denominator.
 * So a tree node's row is bitwise the row that a one-token step on its accepted path computes, and the
 * first token of a verify pass is bitwise plain decoding's. Keys and values may be given in bf16 (a bf16
 * model's cache): each is widened to float32 as it is loaded, which is exact, so the result is bitwise the
 * float32 one over the widened cache, without a widened copy of the cache every pass. Compiled with -O3
 * -mavx2 -mfma -fopenmp, and without -ffast-math: the order is the point.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "rowkernels.h"

/* Does query row i see key j? The cached prefix (j < past) always; this pass's key past + t where tail[i, t]
 * (tail NULL: t <= i, causal). */
static inline int sees(int64_t j, int64_t i, int64_t past, int64_t Tq, const uint8_t *tail) {
    return j < past || (tail ? tail[i * Tq + (j - past)] : j - past <= i);
}

/* 8 (or 1) cache numbers at element e of b as float32: b is float32, or bf16 (BF) widened exactly. */
static inline __attribute__((always_inline)) __m256 kv8(const int BF, const void *b, int64_t e) {
    if (BF) return _mm256_castsi256_ps(_mm256_slli_epi32(
                      _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)b + e))), 16));
    return _mm256_loadu_ps((const float *)b + e);
}

static inline __attribute__((always_inline)) float kv1(const int BF, const void *b, int64_t e) {
    if (BF) {
        const uint32_t u = (uint32_t)((const uint16_t *)b)[e] << 16;
        float f;
        __builtin_memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)b)[e];
}

static inline __attribute__((always_inline)) float dot(const int BF, const float *a, const void *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t d = 0; d < n8; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), kv8(BF, b, d), acc);
    float r = fold8(acc);
    for (int64_t d = n8; d < n; d++) r = fmaf(a[d], kv1(BF, b, d), r);
    return r;
}

/* exp(x) for x <= 0, lane by lane: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-7 polynomial (Cephes'
 * expf coefficients, about 1 ulp), times 2^n; x below -87 is taken as -87 (its term, under 2e-38, is
 * negligible beside the row maximum's 1). A fixed sequence of lane-wise operations: the same x gives the
 * same result in any lane of any call. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* lanes 0..k-1 set (k < 8) */
static inline __m256 tail_mask(int64_t k) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), lane));
}

/* One (row, head) pair p of the pass (see the entry points below for the arguments); k and v in float32, or
 * in bf16 (BF), their strides in elements. */
static inline __attribute__((always_inline)) void rowattn_pair(
        const int BF, int64_t p, const float *q, int64_t Tq, int64_t H, int64_t dk, int64_t qs_t, int64_t qs_h,
        const void *k, int64_t Hkv, int64_t ks_h, int64_t ks_t, const void *v, int64_t dv, int64_t vs_h, int64_t vs_t,
        int64_t past, const uint8_t *tail, float scale, float *work, float *out) {
    const int64_t g = H / Hkv, width = past + Tq;
    {
        const int64_t i = p / H, h = p % H, kh = h / g;
        const float *qi = q + i * qs_t + h * qs_h;
        const int64_t kb = kh * ks_h, vb = kh * vs_h;  /* element offsets of the head's keys and values */
        float *s = work + p * width;
        int64_t n = 0;
        for (int64_t j = 0; j < width; j++)
            if (sees(j, i, past, Tq, tail))
                s[n++] = dot(BF, qi, BF ? (const void *)((const uint16_t *)k + kb + j * ks_t)
                                        : (const void *)((const float *)k + kb + j * ks_t), dk);
        float m = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            s[j] *= scale;
            m = s[j] > m ? s[j] : m;
        }
        /* e = exp(s - m) in place, 8 ranks at a time (a short last group through a padded copy: every rank
         * takes the same lane-wise arithmetic), and the denominator: rank j into lane j mod 8, folded. */
        const __m256 mv = _mm256_set1_ps(m);
        __m256 denv = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j += 8) {
            if (j + 8 <= n) {
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
                _mm256_storeu_ps(s + j, e);
                denv = _mm256_add_ps(denv, e);
            } else {
                float pad[8] = {0};
                for (int64_t t = j; t < n; t++) pad[t - j] = s[t];
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(pad), mv));
                _mm256_storeu_ps(pad, e);
                for (int64_t t = j; t < n; t++) s[t] = pad[t - j];
                denv = _mm256_add_ps(denv, _mm256_blendv_ps(_mm256_setzero_ps(), e, tail_mask(n - j)));
            }
        }
        const float den = fold8(denv);
        /* the values: output lane d = sum over ranks in order of e[rank] * v[key][d], one fused multiply-add
         * each; 64 lanes at a time in registers. */
        float *o = out + (i * H + h) * dv;
        const int64_t dv8 = dv & ~(int64_t)7;
        for (int64_t d0 = 0; d0 < dv8; d0 += 64) {
            const int nv = (int)((dv8 - d0 < 64 ? dv8 - d0 : 64) / 8);
            __m256 acc[8];
            for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
            int64_t r = 0;
            for (int64_t j = 0; j < width; j++) {
                if (!sees(j, i, past, Tq, tail)) continue;
                const __m256 ev = _mm256_set1_ps(s[r++]);
                const int64_t vj = vb + j * vs_t + d0;
                if (nv == 8)
                    for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(ev, kv8(BF, v, vj + 8 * c), acc[c]);
                else
                    for (int c = 0; c < nv; c++) acc[c] = _mm256_fmadd_ps(ev, kv8(BF, v, vj + 8 * c), acc[c]);
            }
            for (int c = 0; c < nv; c++) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
        }
        for (int64_t d = dv8; d < dv; d++) {
            float a = 0.0f;
            int64_t r = 0;
            for (int64_t j = 0; j < width; j++) {
                if (!sees(j, i, past, Tq, tail)) continue;
                a = fmaf(s[r++], kv1(BF, v, vb + j * vs_t + d), a);
            }
            o[d] = a;
        }
        for (int64_t d = 0; d < dv; d++) o[d] = o[d] / den;  /* (the same division whatever the lane) */
    }
}

/* q: [Tq, H, dk] at strides (qs_t, qs_h), k: [Hkv, Tk, dk] at (ks_h, ks_t), v: [Hkv, Tk, dv] at (vs_h, vs_t),
 * innermost dimensions contiguous. Row i sees keys 0..past-1, then past + j for j < Tq where tail[i * Tq + j]
 * (tail NULL: j <= i, causal). work: [Tq * H, past + Tq] floats. out: [Tq, H, dv], contiguous. */
void specwire_rowattn_f32(const float *q, int64_t Tq, int64_t H, int64_t dk, int64_t qs_t, int64_t qs_h,
                          const float *k, int64_t Hkv, int64_t ks_h, int64_t ks_t, const float *v, int64_t dv,
                          int64_t vs_h, int64_t vs_t, int64_t past, const uint8_t *tail, float scale, float *work,
                          float *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < Tq * H; p++)
        rowattn_pair(0, p, q, Tq, H, dk, qs_t, qs_h, k, Hkv, ks_h, ks_t, v, dv, vs_h, vs_t, past, tail, scale, work, out);
}

/* The same with k and v in bf16 (strides in elements): bitwise the float32 result over the widened cache. */
void specwire_rowattn_bf16kv(const float *q, int64_t Tq, int64_t H, int64_t dk, int64_t qs_t, int64_t qs_h,
                             const uint16_t *k, int64_t Hkv, int64_t ks_h, int64_t ks_t, const uint16_t *v, int64_t dv,
                             int64_t vs_h, int64_t vs_t, int64_t past, const uint8_t *tail, float scale, float *work,
                             float *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < Tq * H; p++)
        rowattn_pair(1, p, q, Tq, H, dk, qs_t, qs_h, k, Hkv, ks_h, ks_t, v, dv, vs_h, vs_t, past, tail, scale, work, out);
}

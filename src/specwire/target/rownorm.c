/* The row-invariant RMS norm of a decoding target (built with rowdot.c, loaded by specwire/target/rowdot.py,
 * called by specwire/target/rownorm.py).
 *
 * For each row r of x [rows, H], in float32 (x widened exactly where it is bf16):
 *   s = sum_k x[r, k]^2   (one 8-lane accumulator over k in steps of 8 by fused multiply-adds, its lanes folded
 *                          in `fold8`'s fixed tree, then the tail k = H - H mod 8 ... H - 1 in order)
 *   q = 1 / sqrt(s / H + eps)
 *   y[r, k] = fl(w[k] * fl_dt(x[r, k] * q))
 * where fl_dt rounds to the model's dtype (bf16 by round-to-nearest-even, or nothing in float32) and fl rounds
 * the product to the output dtype. That is transformers' Llama-style RMSNorm (mean of squares in float32, the
 * normalised row cast back to the input dtype, then times the weight), with the sum of squares in one fixed
 * order, so a row's result never depends on the rows beside it. The roundings are explicit intrinsics: no
 * contraction into fused operations anywhere a formula has two roundings.
 *
 * Speed: a row of 576 is a few hundred instructions; a call over a pass's rows costs about a microsecond
 * against tens for the eight tensor ops of the module it replaces. One thread: the work is too small to share.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "rowkernels.h"

/* float32 -> bf16 by round-to-nearest-even, 8 at a time (a NaN stays a quiet NaN), as torch rounds */
static inline __attribute__((always_inline)) __m128i to_bf16x8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    /* pack the low 16 bits of the 8 lanes in order */
    const __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    return _mm_packus_epi32(lo, hi);
}

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if (f != f) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static inline __attribute__((always_inline)) __m256 widen_bf16x8(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* x, y [rows, H] row-major (y may not alias x), both float32 or both bf16 (`bf16`); w [H] float32 or bf16
 * (`w_bf16`) */
void specwire_rmsnorm(const void *x, int64_t rows, int64_t H, int bf16, const void *w, int w_bf16, float eps,
                      void *y) {
    const int64_t H8 = H & ~(int64_t)7;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t e0 = r * H;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t k = 0; k < H8; k += 8) {
            const __m256 v = kv8(bf16, x, e0 + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float s = fold8(acc);
        for (int64_t k = H8; k < H; k++) {
            const float v = kv1(bf16, x, e0 + k);
            s = fmaf(v, v, s);
        }
        const float q = 1.0f / sqrtf(s / (float)H + eps);
        const __m256 qv = _mm256_set1_ps(q);
        for (int64_t k = 0; k < H8; k += 8) {
            __m256 h = _mm256_mul_ps(kv8(bf16, x, e0 + k), qv);
            if (bf16) h = widen_bf16x8(to_bf16x8(h));
            const __m256 p = _mm256_mul_ps(kv8(w_bf16, w, k), h);
            if (bf16)
                _mm_storeu_si128((__m128i *)((uint16_t *)y + e0 + k), to_bf16x8(p));
            else
                _mm256_storeu_ps((float *)y + e0 + k, p);
        }
        for (int64_t k = H8; k < H; k++) {
            float h = kv1(bf16, x, e0 + k) * q;
            if (bf16) h = kv1(1, (uint16_t[]){to_bf16(h)}, 0);
            const float p = kv1(w_bf16, w, k) * h;
            if (bf16)
                ((uint16_t *)y)[e0 + k] = to_bf16(p);
            else
                ((float *)y)[e0 + k] = p;
        }
    }
}

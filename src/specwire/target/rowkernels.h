/* What the compiled kernels (rowdot.c, rowattn.c, argmax.c) share: the fixed fold of 8 float lanes, and reading
 * float32 or bf16 numbers as float32. */
#ifndef SPECWIRE_ROWKERNELS_H
#define SPECWIRE_ROWKERNELS_H
#include <immintrin.h>
#include <stdint.h>

/* lane 0 + ... + lane 7 in one fixed tree: (0+4)+(2+6), (1+5)+(3+7), then their sum */
static inline float fold8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* lane i + lane i+4 */
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

/* 8 (or 1) numbers at element e of b as float32: b is float32, or bf16 (BF) widened exactly (a shift). */
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
#endif

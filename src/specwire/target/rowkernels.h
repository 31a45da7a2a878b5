/* What the compiled row-invariant kernels (rowdot.c, rowattn.c) share: the fixed fold of 8 float lanes. */
#ifndef SPECWIRE_ROWKERNELS_H
#define SPECWIRE_ROWKERNELS_H
#include <immintrin.h>

/* lane 0 + ... + lane 7 in one fixed tree: (0+4)+(2+6), (1+5)+(3+7), then their sum */
static inline float fold8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* lane i + lane i+4 */
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}
#endif

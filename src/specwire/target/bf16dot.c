/* The row-invariant bf16 product behind `--dtype bfloat16 --linear rowdot` on a CPU with AVX512-BF16 (built and
 * loaded by specwire/target/bf16dot.py).
 *
 * y[m, n] = bf16(sum_k x[m, k] * w[n, k] + bias[n]), x, bias and y bf16, w stored as nn.Linear stores it ([N, K])
 * in one of three forms, each rebuilt into the model's bf16 weight, bitwise, as it is loaded:
 * - bf16 (`specwire_bf16dot_bf16`): the weight itself;
 * - q4_1 (`specwire_bf16dot_q4_1`): per block of 32 k, the float32 weight fl(fl(d * q) + m), rounded to bf16;
 * - q8_0 (`specwire_bf16dot_q8_0`): per block of 32 k, fl(q * d), rounded to bf16.
 * A bf16 model converted from a float32 one holds the float32 weight rounded to nearest even; where that float32
 * weight was dequantized from GGUF block codes (the built-in target's), rebuilding it from the codes and rounding
 * it the same way gives the model's bf16 weight exactly (specwire/target/compact.py packs the codes, and the
 * module checks every element against the model's weight before it trusts them).
 *
 * And one float32 product for a draft (`specwire_bf16dot_split3`): y[m, n] = sum_k x[m, k] * w[n, k] + bias[n], x,
 * bias and y float32, w bf16. Each input row is first split into three bf16 rows whose sum is the row exactly (hi =
 * bf16(x), mid = bf16(x - hi), lo = x - hi - mid, which fits bf16: a float32 has 24 significant bits, each part
 * takes 8), and the three go through the same chain one after the other for each 32 k. The products are exact in
 * float32 (8-bit by 8-bit significands), so this is a float32 dot product over bf16 weights, summed in another fixed
 * order than float32 rowdot's (not bitwise rowdot's, but as exact; parts below float32's normal range flush to
 * zero), at the bf16 kernel's cost of reading a weight: one 64-byte load for 32 k, not rowdot's widening shuffles.
 *
 * The one rule: every output is the same chain of operations whatever the number of rows M, the row m, the tile
 * or the thread. One 16-lane float32 accumulator takes k in steps of 32 by VDPBF16PS (lane l adds the products of
 * k = 32i + 2l and 32i + 2l + 1, each exact in float32, in the instruction's fixed order, with denormals flushed),
 * in order of i; the 16 lanes are folded in a fixed tree; the bias is added and the sum rounded to bf16 (nearest
 * even). So a row of a T-token pass is bitwise the row of a one-token pass.
 *
 * And one product for a draft over q8_0 codes (`specwire_bf16dot_q8_0_i16`): y[m, n] = sum over blocks kb of
 * d[n, kb] s[m, kb] (sum_{k in kb} q[n, k] xq[m, k]) + bias[n], x, bias and y float32. Each input row is first
 * quantized per block of 32 k to int16 (`quantize_block`: s = the block's largest magnitude / 32767, xq = x / s to
 * nearest even, so within s / 2 of x: finer than bf16's rounding for every element within 2^7 of its block's largest,
 * and a block whose largest magnitude is below 1e-30 reads as zeros). A block's 32 products are summed exactly in
 * int32 by VPMADDWD (|sum| <= 32 * 32767 * 127 < 2^24, so exact in float32 too), scaled by d s and added in float32 in
 * order of kb; the 16 lanes are folded as below. Every output is again one fixed chain, so each row is independent of
 * the rows beside it. No weight is decoded: an int8 code is widened to int16 as it is read, and one instruction
 * takes a whole block of a row, where the bf16 forms spend about eight decoding it first. Needs AVX-512 (F, BW) only.
 *
 * Speed: a one-token pass is bound by decoding the weights (GGUF codes: about 6 bits a weight for q4_1, against 16
 * for bf16), not by reading them. Every pass decodes each weight once into a bf16 strip of STRIP rows, one row's
 * stream of codes at a time (a tile that decodes several rows at once reads more streams than the prefetcher
 * follows: on a 2-core Zen 4 a one-row pass cost more than a two-row one that way), a q4_1 block by a table of
 * its 16 possible weights, then does 32 multiply-adds an instruction for each row, twice float32's 16, so its cost
 * grows with the rows about half as fast as float32 rowdot's. At K = 576 an output takes only 18 of them, so its
 * ending counts too: a tile of 4 columns folds, biases and rounds its 4 outputs of a row together (`fold16x4`,
 * `narrow4`: lane for lane the operations of `fold16` and `narrow`, so bitwise the same), 9-20% less time for
 * products of 4-16 rows on a 2-core Zen 4 than one output at a time with scalar rounding. Needs AVX-512 (F, BW) and AVX512-BF16; compiled
 * with -O3 -mavx512f -mavx512bw -mavx512bf16 -fopenmp, without -ffast-math.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

enum { BF16 = 1, Q4_1 = 2, Q8_0 = 3 };

typedef struct {
    const void *codes;  /* bf16 [N, K], q4_1 codes uint8 [N, K / 2] or q8_0 codes int8 [N, K] */
    const float *d, *m; /* per block of 32 k: scale, and q4_1's offset */
} wsrc;

/* v as computed: an empty asm the compiler cannot see through, so a product is rounded before it is added */
static inline __attribute__((always_inline)) __m512 rounded(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

/* block kb (k = 32 kb ... 32 kb + 31) of w's row 0, in a block form (Q4_1, Q8_0), as 32 bf16 numbers in order of k:
 * the float32 weight rebuilt as its GGUF dequantization does, rounded to nearest even */
static inline __attribute__((always_inline)) __m512bh block32(const int WF, const wsrc *w, int64_t kb) {
    const int64_t b = kb;
    const __m512 d = _mm512_set1_ps(w->d[b]);
    if (WF == Q4_1) {
        /* the block's 16 possible weights, one per code q: fl(fl(d * q) + m) rounded to bf16 (the same operations
         * as element by element), then each k's code looks its weight up */
        const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 table = _mm512_add_ps(rounded(_mm512_mul_ps(d, q)), _mm512_set1_ps(w->m[b]));
        const __m128i v = _mm_loadu_si128((const __m128i *)((const uint8_t *)w->codes + 16 * b));
        const __m128i q0 = _mm_and_si128(v, _mm_set1_epi8(15)), q1 = _mm_and_si128(_mm_srli_epi16(v, 4),
                                                                                   _mm_set1_epi8(15));
        const __m512i codes = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1));
        return (__m512bh)_mm512_permutexvar_epi16(codes, _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(table)));
    }
    const int8_t *q = (const int8_t *)w->codes + 32 * b;
    const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), d);
    const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))),
                                    d);
    return _mm512_cvtne2ps_pbh(hi, lo); /* elements 0..15 from lo, 16..31 from hi */
}

/* ask for block kb + 4 of w's row 0 (a block form) now: its codes and scales are two or three streams at once */
static inline __attribute__((always_inline)) void fetch_ahead(const int WF, const wsrc *w, int64_t kb) {
    const int64_t b = kb + 4;
    _mm_prefetch((const char *)w->codes + (WF == Q4_1 ? 16 : 32) * b, _MM_HINT_T0);
    _mm_prefetch((const char *)(w->d + b), _MM_HINT_T0);
    if (WF == Q4_1) _mm_prefetch((const char *)(w->m + b), _MM_HINT_T0);
}

/* the 16 lanes in one fixed tree: lane i + lane i+8, then i + i+4, i + i+2, i + i+1 */
static inline float fold16(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

/* fold16 of four accumulators at once, lane for lane the same additions in the same tree: [fold16(a0), ...(a3)] */
static inline __attribute__((always_inline)) __m128 fold16x4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    /* i + i+8: quarters [a0 h0-3, a0 h4-7, a1 h0-3, a1 h4-7], and a2, a3 likewise */
    const __m512 h01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
    const __m512 h23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
    /* i + i+4: quarter j holds accumulator j's four sums */
    const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(h01, h23, 0x88), _mm512_shuffle_f32x4(h01, h23, 0xDD));
    const __m512 t = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));       /* i + i+2 */
    const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));       /* i + i+1 */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
}

static inline float widen(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bf16, to nearest even (as torch rounds a float32 tensor to bf16; a NaN stays a NaN) */
static inline uint16_t narrow(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* four bf16 numbers widened to float32 (exact) */
static inline __attribute__((always_inline)) __m128 widen4(const uint16_t *h) {
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)h)), 16));
}

/* `narrow` of four float32 numbers at once, lane for lane: the four bf16 in the low 8 bytes */
static inline __attribute__((always_inline)) __m128i narrow4(__m128 f) {
    const __m128i u = _mm_castps_si128(f), hi = _mm_srli_epi32(u, 16);
    const __m128i even = _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7fff)),
                                                      _mm_and_si128(hi, _mm_set1_epi32(1))), 16);
    const __mmask8 nan = _mm_cmpgt_epu32_mask(_mm_and_si128(u, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
    return _mm_cvtepi32_epi16(_mm_mask_blend_epi32(nan, even, _mm_or_si128(hi, _mm_set1_epi32(0x40))));
}

/* y[i, j] for i < R, j < C: x rows ldx apart, each PARTS bf16 rows K apart (1: a bf16 input; 3: a float32 input's
 * exact parts, added one after the other each 32 k), w bf16 rows K apart from its row 0 (the weight itself, with
 * FETCH: ask for each row's block kb + 4 ahead; or a strip decoded into L1, without), y rows ldy apart: bf16 for
 * one part, float32 for three, and the bias likewise. R, C, PARTS and FETCH are compile-time constants at every
 * call, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void tile(const int FETCH, const int PARTS, const int R, const int C,
                                                       const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t K,
                                                       const void *bias, void *y, int64_t ldy) {
    __m512 a[4][8];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) a[i][j] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < K / 32; kb++)
        for (int j = 0; j < C; j++) {
            if (FETCH) _mm_prefetch((const char *)(w + j * K + 32 * (kb + 4)), _MM_HINT_T0);
            const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + j * K + 32 * kb);
            for (int i = 0; i < R; i++)
                for (int p = 0; p < PARTS; p++)
                    a[i][j] = _mm512_dpbf16_ps(a[i][j], (__m512bh)_mm512_loadu_si512(x + i * ldx + p * K + 32 * kb),
                                               wv);
        }
    if (C == 4) { /* the four outputs of a row at once, lane for lane the operations below */
        const __m128 b = !bias ? _mm_setzero_ps()
                         : PARTS == 1 ? widen4((const uint16_t *)bias) : _mm_loadu_ps((const float *)bias);
        for (int i = 0; i < R; i++) {
            __m128 r = fold16x4(a[i][0], a[i][1], a[i][2], a[i][3]);
            if (bias) r = _mm_add_ps(r, b);
            if (PARTS == 1)
                _mm_storel_epi64((__m128i *)((uint16_t *)y + i * ldy), narrow4(r));
            else
                _mm_storeu_ps((float *)y + i * ldy, r);
        }
        return;
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            const float r = fold16(a[i][j]);
            if (PARTS == 1)
                ((uint16_t *)y)[i * ldy + j] = narrow(bias ? r + widen(((const uint16_t *)bias)[j]) : r);
            else
                ((float *)y)[i * ldy + j] = bias ? r + ((const float *)bias)[j] : r;
        }
}

/* the tile's weights: its first row n0 in each of w's arrays */
static inline __attribute__((always_inline)) wsrc at_row(const int WF, const wsrc *w, int64_t K, int64_t n0) {
    const int64_t row_bytes = WF == BF16 ? 2 * K : WF == Q4_1 ? K / 2 : K;
    wsrc r = {(const char *)w->codes + n0 * row_bytes, w->d ? w->d + n0 * (K / 32) : 0,
              w->m ? w->m + n0 * (K / 32) : 0};
    return r;
}

/* the R x C tile at rows m0, columns n0, over bf16 rows w that start at column `first` (bias and y: bf16 numbers
 * for one part, float32 for three) */
#define TILE(R, C, w, first, FETCH)                                                                             \
    tile(FETCH, PARTS, R, C, x + m0 * PARTS * K, PARTS * K, (w) + (n0 - (first)) * K, K,                        \
         bias ? (const char *)bias + n0 * (PARTS == 1 ? 2 : 4) : 0, (char *)y + (m0 * N + n0) * (PARTS == 1 ? 2 : 4), N)

/* CALL(R, ...) with R the tile's row count mr (1 to 4) as a compile-time constant */
#define BY_ROWS(CALL, ...)                                                                                      \
    switch (mr) {                                                                                               \
        case 4: CALL(4, __VA_ARGS__); break;                                                                    \
        case 3: CALL(3, __VA_ARGS__); break;                                                                    \
        case 2: CALL(2, __VA_ARGS__); break;                                                                    \
        default: CALL(1, __VA_ARGS__);                                                                          \
    }

#define ROWS(C, w, first, FETCH) BY_ROWS(TILE, C, w, first, FETCH)

#define STRIP 4 /* columns a tile of several rows */

/* the strips [*first, *last) of `blocks` that thread `part` of `parts` takes: equal shares in order */
static inline void strips_of(int64_t blocks, int part, int parts, int64_t *first, int64_t *last) {
    const int64_t share = (blocks + parts - 1) / parts;
    *first = part * share;
    *last = *first + share < blocks ? *first + share : blocks;
}

/* this thread's share (`part` of `parts`) of the column strips: strips of STRIP columns, each decoded once into
 * bf16 (on the stack, STRIP * K * 2 bytes: in L1 for common K) unless the weight is bf16 already, then tiles of up
 * to 4 rows over it. x: M rows of PARTS bf16 rows of K; bias and y as `tile` takes them. */
static inline __attribute__((always_inline)) void bf16dot_part(const int WF, const int PARTS, const uint16_t *x,
                                                               int64_t M, int64_t K, const wsrc *w, int64_t N,
                                                               const void *bias, void *y, int part, int parts) {
    int64_t first_block, last_block;
    strips_of((N + STRIP - 1) / STRIP, part, parts, &first_block, &last_block);
    const int decode = WF != BF16;
    for (int64_t b = first_block; b < last_block; b++) {
        const int64_t nb = b * STRIP, nc = N - nb < STRIP ? N - nb : STRIP;
        uint16_t strip[decode ? STRIP * K : 1]; /* the strip's rows decoded, row nb + j at strip + j K */
        const uint16_t *weight = (const uint16_t *)w->codes; /* a bf16 weight's own rows */
        if (decode)
            for (int64_t j = 0; j < nc; j++) {
                const wsrc row = at_row(WF, w, K, nb + j);
                for (int64_t kb = 0; kb < K / 32; kb++) {
                    fetch_ahead(WF, &row, kb);
                    _mm512_storeu_si512(strip + j * K + 32 * kb, (__m512i)block32(WF, &row, kb));
                }
            }
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t mr = M - m0 < 4 ? M - m0 : 4;
            if (nc == STRIP) {
                const int64_t n0 = nb;
                if (decode) {
                    ROWS(STRIP, strip, nb, 0)
                } else {
                    ROWS(STRIP, weight, 0, 1)
                }
            } else
                for (int64_t n0 = nb; n0 < nb + nc; n0++) {
                    if (decode) {
                        ROWS(1, strip, nb, 0)
                    } else {
                        ROWS(1, weight, 0, 1)
                    }
                }
        }
    }
}

#define PARALLEL(WF, src)                                                                                       \
    _Pragma("omp parallel num_threads(threads)")                                                                \
    bf16dot_part(WF, 1, x, M, K, &src, N, bias, y, omp_get_thread_num(), omp_get_num_threads())

/* x bf16 [M, K], w bf16 [N, K], bias bf16 [N] or NULL, y bf16 [M, N]; K % 32 == 0 */
void specwire_bf16dot_bf16(const uint16_t *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                           const uint16_t *bias, uint16_t *y, int threads) {
    const wsrc src = {w, 0, 0};
    PARALLEL(BF16, src);
}

/* codes uint8 [N, K / 2], d and m float32 [N, K / 32] */
void specwire_bf16dot_q4_1(const uint16_t *x, int64_t M, int64_t K, const uint8_t *codes, const float *d,
                           const float *m, int64_t N, const uint16_t *bias, uint16_t *y, int threads) {
    const wsrc src = {codes, d, m};
    PARALLEL(Q4_1, src);
}

/* codes int8 [N, K], d float32 [N, K / 32] */
void specwire_bf16dot_q8_0(const uint16_t *x, int64_t M, int64_t K, const int8_t *codes, const float *d, int64_t N,
                           const uint16_t *bias, uint16_t *y, int threads) {
    const wsrc src = {codes, d, 0};
    PARALLEL(Q8_0, src);
}

/* x float32 [M, K], w bf16 [N, K], bias float32 [N] or NULL, y float32 [M, N]; parts: room for the bf16 parts of x,
 * [M, 3, K], written here; K % 32 == 0 */
void specwire_bf16dot_split3(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, const float *bias,
                             float *y, uint16_t *parts, int threads) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            const float v = x[m * K + k];
            const uint16_t hi = narrow(v), mid = narrow(v - widen(hi)); /* both differences are exact */
            uint16_t *row = parts + 3 * m * K;
            row[k] = hi;
            row[K + k] = mid;
            row[2 * K + k] = narrow(v - widen(hi) - widen(mid)); /* at most 8 significant bits: exact */
        }
    const wsrc src = {w, 0, 0};
    _Pragma("omp parallel num_threads(threads)")
    bf16dot_part(BF16, 3, parts, M, K, &src, N, bias, y, omp_get_thread_num(), omp_get_num_threads());
}

/* block kb of an input row, quantized: x float32 [32] -> xq int16 [32] and its scale *s (see the header) */
static inline __attribute__((always_inline)) void quantize_block(const float *x, int16_t *xq, float *s) {
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const int live = amax > 1e-30f; /* 32767 / amax is finite */
    const __m512 up = _mm512_set1_ps(live ? 32767.0f / amax : 0.0f);
    *s = live ? amax / 32767.0f : 0.0f;
    _mm256_storeu_si256((__m256i *)xq, _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(lo, up))));
    _mm256_storeu_si256((__m256i *)(xq + 16), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(hi, up))));
}

/* y[i, j] for i < R, j < C over quantized rows xq (rows K apart, scales xs K / 32 apart) and q8_0 codes (rows K
 * apart, scales d K / 32 apart); bias and y float32, y rows ldy apart. R and C are compile-time constants. */
static inline __attribute__((always_inline)) void tile_i16(const int R, const int C, const int16_t *xq,
                                                           const float *xs, int64_t K, const int8_t *codes,
                                                           const float *d, const float *bias, float *y, int64_t ldy) {
    const int64_t KB = K / 32;
    __m512 a[4][4];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) a[i][j] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < KB; kb++) {
        __m512 sx[4];
        for (int i = 0; i < R; i++) sx[i] = _mm512_set1_ps(xs[i * KB + kb]);
        for (int j = 0; j < C; j++) {
            _mm_prefetch((const char *)(codes + j * K + 32 * (kb + 4)), _MM_HINT_T0);
            const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(codes + j * K + 32 * kb)));
            const __m512 dw = _mm512_set1_ps(d[j * KB + kb]);
            for (int i = 0; i < R; i++) {
                const __m512i p = _mm512_madd_epi16(w, _mm512_loadu_si512(xq + i * K + 32 * kb)); /* exact */
                a[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, sx[i]), a[i][j]);
            }
        }
    }
    if (C == 4) {
        const __m128 b = bias ? _mm_loadu_ps(bias) : _mm_setzero_ps();
        for (int i = 0; i < R; i++) _mm_storeu_ps(y + i * ldy, _mm_add_ps(fold16x4(a[i][0], a[i][1], a[i][2], a[i][3]), b));
        return;
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) y[i * ldy + j] = fold16(a[i][j]) + (bias ? bias[j] : 0.0f);
}

#define TILE_I16(R, C)                                                                                          \
    tile_i16(R, C, xq + m0 * K, xs + m0 * KB, K, codes + n0 * K, d + n0 * KB, bias ? bias + n0 : 0, y + m0 * N + n0, N)

/* this thread's share (`part` of `parts`) of the strips of 4 columns, in tiles of up to 4 rows */
static void q8_0_i16_part(const int16_t *xq, const float *xs, int64_t M, int64_t K, const int8_t *codes,
                          const float *d, int64_t N, const float *bias, float *y, int part, int parts) {
    const int64_t KB = K / 32;
    int64_t first_block, last_block;
    strips_of((N + STRIP - 1) / STRIP, part, parts, &first_block, &last_block);
    for (int64_t b = first_block; b < last_block; b++) {
        const int64_t nb = b * STRIP, nc = N - nb < STRIP ? N - nb : STRIP;
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t mr = M - m0 < 4 ? M - m0 : 4;
            for (int64_t n0 = nb; n0 < nb + nc; n0 += nc == STRIP ? STRIP : 1) {
                if (nc == STRIP) {
                    BY_ROWS(TILE_I16, STRIP)
                } else {
                    BY_ROWS(TILE_I16, 1)
                }
            }
        }
    }
}

/* x float32 [M, K], codes int8 [N, K], d float32 [N, K / 32], bias float32 [N] or NULL, y float32 [M, N]; xq int16
 * [M, K] and xs float32 [M, K / 32]: room for the quantized inputs, written here; K % 32 == 0 */
void specwire_bf16dot_q8_0_i16(const float *x, int64_t M, int64_t K, const int8_t *codes, const float *d, int64_t N,
                               const float *bias, float *y, int16_t *xq, float *xs, int threads) {
    const int64_t KB = K / 32;
    for (int64_t m = 0; m < M; m++)
        for (int64_t kb = 0; kb < KB; kb++) quantize_block(x + m * K + 32 * kb, xq + m * K + 32 * kb, xs + m * KB + kb);
    _Pragma("omp parallel num_threads(threads)")
    q8_0_i16_part(xq, xs, M, K, codes, d, N, bias, y, omp_get_thread_num(), omp_get_num_threads());
}

int specwire_bf16dot_abi(void) { return 3; }

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
 *
 * Speed, none of which changes a chain: the (row, head) pairs are split into one contiguous range per
 * thread, and the heads of one row that read the same key/value head (up to GMAX) are computed together,
 * sharing each key and value as it is loaded and widened, their chains side by side. The AVX-512 build
 * (-DSPECWIRE_AVX512) also holds two keys' 8-lane score chains in one register (lanes 0-7 and 8-15, each
 * folded as above), takes exp and the value pass 16 lanes at a time (lane-wise operations), and adds the
 * 16 exps to the denominator's 8 lanes as two halves in rank order. The maximum is taken 8 lanes at a time.
 * On a 2-core AMX Xeon, a 9-row tree pass over 300 cached keys of the built-in target (9 heads, 3 key/value
 * heads of 64) went from 142 to 92 us a layer, and a one-token step from 35 to 27 us, bitwise the same.
 * Where dk is a multiple of 8 it also takes the cached prefix's keys four at a time and folds their four score
 * chains together (`fold8x4`: the additions of `fold8`, lane for lane), instead of one fold of scalar steps per
 * key: on a 2-core Zen 4 a pass over 4-16 rows and 256-300 cached keys of the built-in target took about a fifth
 * less time, bitwise the same. The AVX2 build folds two keys' chains at once the same way (`fold8x2`; 5-7% less
 * time for the attention there).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "rowkernels.h"

/* Does query row i see key j? The cached prefix (j < past) always; this pass's key past + t where tail[i, t]
 * (tail NULL: t <= i, causal). */
static inline int sees(int64_t j, int64_t i, int64_t past, int64_t Tq, const uint8_t *tail) {
    return j < past || (tail ? tail[i * Tq + (j - past)] : j - past <= i);
}

#ifdef SPECWIRE_AVX512
/* 16 cache numbers at element e of b as float32 (the AVX-512 build's value pass) */
static inline __attribute__((always_inline)) __m512 kv16(const int BF, const void *b, int64_t e) {
    if (BF) return _mm512_castsi512_ps(_mm512_slli_epi32(
                      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)b + e))), 16));
    return _mm512_loadu_ps((const float *)b + e);
}
#endif

#ifdef SPECWIRE_AVX512
/* 8 cache numbers at element a of b in lanes 0-7 and 8 at element c in lanes 8-15, as float32 */
static inline __attribute__((always_inline)) __m512 kv8x2(const int BF, const void *b, int64_t a, int64_t c) {
    if (BF) {
        const __m256i pair = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)b + a))),
            _mm_loadu_si128((const __m128i *)((const uint16_t *)b + c)), 1);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(pair), 16));
    }
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)b + a)),
                              _mm256_loadu_ps((const float *)b + c), 1);
}
#define QDUP_MAX 256  /* the widest head (dk) the two-key scores take */

/* fold8 of lanes 0-7 and 8-15 of a and of b at once, the same additions lane for lane: the four sums in order */
static inline __attribute__((always_inline)) __m128 fold8x4(__m512 a, __m512 b) {
    /* lane i + lane i+4 of each half: quarters [a 0-7, a 8-15, b 0-7, b 8-15] */
    const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
    const __m512 t = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));        /* i + i+2 */
    const __m512 r = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));        /* i + i+1 */
    return _mm512_castps512_ps128(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), r));
}
#endif

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

#ifdef SPECWIRE_AVX512
/* `exp8` on 16 lanes: the same lane-wise operations, so the same result in every lane */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
#endif

/* fold8 of a and of b at once, the same additions lane for lane: the two sums in lanes 0 and 1 */
static inline __attribute__((always_inline)) __m128 fold8x2(__m256 a, __m256 b) {
    const __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31)); /* i + i+4 */
    const __m256 t = _mm256_add_ps(s, _mm256_permute_ps(s, 0x4E));                                       /* i + i+2 */
    const __m256 r = _mm256_add_ps(t, _mm256_permute_ps(t, 0xB1));                                       /* i + i+1 */
    return _mm256_castps256_ps128(_mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0)));
}

/* lanes 0..k-1 set (k < 8) */
static inline __m256 tail_mask(int64_t k) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), lane));
}

/* Query heads computed together: the heads of one row that read the same key/value head share each key and
 * value as it is loaded (and widened), and their independent chains keep more arithmetic in flight. */
#define GMAX 4
/* Output lanes a pass over the keys accumulates per head: 8 registers of 8 where AVX-512VL gives 32 of them,
 * 2 otherwise (so GMAX heads' accumulators stay in AVX2's 16). Any width gives each lane the same chain. */
#ifdef __AVX512VL__
#define VCHUNK 32
#else
#define VCHUNK 16
#endif

/* The G heads h0..h0+G-1 of query row i, all reading key/value head kh (see the entry points below for the
 * arguments; k and v in float32, or in bf16 (BF), their strides in elements). Each head's result is one fixed
 * chain per number, the same whatever G, the group's other heads, or the thread: G only changes how many
 * chains run side by side. */
static inline __attribute__((always_inline)) void rowattn_group(
        const int BF, const int G, int64_t i, int64_t h0, const float *q, int64_t Tq, int64_t H, int64_t dk,
        int64_t qs_t, int64_t qs_h, const void *k, int64_t kh, int64_t ks_h, int64_t ks_t, const void *v, int64_t dv,
        int64_t vs_h, int64_t vs_t, int64_t past, const uint8_t *tail, float scale, float *work, float *out) {
    const int64_t width = past + Tq, kb = kh * ks_h, vb = kh * vs_h;  /* element offsets of the head's keys, values */
    const float *qi[GMAX];
    float *s[GMAX];
    for (int c = 0; c < G; c++) {
        qi[c] = q + i * qs_t + (h0 + c) * qs_h;
        s[c] = work + (i * H + h0 + c) * width;
    }
    /* 1. scores: one 8-lane chain over dk per (head, key), lanes folded, the tail (dk mod 8) in order */
    const int64_t dk8 = dk & ~(int64_t)7;
    int64_t n = 0, j0 = 0;
#ifdef SPECWIRE_AVX512
    /* two keys of the cached prefix a register: key j's chain in lanes 0-7, key j + 1's in lanes 8-15, each
     * head's query repeated in both halves (laid out once); the fold and the tail as above, per half */
    if (dk8 <= QDUP_MAX) {
        float qd[GMAX][2 * QDUP_MAX] __attribute__((aligned(64)));
        for (int c = 0; c < G; c++)
            for (int64_t d = 0; d < dk8; d += 8) {
                memcpy(qd[c] + 2 * d, qi[c] + d, 8 * sizeof(float));
                memcpy(qd[c] + 2 * d + 8, qi[c] + d, 8 * sizeof(float));
            }
        if (dk8 == dk)
            for (; j0 + 4 <= past; j0 += 4) {  /* two pairs of keys, their four folds at once */
                const int64_t e0 = kb + j0 * ks_t, e2 = e0 + 2 * ks_t;
                __m512 acc[GMAX], acc2[GMAX];
                for (int c = 0; c < G; c++) acc[c] = acc2[c] = _mm512_setzero_ps();
                for (int64_t d = 0; d < dk8; d += 8) {
                    const __m512 kv = kv8x2(BF, k, e0 + d, e0 + ks_t + d), kv2 = kv8x2(BF, k, e2 + d, e2 + ks_t + d);
                    for (int c = 0; c < G; c++) {
                        const __m512 qv = _mm512_load_ps(qd[c] + 2 * d);
                        acc[c] = _mm512_fmadd_ps(qv, kv, acc[c]);
                        acc2[c] = _mm512_fmadd_ps(qv, kv2, acc2[c]);
                    }
                }
                for (int c = 0; c < G; c++) _mm_storeu_ps(s[c] + n, fold8x4(acc[c], acc2[c]));
                n += 4;
            }
        for (; j0 + 2 <= past; j0 += 2) {
            const int64_t e0 = kb + j0 * ks_t;
            __m512 acc[GMAX];
            for (int c = 0; c < G; c++) acc[c] = _mm512_setzero_ps();
            for (int64_t d = 0; d < dk8; d += 8) {
                const __m512 kv = kv8x2(BF, k, e0 + d, e0 + ks_t + d);
                for (int c = 0; c < G; c++) acc[c] = _mm512_fmadd_ps(_mm512_load_ps(qd[c] + 2 * d), kv, acc[c]);
            }
            for (int c = 0; c < G; c++) {
                float r0 = fold8(_mm512_castps512_ps256(acc[c])), r1 = fold8(_mm512_extractf32x8_ps(acc[c], 1));
                for (int64_t d = dk8; d < dk; d++) {
                    r0 = fmaf(qi[c][d], kv1(BF, k, e0 + d), r0);
                    r1 = fmaf(qi[c][d], kv1(BF, k, e0 + ks_t + d), r1);
                }
                s[c][n] = r0;
                s[c][n + 1] = r1;
            }
            n += 2;
        }
    }
#endif
#ifndef SPECWIRE_AVX512
    if (dk8 == dk)
        for (; j0 + 2 <= past; j0 += 2) {  /* two keys of the cached prefix, their folds at once */
            const int64_t e0 = kb + j0 * ks_t, e1 = e0 + ks_t;
            __m256 acc[GMAX], acc1[GMAX];
            for (int c = 0; c < G; c++) acc[c] = acc1[c] = _mm256_setzero_ps();
            for (int64_t d = 0; d < dk8; d += 8) {
                const __m256 kv = kv8(BF, k, e0 + d), kvn = kv8(BF, k, e1 + d);
                for (int c = 0; c < G; c++) {
                    const __m256 qv = _mm256_loadu_ps(qi[c] + d);
                    acc[c] = _mm256_fmadd_ps(qv, kv, acc[c]);
                    acc1[c] = _mm256_fmadd_ps(qv, kvn, acc1[c]);
                }
            }
            for (int c = 0; c < G; c++) _mm_storel_pi((__m64 *)(s[c] + n), fold8x2(acc[c], acc1[c]));
            n += 2;
        }
#endif
    for (int64_t j = j0; j < width; j++) {
        if (j >= past && !sees(j, i, past, Tq, tail)) continue;
        const int64_t e0 = kb + j * ks_t;
        __m256 acc[GMAX];
        for (int c = 0; c < G; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t d = 0; d < dk8; d += 8) {
            const __m256 kv = kv8(BF, k, e0 + d);
            for (int c = 0; c < G; c++) acc[c] = _mm256_fmadd_ps(_mm256_loadu_ps(qi[c] + d), kv, acc[c]);
        }
        for (int c = 0; c < G; c++) {
            float r = fold8(acc[c]);
            for (int64_t d = dk8; d < dk; d++) r = fmaf(qi[c][d], kv1(BF, k, e0 + d), r);
            s[c][n] = r;
        }
        n++;
    }
    float den[GMAX];
    for (int c = 0; c < G; c++) {
        /* 2. the scores times scale, and their maximum: exact in any order, so taken 8 lanes at a time (a
         * maximum of +0 or -0 gives the same s - m below) */
        const __m256 sv = _mm256_set1_ps(scale);
        __m256 mx = _mm256_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s[c] + j), sv);
            _mm256_storeu_ps(s[c] + j, x);
            mx = _mm256_max_ps(mx, x);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, mx);
        float m = -INFINITY;
        for (int t = 0; t < 8; t++) m = lanes[t] > m ? lanes[t] : m;
        for (; j < n; j++) {
            s[c][j] *= scale;
            m = s[c][j] > m ? s[c][j] : m;
        }
        /* 3. e = exp(s - m) in place, 8 ranks at a time (a short last group through a padded copy: every rank
         * takes the same lane-wise arithmetic), and the denominator: rank j into lane j mod 8, folded */
        const __m256 mv = _mm256_set1_ps(m);
        __m256 denv = _mm256_setzero_ps();
        j = 0;
#ifdef SPECWIRE_AVX512
        for (; j + 16 <= n; j += 16) {  /* 16 at a time, the two halves added to the lanes in rank order */
            const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s[c] + j), _mm512_set1_ps(m)));
            _mm512_storeu_ps(s[c] + j, e);
            denv = _mm256_add_ps(denv, _mm512_castps512_ps256(e));
            denv = _mm256_add_ps(denv, _mm512_extractf32x8_ps(e, 1));
        }
#endif
        for (; j < n; j += 8) {
            if (j + 8 <= n) {
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s[c] + j), mv));
                _mm256_storeu_ps(s[c] + j, e);
                denv = _mm256_add_ps(denv, e);
            } else {
                float pad[8] = {0};
                for (int64_t t = j; t < n; t++) pad[t - j] = s[c][t];
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(pad), mv));
                _mm256_storeu_ps(pad, e);
                for (int64_t t = j; t < n; t++) s[c][t] = pad[t - j];
                denv = _mm256_add_ps(denv, _mm256_blendv_ps(_mm256_setzero_ps(), e, tail_mask(n - j)));
            }
        }
        den[c] = fold8(denv);
    }
    /* 4. the values: output lane d = sum over ranks in order of e[rank] * v[key][d], one fused multiply-add
     * each; VCHUNK lanes of every head of the group at a time in registers */
    const int64_t dv8 = dv & ~(int64_t)7;
    int64_t d0 = 0;
#ifdef SPECWIRE_AVX512
    /* 16 lanes a register (lanes are independent chains, so the width changes nothing), 64 a pass */
    for (; d0 + 64 <= dv8; d0 += 64) {
        __m512 acc[GMAX][4];
        for (int c = 0; c < G; c++)
            for (int u = 0; u < 4; u++) acc[c][u] = _mm512_setzero_ps();
        int64_t r = 0;
        for (int64_t j = 0; j < width; j++) {
            if (j >= past && !sees(j, i, past, Tq, tail)) continue;
            const int64_t vj = vb + j * vs_t + d0;
            __m512 ev[GMAX];
            for (int c = 0; c < G; c++) ev[c] = _mm512_set1_ps(s[c][r]);
            for (int u = 0; u < 4; u++) {
                const __m512 vv = kv16(BF, v, vj + 16 * u);
                for (int c = 0; c < G; c++) acc[c][u] = _mm512_fmadd_ps(ev[c], vv, acc[c][u]);
            }
            r++;
        }
        for (int c = 0; c < G; c++) {
            float *o = out + (i * H + h0 + c) * dv;
            for (int u = 0; u < 4; u++) _mm512_storeu_ps(o + d0 + 16 * u, acc[c][u]);
        }
    }
#endif
    for (; d0 < dv8; d0 += VCHUNK) {
        const int nv = (int)((dv8 - d0 < VCHUNK ? dv8 - d0 : VCHUNK) / 8);
        __m256 acc[GMAX][VCHUNK / 8];
        for (int c = 0; c < G; c++)
            for (int u = 0; u < VCHUNK / 8; u++) acc[c][u] = _mm256_setzero_ps();
        int64_t r = 0;
        for (int64_t j = 0; j < width; j++) {
            if (j >= past && !sees(j, i, past, Tq, tail)) continue;
            const int64_t vj = vb + j * vs_t + d0;
            __m256 ev[GMAX];
            for (int c = 0; c < G; c++) ev[c] = _mm256_set1_ps(s[c][r]);
            if (nv == VCHUNK / 8) {  /* (a whole chunk: unrolled, so the accumulators stay in registers) */
                for (int u = 0; u < VCHUNK / 8; u++) {
                    const __m256 vv = kv8(BF, v, vj + 8 * u);
                    for (int c = 0; c < G; c++) acc[c][u] = _mm256_fmadd_ps(ev[c], vv, acc[c][u]);
                }
            } else {
                for (int u = 0; u < nv; u++) {
                    const __m256 vv = kv8(BF, v, vj + 8 * u);
                    for (int c = 0; c < G; c++) acc[c][u] = _mm256_fmadd_ps(ev[c], vv, acc[c][u]);
                }
            }
            r++;
        }
        for (int c = 0; c < G; c++) {
            float *o = out + (i * H + h0 + c) * dv;
            for (int u = 0; u < nv; u++) _mm256_storeu_ps(o + d0 + 8 * u, acc[c][u]);
        }
    }
    for (int c = 0; c < G; c++) {
        float *o = out + (i * H + h0 + c) * dv;
        for (int64_t d = dv8; d < dv; d++) {
            float a = 0.0f;
            int64_t r = 0;
            for (int64_t j = 0; j < width; j++) {
                if (j >= past && !sees(j, i, past, Tq, tail)) continue;
                a = fmaf(s[c][r++], kv1(BF, v, vb + j * vs_t + d), a);
            }
            o[d] = a;
        }
        /* 5. each output lane divided by the denominator (the same division whatever the lane) */
        for (int64_t d = 0; d < dv; d++) o[d] = o[d] / den[c];
    }
}

/* The pass's (row, head) pairs p = i * H + h, split into contiguous ranges, one per thread, each range walked in
 * groups of up to GMAX consecutive heads that share a row and a key/value head. */
static inline __attribute__((always_inline)) void rowattn_pass(
        const int BF, const float *q, int64_t Tq, int64_t H, int64_t dk, int64_t qs_t, int64_t qs_h,
        const void *k, int64_t Hkv, int64_t ks_h, int64_t ks_t, const void *v, int64_t dv, int64_t vs_h, int64_t vs_t,
        int64_t past, const uint8_t *tail, float scale, float *work, float *out, int threads) {
    const int64_t g = H / Hkv, P = Tq * H;
#pragma omp parallel num_threads(threads)
    {
        const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t last = P * (tid + 1) / nt;
        for (int64_t p = P * tid / nt; p < last;) {
            const int64_t i = p / H, h = p % H, kh = h / g;
            int64_t end = i * H + (kh + 1) * g;  /* the first pair past this key/value head's query heads */
            end = end < last ? end : last;
            end = end < p + GMAX ? end : p + GMAX;
#define GROUP(G) rowattn_group(BF, G, i, h, q, Tq, H, dk, qs_t, qs_h, k, kh, ks_h, ks_t, v, dv, vs_h, vs_t, past, \
                               tail, scale, work, out)
            switch (end - p) {
                case 1: GROUP(1); break;
                case 2: GROUP(2); break;
                case 3: GROUP(3); break;
                default: GROUP(4); break;
            }
#undef GROUP
            p = end;
        }
    }
}

/* q: [Tq, H, dk] at strides (qs_t, qs_h), k: [Hkv, Tk, dk] at (ks_h, ks_t), v: [Hkv, Tk, dv] at (vs_h, vs_t),
 * innermost dimensions contiguous. Row i sees keys 0..past-1, then past + j for j < Tq where tail[i * Tq + j]
 * (tail NULL: j <= i, causal). work: [Tq * H, past + Tq] floats. out: [Tq, H, dv], contiguous. */
void specwire_rowattn_f32(const float *q, int64_t Tq, int64_t H, int64_t dk, int64_t qs_t, int64_t qs_h,
                          const float *k, int64_t Hkv, int64_t ks_h, int64_t ks_t, const float *v, int64_t dv,
                          int64_t vs_h, int64_t vs_t, int64_t past, const uint8_t *tail, float scale, float *work,
                          float *out, int threads) {
    rowattn_pass(0, q, Tq, H, dk, qs_t, qs_h, k, Hkv, ks_h, ks_t, v, dv, vs_h, vs_t, past, tail, scale, work, out, threads);
}

/* The same with k and v in bf16 (strides in elements): bitwise the float32 result over the widened cache. */
void specwire_rowattn_bf16kv(const float *q, int64_t Tq, int64_t H, int64_t dk, int64_t qs_t, int64_t qs_h,
                             const uint16_t *k, int64_t Hkv, int64_t ks_h, int64_t ks_t, const uint16_t *v, int64_t dv,
                             int64_t vs_h, int64_t vs_t, int64_t past, const uint8_t *tail, float scale, float *work,
                             float *out, int threads) {
    rowattn_pass(1, q, Tq, H, dk, qs_t, qs_h, k, Hkv, ks_h, ks_t, v, dv, vs_h, vs_t, past, tail, scale, work, out, threads);
}

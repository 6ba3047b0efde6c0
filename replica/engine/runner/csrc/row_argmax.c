/* Greedy picks for a batch: per row of float32 logits, the index of the first maximum, and
 * whether the row is fit to sample from (no NaN, no +inf, not all -inf).
 *
 * torch.argmax on CPU runs a scalar loop (15x torch.amax at [64, 49152]); this is one pass,
 * 16 lanes at a time, parallel over rows. Lane j keeps the first index of its own maximum
 * (updated on strictly greater only); the row's answer is the smallest index among the lanes
 * holding the overall maximum: exactly the first occurrence, as torch.argmax gives.
 *
 *   logits [rows, n] float32 row-major;  index [rows] int64;  fit [rows] uint8 (1 = fit)
 */
#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__) && !defined(NATIVE_PORTABLE)
#include <immintrin.h>

static void row_avx512(const float *x, int64_t n, int64_t *index, uint8_t *fit) {
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i best_i = _mm512_set1_epi32(0);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        best = _mm512_mask_mov_ps(best, gt, v);
        best_i = _mm512_mask_mov_epi32(best_i, gt, idx);
        idx = _mm512_add_epi32(idx, step);
    }
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, x + i);
        nan |= _mm512_mask_cmp_ps_mask(tail, v, v, _CMP_UNORD_Q);
        const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        best = _mm512_mask_mov_ps(best, gt, v);
        best_i = _mm512_mask_mov_epi32(best_i, gt, idx);
    }
    const float m = _mm512_reduce_max_ps(best);
    const __mmask16 at_max = _mm512_cmp_ps_mask(best, _mm512_set1_ps(m), _CMP_EQ_OQ);
    *index = _mm512_mask_reduce_min_epi32(at_max, best_i);
    *fit = !nan && isfinite(m);
}
#endif

static void row_portable(const float *x, int64_t n, int64_t *index, uint8_t *fit) {
    float m = -INFINITY;
    int64_t at = 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) bad = 1;
        else if (x[i] > m) { m = x[i]; at = i; }
    }
    *index = at;
    *fit = !bad && isfinite(m);
}

/* Returns 0, or -1 when a row is longer than the int32 lane indices reach. */
int row_argmax(const float *logits, int64_t rows, int64_t n, int64_t *index, uint8_t *fit, int64_t num_threads) {
    if (n <= 0 || n >= INT32_MAX) return -1;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++) {
#if defined(__AVX512F__) && !defined(NATIVE_PORTABLE)
        row_avx512(logits + r * n, n, index + r, fit + r);
#else
        row_portable(logits + r * n, n, index + r, fit + r);
#endif
    }
    return 0;
}

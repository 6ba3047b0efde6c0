/* The element-wise ops of a Llama step in C, and a whole decode step's decoder layers in one call.
 *
 * silu_mul:   act = silu(gate) * up from the fused [rows, 2I] gate_up output, one pass (torch:
 *             silu, then mul: two ops, two outputs). dtype 0 float32, 1 bfloat16. bfloat16
 *             rounds as torch does: silu(gate) computed in float32 and rounded, then the product
 *             rounded. silu(x) = x / (1 + exp(-x)) (torch's formula); exp is a vector
 *             polynomial on AVX-512 (within 2 ulp of expf), expf on the portable path.
 * rope:       RoPE applied in place to the first `heads` heads of each row (q and k of the fused
 *             qkv output): x[d] = x[d] cos[d] - x[d + hd/2] sin[d], x[d + hd/2] = x[d + hd/2]
 *             cos[d + hd/2] + x[d] sin[d + hd/2] (torch: qk * cos + rotate_half(qk) * sin: 5 ops
 *             and 4 temporaries). bfloat16: each product rounded, then the sum (the same bits as
 *             torch's bf16 ops); float32 without contraction into FMAs (the same bits as well).
 * decode_layers: every decoder layer of a decode step of M <= 8 sequences (one token each) with
 *             GGUF-block projections and bfloat16 activations, in one call: per layer RMSNorm,
 *             qkv product, RoPE, the K/V write into the paged pools, paged decode attention, o
 *             product, residual add + RMSNorm, gate_up product, SiLU x mul, down product,
 *             residual add. The products, the attention and the norms are the engine's own
 *             kernels (gguf_matmul.c, paged_attention.c, rms_norm.c), passed in as function
 *             pointers, so the arithmetic is the module path's op for op; what goes is Python,
 *             ~20 torch dispatches and allocations a layer, and 4 ctypes calls a layer.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { DT_F32 = 0, DT_BF16 = 1 };

static inline float bf16_to_float(uint16_t v) {
    union { uint32_t u; float f; } c = {.u = (uint32_t)v << 16};
    return c.f;
}

static inline uint16_t float_to_bf16(float f) { /* round to nearest even, NaN kept quiet */
    union { float f; uint32_t u; } c = {.f = f};
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40);
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

#if defined(__AVX512F__) && !defined(NATIVE_PORTABLE)
#include <immintrin.h>
#define HAVE_AVX512 1

/* Cephes' expf on 16 lanes (as paged_attention.c), the upper end left to overflow to +inf */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
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
    return _mm512_scalef_ps(p, n);
}

static inline __m512 load_bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* round to nearest even, NaN kept quiet: float_to_bf16 on 16 lanes */
static inline __m256i to_bf16x16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

static inline __m512 silu16(__m512 g) {
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}
#else
#define HAVE_AVX512 0
#endif

static inline float silu1(float g) {
#if HAVE_AVX512
    float v[16] = {g}; /* the same polynomial as the vector lanes, so a row's tail rounds alike */
    _mm512_storeu_ps(v, silu16(_mm512_loadu_ps(v)));
    return v[0];
#else
    return g / (1.0f + expf(-g));
#endif
}

static void silu_mul_row(const void *gate_up, void *out, int64_t inter, int dtype) {
    int64_t i = 0;
    if (dtype == DT_BF16) {
        const uint16_t *g = gate_up, *u = (const uint16_t *)gate_up + inter;
        uint16_t *o = out;
#if HAVE_AVX512
        for (; i + 16 <= inter; i += 16) {
            const __m512 s = load_bf16x16(g + i);
            const __m256i s16 = to_bf16x16(silu16(s));
            const __m512 silu_r = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(s16), 16));
            _mm256_storeu_si256((__m256i *)(o + i), to_bf16x16(_mm512_mul_ps(silu_r, load_bf16x16(u + i))));
        }
#endif
        for (; i < inter; i++) o[i] = float_to_bf16(round_bf16(silu1(bf16_to_float(g[i]))) * bf16_to_float(u[i]));
    } else {
        const float *g = gate_up, *u = (const float *)gate_up + inter;
        float *o = out;
#if HAVE_AVX512
        for (; i + 16 <= inter; i += 16)
            _mm512_storeu_ps(o + i, _mm512_mul_ps(silu16(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
#endif
        for (; i < inter; i++) o[i] = silu1(g[i]) * u[i];
    }
}

/* gate_up [rows, 2 * inter] (gate columns first), out [rows, inter], both contiguous.
 * Returns 0, or -1 for an unsupported dtype. */
int silu_mul(const void *gate_up, void *out, int64_t rows, int64_t inter, int64_t dtype, int64_t num_threads) {
    if (dtype != DT_F32 && dtype != DT_BF16) return -1;
    const int64_t elt = dtype == DT_BF16 ? 2 : 4;
    const int parallel = num_threads > 1 && rows * inter >= 32768;
#pragma omp parallel for schedule(static) num_threads(num_threads) if(parallel)
    for (int64_t r = 0; r < rows; r++)
        silu_mul_row((const char *)gate_up + r * 2 * inter * elt, (char *)out + r * inter * elt, inter, (int)dtype);
    return 0;
}

/* One row's `heads` heads of hd values, cos / sin [hd] of the row's position. */
__attribute__((optimize("fp-contract=off")))
static void rope_row(void *x, int64_t heads, int64_t hd, const void *cos, const void *sin, int dtype) {
    const int64_t half = hd / 2;
    if (dtype == DT_BF16) {
        const uint16_t *c = cos, *s = sin;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t *v = (uint16_t *)x + h * hd;
            for (int64_t d = 0; d < half; d++) {
                const float a = bf16_to_float(v[d]), b = bf16_to_float(v[d + half]);
                const float lo = round_bf16(a * bf16_to_float(c[d])) + round_bf16(-b * bf16_to_float(s[d]));
                const float hi = round_bf16(b * bf16_to_float(c[d + half])) + round_bf16(a * bf16_to_float(s[d + half]));
                v[d] = float_to_bf16(lo);
                v[d + half] = float_to_bf16(hi);
            }
        }
    } else {
        const float *c = cos, *s = sin;
        for (int64_t h = 0; h < heads; h++) {
            float *v = (float *)x + h * hd;
            for (int64_t d = 0; d < half; d++) {
                const float a = v[d], b = v[d + half];
                const float p0 = a * c[d], p1 = -b * s[d], p2 = b * c[d + half], p3 = a * s[d + half];
                v[d] = p0 + p1;
                v[d + half] = p2 + p3;
            }
        }
    }
}

/* x: rows of `row_stride` elements, the first `heads` * hd of each rotated in place; cos, sin
 * [rows, hd] contiguous in x's dtype. Returns 0, or -1 for an odd head dim or unknown dtype. */
int rope(void *x, int64_t rows, int64_t row_stride, int64_t heads, int64_t hd, const void *cos, const void *sin,
         int64_t dtype, int64_t num_threads) {
    if ((dtype != DT_F32 && dtype != DT_BF16) || hd % 2 || heads * hd > row_stride) return -1;
    const int64_t elt = dtype == DT_BF16 ? 2 : 4;
    const int parallel = num_threads > 1 && rows * heads * hd >= 32768;
#pragma omp parallel for schedule(static) num_threads(num_threads) if(parallel)
    for (int64_t r = 0; r < rows; r++)
        rope_row((char *)x + r * row_stride * elt, heads, hd, (const char *)cos + r * hd * elt,
                 (const char *)sin + r * hd * elt, (int)dtype);
    return 0;
}

/* ---- a decode step's decoder layers in one call ---- */

typedef int (*gguf_matmul_fn)(const void *w, int64_t type, const void *x, void *y, int64_t M, int64_t N, int64_t K,
                              int64_t num_threads, int64_t io_dtype);
typedef int (*attention_fn)(const float *q, const void *k_pool, const void *v_pool, const int64_t *block_tables,
                            const int64_t *context_lens, float *out, int64_t B, int64_t nh, int64_t kvh, int64_t hd,
                            int64_t block_size, int64_t max_blocks, float scale, int64_t kv_dtype, int64_t num_threads);
typedef int (*rms_norm_fn)(const uint16_t *x, const uint16_t *residual, const uint16_t *weight, uint16_t *h,
                           uint16_t *out, int64_t rows, int64_t hidden, float eps);

typedef struct { /* one decoder layer: bfloat16 norms, GGUF blocks (type ids as gguf_matmul's), bf16 pools */
    const void *input_norm, *post_norm;
    const void *qkv, *o, *gate_up, *down;
    int64_t qkv_type, o_type, gate_up_type, down_type;
    void *k_pool, *v_pool;
} decode_layer;

typedef struct {
    gguf_matmul_fn matmul;
    attention_fn attention;
    rms_norm_fn rms_norm;
} decode_kernels;

#define MAX_DECODE_ROWS 8
#define KV_BF16 1

/* x [M, hidden] bfloat16, the residual stream: replaced by the last layer's output.
 * cos, sin [M, hd] bfloat16; slots [M]; block_tables [M, max_blocks]; context_lens [M] (int64).
 * Returns 0, or a negative code: -1 shape, -2 out of memory, -3 a kernel refused. */
static int decode_layers_team(const decode_layer *layers, int64_t num_layers, const decode_kernels *k, uint16_t *x,
                              int64_t M, const uint16_t *cos, const uint16_t *sin, const int64_t *slots,
                              const int64_t *block_tables, int64_t max_blocks, const int64_t *context_lens,
                              int64_t hidden, int64_t nh, int64_t kvh, int64_t hd, int64_t inter, int64_t block_size,
                              float eps, float scale, int64_t num_threads);

/* 1 (default): with num_threads > 1, one OpenMP region for the whole call (decode_layers_team);
 * 0: each kernel opens its own region (~150 a batch-1 step). Batch-1 int4 step at 2 threads,
 * alternated with the per-kernel regions: 0.88x the time on a quiet 2-vCPU Zen 5 (2.66 vs 3.02 ms)
 * and 0.77x under load, 0.9-1.1x on a shared Xeon (docs/engine.md). DecodeOps.set_team switches. */
static int team_mode = 1;
void decode_layers_set_team(int64_t on) { team_mode = on != 0; }

int decode_layers(const decode_layer *layers, int64_t num_layers, const decode_kernels *k, uint16_t *x, int64_t M,
                  const uint16_t *cos, const uint16_t *sin, const int64_t *slots, const int64_t *block_tables,
                  int64_t max_blocks, const int64_t *context_lens, int64_t hidden, int64_t nh, int64_t kvh,
                  int64_t hd, int64_t inter, int64_t block_size, float eps, float scale, int64_t num_threads) {
    if (M < 1 || M > MAX_DECODE_ROWS || hd % 2 || nh % kvh) return -1;
#ifdef _OPENMP
    if (team_mode && num_threads > 1)
        return decode_layers_team(layers, num_layers, k, x, M, cos, sin, slots, block_tables, max_blocks,
                                  context_lens, hidden, nh, kvh, hd, inter, block_size, eps, scale, num_threads);
#endif
    const int64_t qkv_cols = (nh + 2 * kvh) * hd, q_cols = nh * hd, kv_cols = kvh * hd;
    /* one scratch allocation for the step: bf16 buffers, then float32 ones */
    const size_t bf16_elems = (size_t)M * (size_t)(qkv_cols + q_cols + 4 * hidden + 3 * inter);
    const size_t f32_elems = (size_t)M * (size_t)(2 * q_cols);
    char *scratch = malloc(bf16_elems * 2 + f32_elems * 4 + 64);
    if (!scratch) return -2;
    uint16_t *qkv = (uint16_t *)scratch, *att = qkv + M * qkv_cols, *normed = att + M * q_cols;
    uint16_t *o = normed + M * hidden, *h = o + M * hidden, *down = h + M * hidden;
    uint16_t *gate_up = down + M * hidden, *act = gate_up + M * 2 * inter;
    float *q32 = (float *)(((uintptr_t)(act + M * inter) + 63) & ~(uintptr_t)63), *att32 = q32 + M * q_cols;
    int status = 0;
    for (int64_t l = 0; l < num_layers && !status; l++) {
        const decode_layer *L = layers + l;
        if (k->rms_norm(x, NULL, L->input_norm, NULL, normed, M, hidden, eps) ||
            k->matmul(L->qkv, L->qkv_type, normed, qkv, M, qkv_cols, hidden, num_threads, DT_BF16)) {
            status = -3;
            break;
        }
        for (int64_t r = 0; r < M; r++) {
            uint16_t *row = qkv + r * qkv_cols;
            rope_row(row, nh + kvh, hd, cos + r * hd, sin + r * hd, DT_BF16);
            const int64_t slot = slots[r];
            memcpy((uint16_t *)L->k_pool + slot * kv_cols, row + q_cols, (size_t)kv_cols * 2);
            memcpy((uint16_t *)L->v_pool + slot * kv_cols, row + q_cols + kv_cols, (size_t)kv_cols * 2);
            for (int64_t i = 0; i < q_cols; i++) q32[r * q_cols + i] = bf16_to_float(row[i]);
        }
        if (k->attention(q32, L->k_pool, L->v_pool, block_tables, context_lens, att32, M, nh, kvh, hd, block_size,
                         max_blocks, scale, KV_BF16, num_threads)) {
            status = -3;
            break;
        }
        for (int64_t i = 0; i < M * q_cols; i++) att[i] = float_to_bf16(att32[i]);
        if (k->matmul(L->o, L->o_type, att, o, M, hidden, q_cols, num_threads, DT_BF16) ||
            k->rms_norm(x, o, L->post_norm, h, normed, M, hidden, eps) ||
            k->matmul(L->gate_up, L->gate_up_type, normed, gate_up, M, 2 * inter, hidden, num_threads, DT_BF16)) {
            status = -3;
            break;
        }
        for (int64_t r = 0; r < M; r++) silu_mul_row(gate_up + r * 2 * inter, act + r * inter, inter, DT_BF16);
        if (k->matmul(L->down, L->down_type, act, down, M, hidden, inter, num_threads, DT_BF16)) {
            status = -3;
            break;
        }
        for (int64_t i = 0; i < M * hidden; i++) x[i] = float_to_bf16(bf16_to_float(h[i]) + bf16_to_float(down[i]));
    }
    free(scratch);
    return status;
}

#ifdef _OPENMP
/* ---- the same step with one thread team for the whole call ----
 * The ~150 parallel regions a batch-1 step opens (one per product and attention call) cost a
 * thread wake-up each; here the team is started once and meets at 5 barriers a layer:
 *   each thread: input RMSNorm (redundantly, into its own buffer; M x hidden is tiny), its
 *     share of the qkv output rows                                                  | barrier
 *   rows r = t, t + nt, ...: RoPE, the K/V write, q -> float32, attention, -> bf16  | barrier
 *   its share of the o rows                                                         | barrier
 *   residual add + RMSNorm (redundantly, own buffers), its share of gate_up          | barrier
 *   SiLU x mul (redundantly, own buffer), its share of down, then x for those columns| barrier
 * Every output element is computed by the same kernel call on the same inputs as the one-team
 * path (each product row, each (sequence, KV head) of attention is independent), so the result
 * is bit-equal. Kernel refusals are recorded and returned after the whole pass (no early exit:
 * every thread must meet every barrier). */

static int64_t gguf_type_bytes(int64_t type) { /* bytes per 32-value block: Q4_0, Q4_1, Q8_0 (108: Q8_0, float x) */
    return type == 2 ? 18 : type == 3 ? 20 : (type == 8 || type == 108) ? 34 : 0;
}

/* thread t of nt: rows [n0, n1) of N, split in multiples of 16 */
static inline void share(int64_t N, int t, int nt, int64_t *n0, int64_t *n1) {
    const int64_t per = ((N + nt - 1) / nt + 15) & ~(int64_t)15;
    *n0 = t * per < N ? t * per : N;
    *n1 = (t + 1) * per < N ? (t + 1) * per : N;
}

/* this thread's rows of y [M, N] = x [M, K] @ W^T, one thread (tmp: M x its share, for M > 1) */
static int part_matmul(const decode_kernels *k, const void *w, int64_t type, const uint16_t *xin, uint16_t *y,
                       int64_t M, int64_t N, int64_t K, int t, int nt, uint16_t *tmp, int64_t *n0, int64_t *n1) {
    share(N, t, nt, n0, n1);
    const int64_t n = *n1 - *n0;
    if (n <= 0) return 0;
    const void *ws = (const char *)w + *n0 * (K / 32) * gguf_type_bytes(type);
    if (M == 1) return k->matmul(ws, type, xin, y + *n0, 1, n, K, 1, DT_BF16);
    if (k->matmul(ws, type, xin, tmp, M, n, K, 1, DT_BF16)) return -1;
    for (int64_t r = 0; r < M; r++) memcpy(y + r * N + *n0, tmp + r * n, (size_t)n * 2);
    return 0;
}

static int decode_layers_team(const decode_layer *layers, int64_t num_layers, const decode_kernels *k, uint16_t *x,
                              int64_t M, const uint16_t *cos, const uint16_t *sin, const int64_t *slots,
                              const int64_t *block_tables, int64_t max_blocks, const int64_t *context_lens,
                              int64_t hidden, int64_t nh, int64_t kvh, int64_t hd, int64_t inter, int64_t block_size,
                              float eps, float scale, int64_t num_threads) {
    for (int64_t l = 0; l < num_layers; l++) { /* refuse unknown block types before the team starts */
        const decode_layer *L = layers + l;
        if (!gguf_type_bytes(L->qkv_type) || !gguf_type_bytes(L->o_type) || !gguf_type_bytes(L->gate_up_type) ||
            !gguf_type_bytes(L->down_type))
            return -3;
    }
    const int64_t qkv_cols = (nh + 2 * kvh) * hd, q_cols = nh * hd, kv_cols = kvh * hd;
    int64_t max_n = qkv_cols > 2 * inter ? qkv_cols : 2 * inter;
    if (hidden > max_n) max_n = hidden;
    /* shared: qkv, att, o, gate_up, down (bf16), q32, att32 (float32) */
    const size_t shared_bf16 = (size_t)M * (size_t)(qkv_cols + q_cols + 2 * hidden + 2 * inter);
    char *shared = malloc(shared_bf16 * 2 + (size_t)M * (size_t)(2 * q_cols) * 4 + 64);
    if (!shared) return -2;
    uint16_t *qkv = (uint16_t *)shared, *att = qkv + M * qkv_cols, *o = att + M * q_cols, *down = o + M * hidden;
    uint16_t *gate_up = down + M * hidden;
    float *q32 = (float *)(((uintptr_t)(gate_up + M * 2 * inter) + 63) & ~(uintptr_t)63), *att32 = q32 + M * q_cols;
    int status = 0;
#pragma omp parallel num_threads(num_threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        /* own: normed, h [M, hidden], act [M, inter], tmp [M, max_n] */
        uint16_t *own = malloc((size_t)M * (size_t)(2 * hidden + inter + max_n) * 2);
        int err = own ? 0 : -2;
        uint16_t *normed = own, *h = own ? normed + M * hidden : NULL, *act = own ? h + M * hidden : NULL;
        uint16_t *tmp = own ? act + M * inter : NULL;
        int64_t n0, n1;
        for (int64_t l = 0; l < num_layers; l++) {
            const decode_layer *L = layers + l;
            if (!err && (k->rms_norm(x, NULL, L->input_norm, NULL, normed, M, hidden, eps) ||
                         part_matmul(k, L->qkv, L->qkv_type, normed, qkv, M, qkv_cols, hidden, t, nt, tmp, &n0, &n1)))
                err = -3;
#pragma omp barrier
            for (int64_t r = t; r < M && !err; r += nt) {
                uint16_t *row = qkv + r * qkv_cols;
                rope_row(row, nh + kvh, hd, cos + r * hd, sin + r * hd, DT_BF16);
                const int64_t slot = slots[r];
                memcpy((uint16_t *)L->k_pool + slot * kv_cols, row + q_cols, (size_t)kv_cols * 2);
                memcpy((uint16_t *)L->v_pool + slot * kv_cols, row + q_cols + kv_cols, (size_t)kv_cols * 2);
                for (int64_t i = 0; i < q_cols; i++) q32[r * q_cols + i] = bf16_to_float(row[i]);
                if (k->attention(q32 + r * q_cols, L->k_pool, L->v_pool, block_tables + r * max_blocks,
                                 context_lens + r, att32 + r * q_cols, 1, nh, kvh, hd, block_size, max_blocks, scale,
                                 KV_BF16, 1))
                    err = -3;
                for (int64_t i = 0; i < q_cols; i++) att[r * q_cols + i] = float_to_bf16(att32[r * q_cols + i]);
            }
#pragma omp barrier
            if (!err && part_matmul(k, L->o, L->o_type, att, o, M, hidden, q_cols, t, nt, tmp, &n0, &n1)) err = -3;
#pragma omp barrier
            if (!err && (k->rms_norm(x, o, L->post_norm, h, normed, M, hidden, eps) ||
                         part_matmul(k, L->gate_up, L->gate_up_type, normed, gate_up, M, 2 * inter, hidden, t, nt,
                                     tmp, &n0, &n1)))
                err = -3;
#pragma omp barrier
            if (!err) {
                for (int64_t r = 0; r < M; r++) silu_mul_row(gate_up + r * 2 * inter, act + r * inter, inter, DT_BF16);
                if (part_matmul(k, L->down, L->down_type, act, down, M, hidden, inter, t, nt, tmp, &n0, &n1)) err = -3;
                else
                    for (int64_t r = 0; r < M; r++)
                        for (int64_t i = r * hidden + n0; i < r * hidden + n1; i++)
                            x[i] = float_to_bf16(bf16_to_float(h[i]) + bf16_to_float(down[i]));
            }
#pragma omp barrier
        }
        free(own);
        if (err) {
#pragma omp atomic write
            status = err;
        }
    }
    free(shared);
    return status;
}
#endif

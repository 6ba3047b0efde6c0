/* RMSNorm of bfloat16 rows, optionally after the residual add, in one pass over each row.
 *
 *   h   = x + residual            (rounded to bfloat16, as torch's bf16 add; h = x without residual)
 *   out = weight * bf16(h * 1/sqrt(mean(h^2) + eps))   (the product rounded to bfloat16)
 *
 * The same arithmetic as the model's PyTorch path (and Hugging Face's LlamaRMSNorm): h widened
 * to float32, the mean of squares in float32, the normalised value rounded to bfloat16 before
 * the weight multiplies it. Rounding: to nearest even, NaN kept quiet. Replaces 8-10 small torch
 * ops per norm (float(), pow, mean, add, rsqrt, mul, to(), mul, and the residual add).
 * x, residual, h, out: [rows, hidden] bfloat16 contiguous; weight [hidden] bfloat16. h may be
 * NULL when residual is NULL. Single-threaded: a decode batch is tens of kilobytes.
 */
#include <math.h>
#include <stdint.h>

static inline float bf16_to_float(uint16_t v) {
    union { uint32_t u; float f; } c = {.u = (uint32_t)v << 16};
    return c.f;
}

static inline uint16_t float_to_bf16(float f) {
    union { float f; uint32_t u; } c = {.f = f};
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40);
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

#define MAX_HIDDEN 16384

/* Returns 0, or -1 for a hidden size beyond MAX_HIDDEN. */
int rms_norm_bf16(const uint16_t *x, const uint16_t *residual, const uint16_t *weight, uint16_t *h,
                  uint16_t *out, int64_t rows, int64_t hidden, float eps) {
    if (hidden < 1 || hidden > MAX_HIDDEN) return -1;
    float row[MAX_HIDDEN];
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * hidden;
        float sum = 0.f;
        if (residual) {
            const uint16_t *rr = residual + r * hidden;
            uint16_t *hr = h + r * hidden;
            for (int64_t i = 0; i < hidden; i++) {
                const uint16_t v = float_to_bf16(bf16_to_float(xr[i]) + bf16_to_float(rr[i]));
                hr[i] = v;
                row[i] = bf16_to_float(v);
                sum += row[i] * row[i];
            }
        } else {
            for (int64_t i = 0; i < hidden; i++) {
                row[i] = bf16_to_float(xr[i]);
                sum += row[i] * row[i];
            }
        }
        const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
        uint16_t *o = out + r * hidden;
        for (int64_t i = 0; i < hidden; i++)
            o[i] = float_to_bf16(bf16_to_float(weight[i]) * bf16_to_float(float_to_bf16(row[i] * inv)));
    }
    return 0;
}

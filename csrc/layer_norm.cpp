// Layer normalisation of a few rows (see layer_norm.h for why it is written by hand).
#include "layer_norm.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "bf16.h"
#include "cpu.h"

namespace fastdpr::layer_norm {
namespace {

void scalar(const float* x_f32, const uint16_t* x_bf16, int64_t rows, int64_t width, const float* gamma,
            const float* beta, float eps, float* out_f32, uint16_t* out_bf16) {
    for (int64_t r = 0; r < rows; ++r) {
        const auto at = [&](int64_t i) {
            return x_f32 != nullptr ? x_f32[r * width + i] : bf16::to_float(x_bf16[r * width + i]);
        };
        float sum = 0.0f;
        for (int64_t i = 0; i < width; ++i) sum += at(i);
        const float mean = sum / static_cast<float>(width);
        float sq = 0.0f;
        for (int64_t i = 0; i < width; ++i) sq += (at(i) - mean) * (at(i) - mean);
        const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(width) + eps);
        for (int64_t i = 0; i < width; ++i) {
            const float y = (at(i) - mean) * rstd * gamma[i] + beta[i];
            if (out_f32 != nullptr) out_f32[r * width + i] = y;
            else out_bf16[r * width + i] = bf16::from_float(y);
        }
    }
}

#if defined(__x86_64__) || defined(_M_X64)
#define FASTDPR_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))

FASTDPR_AVX512BW inline __m512 load(const float* x_f32, const uint16_t* x_bf16, int64_t at, __mmask16 mask) {
    if (x_f32 != nullptr) return _mm512_maskz_loadu_ps(mask, x_f32 + at);
    return bf16::widen16(_mm256_maskz_loadu_epi16(mask, x_bf16 + at));
}

// Round to nearest even in integer arithmetic (AVX-512F has no bf16 conversion), NaNs kept quiet: the same bits
// as bf16::from_float and vcvtneps2bf16.
FASTDPR_AVX512BW inline __m256i to_bf16(__m512 y) {
    const __m512i bits = _mm512_castps_si512(y);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(rounded);
}

FASTDPR_AVX512BW void avx512(const float* x_f32, const uint16_t* x_bf16, int64_t rows, int64_t width,
                            const float* gamma, const float* beta, float eps, float* out_f32, uint16_t* out_bf16) {
    const auto mask_at = [width](int64_t i) {
        return width - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (width - i)) - 1);
    };
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = r * width;
        __m512 sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < width; i += 16) sum = _mm512_add_ps(sum, load(x_f32, x_bf16, base + i, mask_at(i)));
        const float mean = _mm512_reduce_add_ps(sum) / static_cast<float>(width);
        const __m512 vmean = _mm512_set1_ps(mean);
        __m512 sq = _mm512_setzero_ps();
        for (int64_t i = 0; i < width; i += 16) {
            const __mmask16 m = mask_at(i);
            const __m512 d = _mm512_maskz_sub_ps(m, load(x_f32, x_bf16, base + i, m), vmean);
            sq = _mm512_fmadd_ps(d, d, sq);
        }
        const float rstd = 1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(width) + eps);
        const __m512 vrstd = _mm512_set1_ps(rstd);
        for (int64_t i = 0; i < width; i += 16) {
            const __mmask16 m = mask_at(i);
            const __m512 d = _mm512_mul_ps(_mm512_sub_ps(load(x_f32, x_bf16, base + i, m), vmean), vrstd);
            const __m512 y =
                _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(m, gamma + i), _mm512_maskz_loadu_ps(m, beta + i));
            if (out_f32 != nullptr) _mm512_mask_storeu_ps(out_f32 + base + i, m, y);
            else _mm256_mask_storeu_epi16(out_bf16 + base + i, m, to_bf16(y));
        }
    }
}
#endif

}  // namespace

void layer_norm(const float* x_f32, const uint16_t* x_bf16, int64_t rows, int64_t width, const float* gamma,
                const float* beta, float eps, float* out_f32, uint16_t* out_bf16, cpu::Level level) {
    if ((x_f32 == nullptr) == (x_bf16 == nullptr) || (out_f32 == nullptr) == (out_bf16 == nullptr))
        throw std::invalid_argument("layer_norm: exactly one input and one output type");
    cpu::require(level, kLevels, "layer_norm");
#if defined(__x86_64__) || defined(_M_X64)
    if (level == cpu::Level::AVX512) return avx512(x_f32, x_bf16, rows, width, gamma, beta, eps, out_f32, out_bf16);
#endif
    scalar(x_f32, x_bf16, rows, width, gamma, beta, eps, out_f32, out_bf16);
}

}  // namespace fastdpr::layer_norm

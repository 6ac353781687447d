#include "sq4.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace fastdpr::sq4 {

void train(const float* x, int64_t n, int64_t d, float* lo, float* step) {
    std::vector<float> hi(static_cast<size_t>(d));
    std::copy(x, x + d, lo);
    std::copy(x, x + d, hi.begin());
    for (int64_t i = 1; i < n; ++i)
        for (int64_t t = 0; t < d; ++t) {
            const float v = x[i * d + t];
            lo[t] = std::min(lo[t], v);
            hi[t] = std::max(hi[t], v);
        }
    for (int64_t t = 0; t < d; ++t) step[t] = (hi[t] - lo[t]) / static_cast<float>(kLevels - 1);
}

static inline uint8_t level_of(float v, float lo, float step) {
    if (!(step > 0.f)) return 0;
    const float c = std::nearbyint((v - lo) / step);  // NaN cannot come: the index refuses non-finite vectors
    return static_cast<uint8_t>(std::clamp(c, 0.f, static_cast<float>(kLevels - 1)));
}

void encode(const float* x, int64_t n, int64_t d, const float* lo, const float* step, uint8_t* codes) {
    const size_t rb = row_bytes(d);
    for (int64_t i = 0; i < n; ++i) {
        const float* xi = x + i * d;
        uint8_t* row = codes + i * rb;
        std::fill(row, row + rb, uint8_t{0});
        for (int64_t t = 0; t < d; ++t) {
            const uint8_t c = level_of(xi[t], lo[t], step[t]);
            row[t / 2] |= static_cast<uint8_t>(t % 2 ? c << 4 : c);
        }
    }
}

float prepare_query(const float* q, int64_t d, const float* lo, const float* step, float* scaled) {
    double off = 0;
    for (int64_t t = 0; t < d; ++t) off += static_cast<double>(q[t]) * lo[t];
    const int64_t whole = d / kBlockDims * kBlockDims;
    for (int64_t b = 0; b < whole; b += kBlockDims)
        for (int64_t j = 0; j < kBlockDims / 2; ++j) {
            scaled[b + j] = q[b + 2 * j] * step[b + 2 * j];
            scaled[b + kBlockDims / 2 + j] = q[b + 2 * j + 1] * step[b + 2 * j + 1];
        }
    for (int64_t t = whole; t < d; ++t) scaled[t] = q[t] * step[t];
    return static_cast<float>(off);
}

void prepare_query(const float* q, int64_t d, const float* lo, const float* step, Query& out) {
    out.scaled.resize(static_cast<size_t>(d));
    out.offset = prepare_query(q, d, lo, step, out.scaled.data());
}

namespace {

// the dimensions past the last whole block, in order
inline float tail(const float* scaled, const uint8_t* row, int64_t d) {
    float s = 0.f;
    for (int64_t t = d / kBlockDims * kBlockDims; t < d; ++t) {
        const uint8_t byte = row[t / 2];
        s += scaled[t] * static_cast<float>(t % 2 ? byte >> 4 : byte & 15);
    }
    return s;
}

float dot_scalar(const float* scaled, const uint8_t* row, int64_t d) {
    float s = 0.f;
    const int64_t whole = d / kBlockDims * kBlockDims;
    for (int64_t b = 0; b < whole; b += kBlockDims) {
        const uint8_t* bytes = row + b / 2;
        for (int64_t j = 0; j < kBlockDims / 2; ++j)
            s += scaled[b + j] * static_cast<float>(bytes[j] & 15) +
                 scaled[b + kBlockDims / 2 + j] * static_cast<float>(bytes[j] >> 4);
    }
    return s + tail(scaled, row, d);
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* scaled, const uint8_t* row, int64_t d) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi32(15);
    const int64_t whole = d / kBlockDims * kBlockDims;
    for (int64_t b = 0; b < whole; b += kBlockDims) {
        const uint8_t* bytes = row + b / 2;
        for (int64_t h = 0; h < 2; ++h) {  // bytes 0-7, then 8-15 of the block
            const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * h)));
            const __m256 even = _mm256_cvtepi32_ps(_mm256_and_si256(w, low));
            const __m256 odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4));
            acc0 = _mm256_fmadd_ps(even, _mm256_loadu_ps(scaled + b + 8 * h), acc0);
            acc1 = _mm256_fmadd_ps(odd, _mm256_loadu_ps(scaled + b + kBlockDims / 2 + 8 * h), acc1);
        }
    }
    const __m256 acc = _mm256_add_ps(acc0, acc1);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1) + tail(scaled, row, d);
}

__attribute__((target("avx512f"))) float dot_avx512(const float* scaled, const uint8_t* row, int64_t d) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi32(15);
    const int64_t whole = d / kBlockDims * kBlockDims;
    for (int64_t b = 0; b < whole; b += kBlockDims) {
        const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b / 2)));
        const __m512 even = _mm512_cvtepi32_ps(_mm512_and_si512(w, low));
        const __m512 odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
        acc0 = _mm512_fmadd_ps(even, _mm512_loadu_ps(scaled + b), acc0);
        acc1 = _mm512_fmadd_ps(odd, _mm512_loadu_ps(scaled + b + kBlockDims / 2), acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + tail(scaled, row, d);
}

}  // namespace

DotFn dot_kernel(cpu::Level level) {
    switch (cpu::require(level, "sq4 scores")) {
        case cpu::Level::Scalar: return dot_scalar;
        case cpu::Level::AVX2: return dot_avx2;
        default: return dot_avx512;
    }
}

}  // namespace fastdpr::sq4

// 16 x 16 (AVX-512) and 8 x 8 (AVX) block transposes of fp32 in registers, shared by the kernels that lay rows out column-major
// (the exact search's vector panels, the fp32 attention's keys). Gathers would do the same with one instruction
// per output vector, but are slow on CPUs with the gather-data-sampling microcode mitigation, where the 16 x 16
// transpose is 64 shuffles and 32 loads/stores for the whole block.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

namespace fastdpr::simd {

// dst[c · ldd + i] = src[i · lds + c] for i, c < 16; rows i >= rows read as zeros. Pairs of rows interleave
// (unpack ps), then quads (unpack pd), then 128-bit lanes (two rounds of shuffle_f32x4).
__attribute__((target("avx512f"), always_inline)) inline void transpose16(const float* src, size_t lds, int rows,
                                                                          float* dst, int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(src + i * lds) : _mm512_setzero_ps();
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // r[4g + c], 128-bit lane l: column 4l + c of rows 4g .. 4g + 3
    for (int g = 0; g < 4; ++g) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
        r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; ++c) {
        const __m512 lo01 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);
        const __m512 hi01 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
        const __m512 lo23 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
        const __m512 hi23 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
        _mm512_storeu_ps(dst + (c + 0) * ldd, _mm512_shuffle_f32x4(lo01, lo23, 0x88));
        _mm512_storeu_ps(dst + (c + 4) * ldd, _mm512_shuffle_f32x4(lo01, lo23, 0xDD));
        _mm512_storeu_ps(dst + (c + 8) * ldd, _mm512_shuffle_f32x4(hi01, hi23, 0x88));
        _mm512_storeu_ps(dst + (c + 12) * ldd, _mm512_shuffle_f32x4(hi01, hi23, 0xDD));
    }
}

// The same for 8 x 8 in AVX registers: unpack ps, shuffle ps, then 128-bit halves.
__attribute__((target("avx"), always_inline)) inline void transpose8(const float* src, size_t lds, int rows,
                                                                     float* dst, int64_t ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(src + i * lds) : _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // r[4g + c], 128-bit half h: column 4h + c of rows 4g .. 4g + 3
    for (int g = 0; g < 2; ++g) {
        r[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        r[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        r[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        r[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
        _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
        _mm256_storeu_ps(dst + (c + 4) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
    }
}

}  // namespace fastdpr::simd
#endif

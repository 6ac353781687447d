// bf16 bit patterns (uint16) to and from float, as the AVX512-BF16 instructions convert them.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace fastdpr::bf16 {

inline float to_float(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Round to nearest even, as vcvtneps2bf16 does; a NaN stays a (quiet) NaN.
inline uint16_t from_float(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

#if defined(__x86_64__) || defined(_M_X64)
// 16 bf16 bit patterns widened to 16 floats (exact: a shift into the high half), with AVX-512F only.
__attribute__((target("avx512f"))) inline __m512 widen16(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
#endif

}  // namespace fastdpr::bf16

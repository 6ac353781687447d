#include "dropout.h"

#include <cmath>
#include <stdexcept>

#include "cpu.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace fastdpr::dropout {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kMix2 = 0x94D049BB133111EBull;

// SplitMix64's output function: a full-avalanche mix of a counter, so neighbouring elements are independent.
inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * kMix1;
    z = (z ^ (z >> 27)) * kMix2;
    return z ^ (z >> 31);
}

void scalar(float* x, int64_t n, uint64_t t, uint64_t seed, float scale) {
    const int64_t pairs = n / 2;
    for (int64_t j = 0; j < pairs; ++j) {
        const uint64_t z = mix(seed + static_cast<uint64_t>(j + 1) * kGolden);
        float* e = x + 2 * j;
        e[0] = (z & 0xFFFFFFFFull) < t ? e[0] * scale : 0.0f;
        e[1] = (z >> 32) < t ? e[1] * scale : 0.0f;
    }
    if (n % 2) {
        const uint64_t z = mix(seed + static_cast<uint64_t>(pairs + 1) * kGolden);
        x[n - 1] = (z & 0xFFFFFFFFull) < t ? x[n - 1] * scale : 0.0f;
    }
}

#if defined(__x86_64__) || defined(_M_X64)
#define FASTDPR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

// 64-bit products from AVX-512F's 32 x 32 -> 64 multiply (the registry's avx512 level does not promise DQ's vpmullq)
FASTDPR_AVX512 inline __m512i mullo64(__m512i a, __m512i b) {
    const __m512i cross = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(a, 32), b),
                                           _mm512_mul_epu32(a, _mm512_srli_epi64(b, 32)));
    return _mm512_add_epi64(_mm512_mul_epu32(a, b), _mm512_slli_epi64(cross, 32));
}

// 16 elements (8 hashes) a step; the 32-bit lanes of the 8 hashes, read as 16 epi32 values, are the elements'
// lanes in order (low lane of hash j for element 2j, high lane for 2j + 1, as in scalar()).
FASTDPR_AVX512 void avx512(float* x, int64_t n, uint64_t t, uint64_t seed, float scale) {
    const __m512i mix1 = _mm512_set1_epi64(static_cast<long long>(kMix1));
    const __m512i mix2 = _mm512_set1_epi64(static_cast<long long>(kMix2));
    const __m512i step = _mm512_set1_epi64(static_cast<long long>(8 * kGolden));
    const __m512i below = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(t)));
    const bool keep_all = t > 0xFFFFFFFFull;
    const __m512 scale16 = _mm512_set1_ps(scale);
    __m512i z = _mm512_set_epi64(static_cast<long long>(seed + 8 * kGolden), static_cast<long long>(seed + 7 * kGolden),
                                 static_cast<long long>(seed + 6 * kGolden), static_cast<long long>(seed + 5 * kGolden),
                                 static_cast<long long>(seed + 4 * kGolden), static_cast<long long>(seed + 3 * kGolden),
                                 static_cast<long long>(seed + 2 * kGolden), static_cast<long long>(seed + 1 * kGolden));
    for (int64_t i = 0; i < n; i += 16) {
        __m512i h = mullo64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), mix1);
        h = mullo64(_mm512_xor_si512(h, _mm512_srli_epi64(h, 27)), mix2);
        h = _mm512_xor_si512(h, _mm512_srli_epi64(h, 31));
        const __mmask16 keep = keep_all ? static_cast<__mmask16>(0xFFFF) : _mm512_cmplt_epu32_mask(h, below);
        const __mmask16 in = n - i >= 16 ? static_cast<__mmask16>(0xFFFF)
                                         : static_cast<__mmask16>((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(in, x + i);
        _mm512_mask_storeu_ps(x + i, in, _mm512_maskz_mul_ps(keep, v, scale16));
        z = _mm512_add_epi64(z, step);
    }
}
#endif

}  // namespace

uint64_t threshold(double keep_prob) {
    if (!(keep_prob > 0.0)) return 0;
    if (keep_prob >= 1.0) return uint64_t{1} << 32;
    return static_cast<uint64_t>(std::llround(keep_prob * 4294967296.0));
}

void apply(float* x, int64_t n, double keep_prob, uint64_t seed, float scale, cpu::Level level) {
    cpu::require(level, kLevels, "dropout");
    const uint64_t t = threshold(keep_prob);
#if defined(__x86_64__) || defined(_M_X64)
    if (level == cpu::Level::AVX512) return avx512(x, n, t, seed, scale);
#endif
    scalar(x, n, t, seed, scale);
}

}  // namespace fastdpr::dropout

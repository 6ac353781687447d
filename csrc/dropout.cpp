#include "dropout.h"

#include <cmath>

namespace fastdpr::dropout {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// SplitMix64's output function: a full-avalanche mix of a counter, so neighbouring elements are independent.
inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace

uint64_t threshold(double keep_prob) {
    if (!(keep_prob > 0.0)) return 0;
    if (keep_prob >= 1.0) return uint64_t{1} << 32;
    return static_cast<uint64_t>(std::llround(keep_prob * 4294967296.0));
}

void apply(float* x, int64_t n, double keep_prob, uint64_t seed, float scale) {
    const uint64_t t = threshold(keep_prob);
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

}  // namespace fastdpr::dropout

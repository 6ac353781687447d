// Dropout whose mask is a pure function of (seed, element index): training attention draws one seed from torch's
// generator per call and can then apply the same mask again (GradCache's second pass, the backward pass) without
// storing it. torch's CPU dropout draws one Mersenne-twister number per element under a lock, which made the
// attention dropout of a small encoder's training step cost more than its attention products.
//
// Element i of a call keeps its value (times `scale`) when its 32-bit lane of SplitMix64(seed + (i/2 + 1)·φ) is
// below threshold(keep_prob) (φ = 0x9E3779B97F4A7C15; the low lane for even i, the high lane for odd i), and is set
// to 0 otherwise. fastdpr/models/attention.py holds the same function in torch, for checking and for builds
// without the kernels.
#pragma once

#include <cstdint>

#include "cpu.h"

namespace fastdpr::dropout {

// The kernel table, by CPU level (cpu.h), widest first.
inline constexpr cpu::Level kLevels[] = {cpu::Level::AVX512, cpu::Level::Scalar};

// Lanes below this value keep their element: round(keep_prob · 2^32), from 0 (drop all) to 2^32 (keep all).
uint64_t threshold(double keep_prob);

// x[i] = keep(seed, i) ? x[i] * scale : 0 for i in [0, n), in place; every level of kLevels gives the same bits
// (`level`: one of them enabled here).
void apply(float* x, int64_t n, double keep_prob, uint64_t seed, float scale, cpu::Level level);

}  // namespace fastdpr::dropout

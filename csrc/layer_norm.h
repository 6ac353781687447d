// Layer normalisation of a few rows, fp32 or bf16 in and out, for the few-rows encoder path (a question at query
// time): y = (x − mean) / sqrt(var + eps) · gamma + beta per row, statistics in fp32.
//
// Why by hand: at a dozen rows of 384 torch's layer_norm is almost all dispatch (a MiniLM question runs 13 of them:
// the embeddings' and two per layer), while the arithmetic is tiny (benchmarks/micro/test_micro_layer_norm.py
// measures both).
//
// The mean and the variance are two passes over the row in fp32 (the variance of x − mean, as torch's CPU kernel
// computes it); bf16 output is rounded once, to nearest even. The scalar path sums in order; the AVX-512 one (the
// registry's avx512 level, cpu.h) in 16 lanes, so the two differ by fp32 rounding only.
#pragma once

#include <cstdint>

#include "cpu.h"

namespace fastdpr::layer_norm {

// The kernel table, by CPU level (cpu.h), widest first.
inline constexpr cpu::Level kLevels[] = {cpu::Level::AVX512, cpu::Level::Scalar};

// x: (rows, width) float32 (x_f32) or bf16 bits (x_bf16), exactly one non-null; gamma, beta: width floats;
// out: (rows, width), exactly one of out_bf16 / out_f32 non-null. `out` may be `x` itself (same type). `level`:
// one of kLevels enabled here.
void layer_norm(const float* x_f32, const uint16_t* x_bf16, int64_t rows, int64_t width, const float* gamma,
                const float* beta, float eps, float* out_f32, uint16_t* out_bf16, cpu::Level level);

}  // namespace fastdpr::layer_norm

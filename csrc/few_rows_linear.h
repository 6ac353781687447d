// Linear layers for few rows (a question at query time), y = act(x Wᵀ + b) + residual, in bf16 (CPUs with
// AVX512-BF16) and fp32 (AVX-512; the registry's levels, cpu.h).
//
// Why by hand: at a dozen rows a layer is one pass over its weights, and oneDNN's kernels spend most of it
// waiting (benchmarks/results/few_rows.md at c97483c: this kernel against oneDNN on MiniLM's layers from 1 to 128
// rows).
// Here each weight vector is loaded once and used by every row: the packed weight holds 32 output columns at a
// time, lane by lane, so that one instruction updates 16 columns of a row with the row's input broadcast; 14 rows ×
// 32 columns of fp32 sums stay in registers while the weights stream through once, prefetched ahead.
//   bf16: a panel holds the column pairs (w_n[2p], w_n[2p+1]), and one vdpbf16ps adds
//         x_m[2p]·w_n[2p] + x_m[2p+1]·w_n[2p+1] for 16 columns with the row's pair broadcast;
//   fp32: a panel holds w_n[p] for its 32 columns, one FMA per 16 columns and input.
//
// The epilogue is fp32, as in oneDNN's fused one: + bias, the activation (GELU, its tanh form, ReLU), + residual,
// then (bf16) one rounding to nearest even. The scalar paths compute the same sums (exact bf16 products, fp32
// additions; std::erf/std::tanh for the activation) and are what the tests compare the vectorised ones with.
#pragma once

#include <cstdint>

#include "cpu.h"

namespace fastdpr::linear {

enum class Activation : int { None = 0, Gelu = 1, GeluTanh = 2, Relu = 3 };

// The kernel tables, by CPU level (cpu.h), widest first: bf16 on AVX512-BF16 or scalar, fp32 on AVX-512 or scalar.
inline constexpr cpu::Level kBf16Levels[] = {cpu::Level::AVX512_BF16, cpu::Level::Scalar};
inline constexpr cpu::Level kF32Levels[] = {cpu::Level::AVX512, cpu::Level::Scalar};

// Columns per packed panel; out_features must be a multiple of it (and in_features even for bf16).
constexpr int64_t kPanel = 32;

// w: (n, k) bf16 bit patterns, row-major → packed: (n / 32) panels of (k / 2) × 32 uint32 pairs.
void pack_weight(const uint16_t* w, int64_t n, int64_t k, uint32_t* packed);

// x: (m, k) bf16; bias: n floats or nullptr; residual: (m, n) bf16 or nullptr; exactly one of out_bf16 / out_f32
// (m, n) is non-null. out = act(x Wᵀ + bias) + residual. `level`: one of kBf16Levels enabled here. `threads`
// split the 32-column panels (0: OpenMP's default); the scalar kernel runs on one.
void linear_bf16(const uint16_t* x, int64_t m, int64_t k, const uint32_t* packed, int64_t n, const float* bias,
                 Activation act, const uint16_t* residual, uint16_t* out_bf16, float* out_f32, cpu::Level level,
                 int threads = 1);

// w: (n, k) float32, row-major → packed: (n / 32) panels of k × 32 floats.
void pack_weight_f32(const float* w, int64_t n, int64_t k, float* packed);

// The same in fp32: x (m, k), residual (m, n) or nullptr, out (m, n); `level` one of kF32Levels.
void linear_f32(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias,
                Activation act, const float* residual, float* out, cpu::Level level, int threads = 1);

}  // namespace fastdpr::linear

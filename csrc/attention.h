// Exact softmax attention for inference on CPUs: bf16 in, bf16 out (or fp32 in and out), over packed sequences
// without padding.
//
// Why by hand: at the head dimensions of small encoders (32) torch's CPU flash attention runs bf16 no faster than
// fp32, so attention stays a large share of a bf16 encoding while the oneDNN/AMX linear layers around it speed up
// (benchmarks/micro/test_micro_attention.py measures both on MiniLM's shapes). AVX512-BF16's dot-product
// instruction (vdpbf16ps: 16 fp32 lanes, each accumulating two bf16 products) computes both matrix products of
// attention with no conversions:
//
//   S = Q Kᵀ · scale   16 keys at a time; lane j holds the dimension pair (k_j[2p], k_j[2p+1]), the query's pair p
//                      is broadcast;
//   O = P V / Σ P      16 output dimensions at a time; lane d holds (v_{2t}[d], v_{2t+1}[d]), the weight pair
//                      (P[2t], P[2t+1]) is broadcast.
//
// Softmax runs in fp32: P = exp(S − max S), rounded to bf16 for the second product, and O is divided by the fp32
// sum of the unrounded weights afterwards (flash attention's order). The scalar path computes the same quantities
// with the same roundings (fp32 sums of exact bf16 products, bf16 weights), so the two agree to fp32 rounding.
#pragma once

#include <cstdint>

#include "cpu.h"

namespace fastdpr::attention {

// The kernel tables, by CPU level (cpu.h), widest first: for bf16, AMX tiles (head_dim a multiple of 32) and
// AVX512-BF16 dot products; for fp32, AVX-512 FMAs; for both, the scalar reference the tests compare them with.
// Which run here is the registry's answer (cpu::enabled, within its cap).
inline constexpr cpu::Level kBf16Levels[] = {cpu::Level::AMX, cpu::Level::AVX512_BF16, cpu::Level::Scalar};
inline constexpr cpu::Level kF32Levels[] = {cpu::Level::AVX512, cpu::Level::Scalar};

// The fastest bf16 level for this head dimension (amx needs a multiple of 32).
cpu::Level best_bf16(int64_t head_dim);

// qkv: T rows of 3·heads·head_dim bf16 bit patterns (all query heads, then keys, then values); the sequences lie
// one after another, `groups` = n_groups (count, length) pairs of runs of equal-length sequences (Σ count·length =
// T). out: T rows of heads·head_dim bf16. head_dim must be a positive multiple of 16; `level` one of kBf16Levels
// enabled here; threads as elsewhere (0: OpenMP's default).
void attention_bf16(const uint16_t* qkv, int64_t T, int64_t heads, int64_t head_dim, const int64_t* groups,
                    int64_t n_groups, uint16_t* out, cpu::Level level, int threads);

// The same in fp32 (qkv and out as above, float32; `level` one of kF32Levels), for fp32 towers, where torch's CPU
// flash attention is as slow at head dimension 32.
void attention_f32(const float* qkv, int64_t T, int64_t heads, int64_t head_dim, const int64_t* groups,
                   int64_t n_groups, float* out, cpu::Level level, int threads);

}  // namespace fastdpr::attention

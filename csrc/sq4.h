// 4-bit scalar quantization of whole vectors: the first, cheap re-rank of IVF-PQ's candidates.
//
// Each dimension t is cut into 16 even steps between the training sample's smallest and largest value:
//     x_t ~= lo_t + step_t * c_t,   c_t in 0..15 (values outside the range clip to its ends),
// so a row of d dimensions takes ceil(d / 2) bytes: a quarter of an fp16 row. Inner products need no decoding:
//     <q, x~> = sum_t q_t lo_t + sum_t (q_t step_t) c_t,
// one constant per query plus a dot product of the scaled query with the codes.
//
// Why a second re-rank: at a million 768-d vectors IVF-PQ must re-score a few thousand candidates to hold 95% of
// a query's top-100 (inside 256 of 2,048 lists, the best 1,000 candidates by 4-bit code hold 0.894 of it where the
// lists hold 0.958: benchmarks/results/ann_probe_study.md), and each candidate's fp16 row read from a memory map
// is bound by memory latency. A 4-bit row is a quarter of the bytes; ranked by them, the best 150
// candidates kept the recall the exact re-rank of all of them reached to within 0.001
// (benchmarks/results/ann_compressed.md, exact 150 against 0). For DPR's 21M x 768 the 4-bit rows take 7.5 GiB,
// which the page cache of a 24 GB machine can hold while the 30 GiB of fp16 rows cannot.
//
// Row layout: byte j holds dimension 2j in its low nibble and 2j + 1 in its high nibble. The SIMD kernels take 32
// dimensions (16 bytes) per step, so the scaled query is laid out per 32-dimension block as its 16 even
// dimensions, then its 16 odd ones (prepare_query); the dimensions past the last whole block stay in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace fastdpr::sq4 {

constexpr int64_t kLevels = 16;
constexpr int64_t kBlockDims = 32;

inline size_t row_bytes(int64_t d) { return static_cast<size_t>((d + 1) / 2); }

// lo and step (d each) from the per-dimension range of x (n, d), n >= 1.
void train(const float* x, int64_t n, int64_t d, float* lo, float* step);
// (n, row_bytes(d)) codes of x (n, d).
void encode(const float* x, int64_t n, int64_t d, const float* lo, const float* step, uint8_t* codes);

// A query ready for scores(): the scaled query in the kernels' order and the constant <q, lo>.
struct Query {
    std::vector<float> scaled;  // d floats
    float offset = 0.f;
};
void prepare_query(const float* q, int64_t d, const float* lo, const float* step, Query& out);
// The same into `scaled` (d floats); returns the constant.
float prepare_query(const float* q, int64_t d, const float* lo, const float* step, float* scaled);

// <q, x~> of one row of codes.
using DotFn = float (*)(const float* scaled, const uint8_t* row, int64_t d);
DotFn dot_kernel(cpu::Level level);  // cpu::require's refusal when the level is not enabled
inline DotFn dot_kernel() { return dot_kernel(simd::level()); }

}  // namespace fastdpr::sq4

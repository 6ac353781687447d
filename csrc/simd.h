// Inner-product and L2 kernels with run-time SIMD dispatch: one table per CPU level of the registry (cpu.h) up to
// avx512 (scalar, avx2, avx512; the levels above avx512 run its table).
//
// Every kernel exists at every level, compiled per function with target attributes, so one portable build uses the
// widest instructions the CPU has (never -march=native). The active table is the one of the widest level the
// registry enables (its cap included); tests move the cap to each level and compare it with the scalar one.
//
// Hot loops should fetch the kernel table once (`const Kernels& K = kernels();`) and call through it, so the
// dispatch costs one indirect call per kernel invocation and nothing inside it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu.h"

namespace fastdpr::simd {

// The widest level with a table of its own here.
constexpr cpu::Level kWidest = cpu::Level::AVX512;
// The level of the active table: cpu::widest(kWidest).
inline cpu::Level level() { return cpu::widest(kWidest); }

using DotFn = float (*)(const float* a, const float* b, size_t n);
using DotF16Fn = float (*)(const float* a, const uint16_t* b_half, size_t n);
using L2Fn = float (*)(const float* a, const float* b, size_t n);
// out[j] = <q, base + j*d> for j < n
using DotBatchFn = void (*)(const float* q, const float* base, size_t n, size_t d, float* out);
using DotBatchF16Fn = void (*)(const float* q, const uint16_t* base_half, size_t n, size_t d, float* out);
// Inner products of a tile of 4 queries (rows q, stride ldq) with 4 vectors (rows x, stride ldx):
// out[i*ldo + j] = <q_i, x_j>, i, j < 4. The micro-kernel of the blocked exact search.
using Dot4x4Fn = void (*)(const float* q, size_t ldq, const float* x, size_t ldx, size_t d, float* out, size_t ldo);
// The blocked exact search's GEMM path: `pack` lays out `nv` (<= nr) rows of x (stride ldx) as a panel
// panel[k * nr + j] = x[j][k] (zeros for j >= nv); `gemm` computes an mr x nr tile of scores
// out[i * ldo + j] = <q_i, x_j> for mr queries laid out k-major (q_i[k] at q[k * ldq + i]) against one panel.
// Broadcast-FMA form: no horizontal sums, every score summed over k in the same order whatever the tile position.
using PackFn = void (*)(const float* x, size_t ldx, size_t nv, size_t d, float* panel);
// With `accumulate`, the tile adds to what `out` holds (the search splits d into chunks that stay in L1).
using GemmFn = void (*)(const float* q, size_t ldq, const float* panel, size_t d, float* out, size_t ldo,
                        bool accumulate);
// fp32 <-> IEEE binary16 (round to nearest even; Inf/NaN kept)
using ToHalfFn = void (*)(const float* src, uint16_t* dst, size_t n);
using FromHalfFn = void (*)(const uint16_t* src, float* dst, size_t n);

struct Kernels {
    cpu::Level level;
    DotFn dot;
    DotF16Fn dot_f16;
    L2Fn l2sq;
    DotBatchFn dot_batch;
    DotBatchF16Fn dot_batch_f16;
    Dot4x4Fn dot4x4;
    ToHalfFn to_half;
    FromHalfFn from_half;
    size_t mr, nr;  // gemm tile: query rows x panel width
    PackFn pack;
    GemmFn gemm;
};

// The active table, and the table of a given level (cpu::require's std::invalid_argument when not enabled; a level
// above kWidest gets kWidest's table).
const Kernels& kernels();
const Kernels& kernels_at(cpu::Level level);

// Convenience wrappers through the active table.
inline float dot(const float* a, const float* b, size_t n) { return kernels().dot(a, b, n); }
inline float dot_f16(const float* a, const uint16_t* b, size_t n) { return kernels().dot_f16(a, b, n); }
inline float l2sq(const float* a, const float* b, size_t n) { return kernels().l2sq(a, b, n); }
inline void dot_batch(const float* q, const float* base, size_t n, size_t d, float* out) {
    kernels().dot_batch(q, base, n, d, out);
}
inline void dot_batch_f16(const float* q, const uint16_t* base, size_t n, size_t d, float* out) {
    kernels().dot_batch_f16(q, base, n, d, out);
}
inline void to_half(const float* src, uint16_t* dst, size_t n) { kernels().to_half(src, dst, n); }
inline void from_half(const uint16_t* src, float* dst, size_t n) { kernels().from_half(src, dst, n); }

// Scalar, exactly-rounded single conversions.
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);

// Hint the cache about a vector we will read soon (all of its lines, up to `bytes`).
inline void prefetch(const void* p, size_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

}  // namespace fastdpr::simd

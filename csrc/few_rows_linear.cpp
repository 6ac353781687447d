// Linear layers for few rows, bf16 and fp32 (see few_rows_linear.h for the layouts and why they are written by
// hand).
#include "few_rows_linear.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which its uninitialised-use analysis reports
// once they are inlined; the values are always overwritten
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "bf16.h"
#include "cpu.h"
#include "parallel.h"
#include "vecmath.h"

namespace fastdpr::linear {
namespace {

inline uint32_t pair_at(const uint16_t* row, int64_t p) {
    uint32_t v;
    std::memcpy(&v, row + 2 * p, sizeof v);
    return v;
}

// The packed pair of column `col` at pair index p of its panel: low half w[col][2p], high half w[col][2p+1] (the
// order vdpbf16ps pairs them with the broadcast row pair).
inline uint32_t packed_at(const uint32_t* packed, int64_t k, int64_t col, int64_t p) {
    return packed[(col / kPanel) * (k / 2) * kPanel + p * kPanel + col % kPanel];
}

inline float finish(float acc, const float* bias, Activation act, const uint16_t* residual, int64_t row,
                    int64_t col, int64_t n) {
    if (bias != nullptr) acc += bias[col];
    switch (act) {
        case Activation::None: break;
        case Activation::Gelu: acc = 0.5f * acc * (1.0f + std::erf(acc * 0.70710678118654752f)); break;
        case Activation::GeluTanh:
            acc = 0.5f * acc * (1.0f + std::tanh(0.79788456080286536f * (acc + 0.044715f * acc * acc * acc)));
            break;
        case Activation::Relu: acc = std::max(acc, 0.0f); break;
    }
    if (residual != nullptr) acc += bf16::to_float(residual[row * n + col]);
    return acc;
}

// Rows per block: R rows × 32 columns of sums (2R accumulators) + 2 weight vectors + the broadcast input in the 32
// vector registers.
constexpr int kRows = 14;

// Panels outer: a panel's weights are read from memory once and stay in L1/L2 for the next block of rows. The
// rows split into blocks of equal size (15 rows: 8 + 7, not 14 + 1: a block of one row would pay a whole pass over
// the panel for one row's products). fn(rows, first row, first column) runs one block. Threads take whole panels
// (each writes its own output columns); fn only computes, it cannot throw.
template <class Block>
void for_blocks(int64_t m, int64_t n, int threads, Block&& fn) {
    if (m <= 0) return;  // no rows: no blocks (and no division by a block count of 0)
    const int64_t blocks = (m + kRows - 1) / kRows, per = (m + blocks - 1) / blocks, panels = n / kPanel;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && panels > 1)
    for (int64_t pi = 0; pi < panels; ++pi)
        for (int64_t r = 0; r < m; r += per) fn(static_cast<int>(std::min<int64_t>(per, m - r)), r, pi * kPanel);
}

void linear_scalar(const uint16_t* x, int64_t m, int64_t k, const uint32_t* packed, int64_t n, const float* bias,
                   Activation act, const uint16_t* residual, uint16_t* out_bf16, float* out_f32) {
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k / 2; ++p) {
                const uint32_t xp = pair_at(x + r * k, p), wp = packed_at(packed, k, c, p);
                const auto lo = [](uint32_t v) { return bf16::to_float(static_cast<uint16_t>(v)); };
                const auto hi = [](uint32_t v) { return bf16::to_float(static_cast<uint16_t>(v >> 16)); };
                acc += lo(xp) * lo(wp);
                acc += hi(xp) * hi(wp);
            }
            const float y = finish(acc, bias, act, residual, r, c, n);
            if (out_bf16 != nullptr) out_bf16[r * n + c] = bf16::from_float(y);
            else out_f32[r * n + c] = y;
        }
}

void linear_f32_scalar(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias,
                       Activation act, const float* residual, float* out) {
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; ++p)
                acc += x[r * k + p] * packed[(c / kPanel) * k * kPanel + p * kPanel + c % kPanel];
            float y = finish(acc, bias, act, nullptr, r, c, n);
            if (residual != nullptr) y += residual[r * n + c];
            out[r * n + c] = y;
        }
}

#if defined(__x86_64__) || defined(_M_X64)
#define FASTDPR_AVX512F __attribute__((target("avx512f")))
#define FASTDPR_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// Pairs of weights prefetched ahead of the loads: 16 pairs of a 32-column panel are 2 KiB, enough to cover the
// latency of L3 on the CPUs this path is for.
constexpr int64_t kPrefetchPairs = 16;

// The epilogue both kernels share before their residual and store: + bias, then the activation, in fp32.
FASTDPR_AVX512F inline __m512 bias_activation(__m512 y, const float* bias, int64_t col, Activation act) {
    if (bias != nullptr) y = _mm512_add_ps(y, _mm512_loadu_ps(bias + col));
    if (act == Activation::Gelu) return vecmath::gelu_erf(y);
    if (act == Activation::GeluTanh) return vecmath::gelu_tanh(y);
    if (act == Activation::Relu) return _mm512_max_ps(y, _mm512_setzero_ps());
    return y;
}

// R rows (R <= 14: 28 accumulators, 2 weight vectors and the broadcast row pair in the 32 registers) × one
// 32-column panel.
template <int R>
FASTDPR_AVX512BF16 void rows_panel(const uint16_t* x, int64_t k, const uint32_t* panel, int64_t col,
                                   const float* bias, Activation act, const uint16_t* residual, int64_t row,
                                   int64_t n, uint16_t* out_bf16, float* out_f32) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const int64_t pairs = k / 2;
    for (int64_t p = 0; p < pairs; ++p) {
        // past the end of the last panel this prefetches addresses that are never read; prefetches do not fault
        _mm_prefetch(reinterpret_cast<const char*>(panel + (p + kPrefetchPairs) * kPanel), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(panel + (p + kPrefetchPairs) * kPanel + 16), _MM_HINT_T0);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + p * kPanel);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + p * kPanel + 16);
        for (int r = 0; r < R; ++r) {
            const __m512bh xr = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_at(x + r * k, p)));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) {
            const int64_t c = col + 16 * h, at = (row + r) * n + c;
            __m512 y = bias_activation(acc[r][h], bias, c, act);
            if (residual != nullptr) {
                const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(residual + at));
                y = _mm512_add_ps(y, bf16::widen16(bits));
            }
            if (out_bf16 != nullptr)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_bf16 + at), (__m256i)_mm512_cvtneps_pbh(y));
            else
                _mm512_storeu_ps(out_f32 + at, y);
        }
}

using RowsPanel = void (*)(const uint16_t*, int64_t, const uint32_t*, int64_t, const float*, Activation,
                           const uint16_t*, int64_t, int64_t, uint16_t*, float*);

constexpr RowsPanel kRowsPanel[kRows + 1] = {
    nullptr,       rows_panel<1>, rows_panel<2>,  rows_panel<3>,  rows_panel<4>,  rows_panel<5>,  rows_panel<6>,
    rows_panel<7>, rows_panel<8>, rows_panel<9>,  rows_panel<10>, rows_panel<11>, rows_panel<12>, rows_panel<13>,
    rows_panel<14>};

void linear_avx512bf16(const uint16_t* x, int64_t m, int64_t k, const uint32_t* packed, int64_t n,
                       const float* bias, Activation act, const uint16_t* residual, uint16_t* out_bf16,
                       float* out_f32, int threads) {
    const int64_t panel_size = (k / 2) * kPanel;
    for_blocks(m, n, threads, [&](int rows, int64_t r, int64_t c) {
        kRowsPanel[rows](x + r * k, k, packed + (c / kPanel) * panel_size, c, bias, act, residual, r, n, out_bf16,
                         out_f32);
    });
}

// Weights prefetched ahead in fp32: 32 inputs of a panel, 4 KiB (the weights of an fp32 MiniLM, 42 MB, come from
// DRAM as much as from L3).
constexpr int64_t kPrefetchInputs = 32;

// R rows (R <= 14) × one 32-column panel, fp32.
template <int R>
FASTDPR_AVX512F void rows_panel_f32(const float* x, int64_t k, const float* panel, int64_t col, const float* bias,
                                    Activation act, const float* residual, int64_t row, int64_t n, float* out) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; ++p) {
        _mm_prefetch(reinterpret_cast<const char*>(panel + (p + kPrefetchInputs) * kPanel), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(panel + (p + kPrefetchInputs) * kPanel + 16), _MM_HINT_T0);
        const __m512 w0 = _mm512_loadu_ps(panel + p * kPanel), w1 = _mm512_loadu_ps(panel + p * kPanel + 16);
        for (int r = 0; r < R; ++r) {
            const __m512 xr = _mm512_set1_ps(x[r * k + p]);
            acc[r][0] = _mm512_fmadd_ps(xr, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xr, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) {
            const int64_t c = col + 16 * h, at = (row + r) * n + c;
            __m512 y = bias_activation(acc[r][h], bias, c, act);
            if (residual != nullptr) y = _mm512_add_ps(y, _mm512_loadu_ps(residual + at));
            _mm512_storeu_ps(out + at, y);
        }
}

using RowsPanelF32 = void (*)(const float*, int64_t, const float*, int64_t, const float*, Activation, const float*,
                              int64_t, int64_t, float*);

constexpr RowsPanelF32 kRowsPanelF32[kRows + 1] = {
    nullptr,            rows_panel_f32<1>,  rows_panel_f32<2>,  rows_panel_f32<3>,  rows_panel_f32<4>,
    rows_panel_f32<5>,  rows_panel_f32<6>,  rows_panel_f32<7>,  rows_panel_f32<8>,  rows_panel_f32<9>,
    rows_panel_f32<10>, rows_panel_f32<11>, rows_panel_f32<12>, rows_panel_f32<13>, rows_panel_f32<14>};
#endif

}  // namespace

void pack_weight(const uint16_t* w, int64_t n, int64_t k, uint32_t* packed) {
    if (n % kPanel != 0 || k % 2 != 0 || n <= 0 || k <= 0)
        throw std::invalid_argument("linear_bf16_pack: weight (" + std::to_string(n) + ", " + std::to_string(k) +
                                    ") must have a multiple of 32 rows and an even number of columns");
    const int64_t pairs = k / 2;
    for (int64_t c = 0; c < n; ++c)
        for (int64_t p = 0; p < pairs; ++p)
            packed[(c / kPanel) * pairs * kPanel + p * kPanel + c % kPanel] = pair_at(w + c * k, p);
}

void linear_bf16(const uint16_t* x, int64_t m, int64_t k, const uint32_t* packed, int64_t n, const float* bias,
                 Activation act, const uint16_t* residual, uint16_t* out_bf16, float* out_f32, cpu::Level level,
                 int threads) {
    if ((out_bf16 == nullptr) == (out_f32 == nullptr))
        throw std::invalid_argument("linear_bf16: exactly one of a bf16 and a float32 output");
    cpu::require(level, kBf16Levels, "linear_bf16");
#if defined(__x86_64__) || defined(_M_X64)
    if (level == cpu::Level::AVX512_BF16)
        return linear_avx512bf16(x, m, k, packed, n, bias, act, residual, out_bf16, out_f32,
                                 resolve_threads(threads));
#endif
    linear_scalar(x, m, k, packed, n, bias, act, residual, out_bf16, out_f32);
}

void pack_weight_f32(const float* w, int64_t n, int64_t k, float* packed) {
    if (n % kPanel != 0 || n <= 0 || k <= 0)
        throw std::invalid_argument("linear_f32_pack: weight (" + std::to_string(n) + ", " + std::to_string(k) +
                                    ") must have a multiple of 32 rows");
    for (int64_t c = 0; c < n; ++c)
        for (int64_t p = 0; p < k; ++p) packed[(c / kPanel) * k * kPanel + p * kPanel + c % kPanel] = w[c * k + p];
}

void linear_f32(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias,
                Activation act, const float* residual, float* out, cpu::Level level, int threads) {
    cpu::require(level, kF32Levels, "linear_f32");
#if defined(__x86_64__) || defined(_M_X64)
    if (level == cpu::Level::AVX512) {
        for_blocks(m, n, resolve_threads(threads), [&](int rows, int64_t r, int64_t c) {
            kRowsPanelF32[rows](x + r * k, k, packed + (c / kPanel) * k * kPanel, c, bias, act, residual, r, n, out);
        });
        return;
    }
#endif
    linear_f32_scalar(x, m, k, packed, n, bias, act, residual, out);
}

}  // namespace fastdpr::linear

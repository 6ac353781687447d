// 4-bit product-quantization codes scored with in-register look-up tables ("fast scan").
//
// With 16 codewords per sub-space a sub-space's table of scores for one query is 16 bytes once quantized to uint8:
// exactly one 128-bit lane, so one byte shuffle (pshufb: _mm256_shuffle_epi8 / _mm512_shuffle_epi8) looks up 16 or
// 32 codes at once, where an 8-bit code needs a gather or a load per code.
//
// Code layout: vectors go in blocks of 32; a block holds, sub-space after sub-space, 16 bytes per sub-space whose
// byte i carries the code of vector i in its low nibble and the code of vector i + 16 in its high nibble. The number
// of sub-spaces is padded to an even count (padded_m) with zero codes and zero tables, so AVX2 always takes two
// sub-spaces (one 32-byte load) at a time. The last block of a list is padded with zero codes; its extra scores are
// computed and ignored.
//
// Scores are sums of uint8 table entries, accumulated in uint16: quantize_lut picks a scale that keeps every
// possible sum below 2^16, so the sums never wrap and every SIMD level gives bit-identical integers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace fastdpr::pq4 {

constexpr int64_t kKsub = 16;        // codewords per sub-space
constexpr int64_t kBlock = 32;       // vectors per block
constexpr int64_t kMaxM = 2048;      // sub-spaces; keeps the uint16 sum bound of quantize_lut meaningful

inline int64_t padded_m(int64_t m) { return (m + 1) & ~int64_t{1}; }
inline int64_t nblocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
inline size_t block_bytes(int64_t m) { return static_cast<size_t>(padded_m(m)) * 16; }
inline size_t packed_bytes(int64_t n, int64_t m) { return static_cast<size_t>(nblocks(n)) * block_bytes(m); }

// Code of vector i (counted from the start of `blocks`) in sub-space j. `blocks` must span vector i's block.
inline void set_code(uint8_t* blocks, int64_t m, int64_t i, int64_t j, uint8_t code) {
    uint8_t* b = blocks + static_cast<size_t>(i / kBlock) * block_bytes(m) + j * 16;
    const int64_t r = i % kBlock;
    if (r < 16)
        b[r] = static_cast<uint8_t>((b[r] & 0xf0) | (code & 0x0f));
    else
        b[r - 16] = static_cast<uint8_t>((b[r - 16] & 0x0f) | ((code & 0x0f) << 4));
}
inline uint8_t get_code(const uint8_t* blocks, int64_t m, int64_t i, int64_t j) {
    const uint8_t* b = blocks + static_cast<size_t>(i / kBlock) * block_bytes(m) + j * 16;
    const int64_t r = i % kBlock;
    return r < 16 ? (b[r] & 0x0f) : (b[r - 16] >> 4);
}

// codes (n, m) row-major, values < 16 -> packed_bytes(n, m) bytes of blocks (padding zero). Throws
// std::invalid_argument on a code >= 16.
void pack(const uint8_t* codes, int64_t n, int64_t m, uint8_t* blocks);
// The inverse: blocks -> codes (n, m).
void unpack(const uint8_t* blocks, int64_t n, int64_t m, uint8_t* codes);

// A query's table quantized to uint8: table (padded_m, 16); the float score of a code row c is approximated by
//     bias + delta * S,   S = sum_j table[j][c_j]   (an integer < 2^16).
// Entry (j, t) is round((lut[j][t] - min_j) / delta) with min_j the smallest entry of row j (the per-table
// offset; their sum is `bias`) and one scale shared by all rows,
//     delta = max(max_j range_j / 255, sum_j range_j / (65535 - m)),   range_j = max_j - min_j,
// so that every entry fits a byte and every sum fits 16 bits: S <= sum_j (range_j / delta + 1/2) <= 65535 - m/2.
// Error bound: each looked-up entry is off by at most delta / 2 from (lut - min_j) / delta * delta, so for every
// code row
//     |bias + delta * S - sum_j lut[j][c_j]| <= m * delta / 2      (plus float32 rounding of the sums).
// A table with a non-finite entry gives delta = 0, an all-zero table and bias = NaN (every score NaN).
struct QuantizedLUT {
    std::vector<uint8_t> table;
    float bias = 0.f;
    float delta = 0.f;
    // The largest sum any code row can reach: sum_j max_t table[j][t] (0 for a non-finite table).
    uint32_t max_sum = 0;
    // The bound above: the largest difference between a dequantized score and the float table's sum.
    float error_bound(int64_t m) const { return 0.5f * static_cast<float>(m) * delta; }
};
void quantize_lut(const float* lut, int64_t m, QuantizedLUT& out);
// The same through the kernel of a CPU level (bit-identical output at every level; tests compare them).
void quantize_lut(const float* lut, int64_t m, QuantizedLUT& out, cpu::Level level);

// The float score of a sum, as every caller must compute it (the same expression wherever a threshold is
// translated to sums, so that `first_reaching` and the scores agree to the bit): monotone non-decreasing in s
// for delta > 0, as each rounding is.
inline float score(float base, float delta, uint32_t s) { return base + delta * static_cast<float>(s); }

// The smallest sum s <= 65535 with score(base, delta, s) >= thr, or 65536 when none reaches it (also for a NaN
// base or delta = 0, the non-finite table). Exact: the estimate from the real-number inverse is corrected by
// stepping along the monotone float scores.
inline uint32_t first_reaching(float base, float delta, float thr) {
    constexpr uint32_t kNone = 65536;
    if (!(delta > 0.f) || !(score(base, delta, 65535) >= thr)) return kNone;
    if (score(base, delta, 0) >= thr) return 0;
    // score(0) < thr <= score(65535): the answer is in [1, 65535]
    const double x = std::ceil((static_cast<double>(thr) - base) / delta);
    uint32_t s = !(x >= 1) ? 1u : x > 65535 ? 65535u : static_cast<uint32_t>(x);
    for (int step = 0; step < 8; ++step) {
        if (score(base, delta, s) < thr)
            ++s;  // s <= 65535 here: score(65535) >= thr
        else if (score(base, delta, s - 1) >= thr)
            --s;  // s >= 1 here: score(0) < thr
        else
            return s;
    }
    // far off (huge magnitudes): bisection on [lo, hi] with score(lo) < thr <= score(hi)
    uint32_t lo = 0, hi = 65535;
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        (score(base, delta, mid) >= thr ? hi : lo) = mid;
    }
    return hi;
}

// Writes the indices i < n with sums[i] >= floor to `out` (room for n), in increasing order; returns how many.
// `sums` must hold nblocks(n) * kBlock values (what a scan writes): the wide kernels read whole blocks.
using FilterFn = int64_t (*)(const uint16_t* sums, int64_t n, uint32_t floor, uint32_t* out);
FilterFn filter_kernel(cpu::Level level);
FilterFn filter_kernel();

// How far ahead of its reads a scan requests the codes (software prefetch, one request per 64-byte line read).
// The hardware prefetcher stops at every 4 KiB page and keeps too few lines in flight to stream codes from DRAM.
// One stream of requests runs on from a list into the next one (lists probed in score order lie far apart), rather
// than a burst at each list's head; the scan is told the next list to read for that. The requests go to L2
// (prefetcht1), where the lines wait a few microseconds at most, which leaves L1 to the lines being read.
constexpr size_t kPrefetchBytes = 8192;

// out[i] = sum_j table[j][code(i, j)] for every vector of `nblocks` blocks (out holds nblocks * 32 values).
// `next` (`next_bytes` bytes; null and 0 for none) is what the caller scans next: the scan's requests run on into
// it once they pass the last block. Only a hint: the sums do not depend on it.
using ScanFn = void (*)(const uint8_t* blocks, int64_t nblocks, int64_t m, const uint8_t* table, uint16_t* out,
                       const uint8_t* next, size_t next_bytes);

// The scan kernel of a CPU level (cpu.h: its avx512 level includes AVX-512BW; the levels above avx512 scan with the
// avx512 kernel), and the one of the active level (simd::level()). cpu::require's std::invalid_argument when the
// level is not enabled here.
ScanFn scan_kernel(cpu::Level level);
ScanFn scan_kernel();
// Which kernel a level runs: "scalar", "avx2" or "avx512bw" (the same refusal as scan_kernel).
const char* kernel_name(cpu::Level level);

// The k largest sums of n packed vectors (ties: smaller index first), best first, through `scan`.
void topk(const uint8_t* blocks, int64_t n, int64_t m, const uint8_t* table, int64_t k, ScanFn scan,
          std::vector<uint16_t>& scores, std::vector<int64_t>& ids);

}  // namespace fastdpr::pq4

// 4-bit fast-scan kernels (see pq4.h): scalar reference, AVX2 and AVX-512BW, picked at run time like simd.cpp.
#include "pq4.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "topk.h"

namespace fastdpr::pq4 {

void pack(const uint8_t* codes, int64_t n, int64_t m, uint8_t* blocks) {
    std::memset(blocks, 0, packed_bytes(n, m));
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
            const uint8_t c = codes[i * m + j];
            if (c >= kKsub)
                throw std::invalid_argument("pq4: code " + std::to_string(c) + " of row " + std::to_string(i) +
                                            " is not a 4-bit code (< 16)");
            set_code(blocks, m, i, j, c);
        }
}

void unpack(const uint8_t* blocks, int64_t n, int64_t m, uint8_t* codes) {
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) codes[i * m + j] = get_code(blocks, m, i, j);
}

// The scale shared by every row (see pq4.h): 0 for a non-finite table, 1 when every row is constant.
static double lut_scale(double sum_range, float max_range, int64_t m) {
    const double delta = std::max(static_cast<double>(max_range) / 255.0, sum_range / static_cast<double>(65535 - m));
    return delta > 0 ? delta : 1.0;  // every row constant: all entries are 0 whatever the scale
}

static void set_non_finite(QuantizedLUT& out) {
    std::fill(out.table.begin(), out.table.end(), uint8_t{0});
    out.bias = std::nanf("");
    out.delta = 0.f;
    out.max_sum = 0;
}

// ---------------------------------------------------------------------------------------------------------------
// scalar: the reference every wide kernel must match bit for bit

namespace scalar {

void quantize_lut(const float* lut, int64_t m, QuantizedLUT& out) {
    const int64_t mp = padded_m(m);
    out.table.assign(static_cast<size_t>(mp) * kKsub, 0);
    thread_local std::vector<float> lows;
    lows.resize(static_cast<size_t>(m));
    double bias = 0, sum_range = 0;
    float max_range = 0;
    bool finite = true;
    for (int64_t j = 0; j < m; ++j) {
        const float* row = lut + j * kKsub;
        float lo = row[0], hi = row[0];
        for (int64_t t = 1; t < kKsub; ++t) {
            lo = std::min(lo, row[t]);
            hi = std::max(hi, row[t]);
        }
        finite = finite && std::isfinite(lo) && std::isfinite(hi);  // min/max pass a NaN on only sometimes
        for (int64_t t = 0; t < kKsub; ++t) finite = finite && row[t] == row[t];
        lows[j] = lo;
        bias += lo;
        sum_range += static_cast<double>(hi) - lo;
        max_range = std::max(max_range, hi - lo);
    }
    if (!finite) return set_non_finite(out);
    const double delta = lut_scale(sum_range, max_range, m);
    const float inv = static_cast<float>(1.0 / delta);
    uint32_t max_sum = 0;
    for (int64_t j = 0; j < m; ++j) {
        const float* row = lut + j * kKsub;
        uint8_t* q = &out.table[j * kKsub];
        const float lo = lows[j];
        // (row - lo) * inv is in [0, 255 (1 + a few ulps)]: + 0.5 and truncation round it (halves up)
        uint8_t top = 0;
        for (int64_t t = 0; t < kKsub; ++t) {
            q[t] = static_cast<uint8_t>(std::min(255.f, (row[t] - lo) * inv + 0.5f));
            top = std::max(top, q[t]);
        }
        max_sum += top;
    }
    out.bias = static_cast<float>(bias);
    out.delta = static_cast<float>(delta);
    out.max_sum = max_sum;
}

void scan(const uint8_t* blocks, int64_t nb, int64_t m, const uint8_t* table, uint16_t* out, const uint8_t*,
          size_t) {
    const size_t bb = block_bytes(m);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = blocks + b * bb;
        uint32_t acc[kBlock] = {};
        for (int64_t j = 0; j < m; ++j) {
            const uint8_t* c = blk + j * 16;
            const uint8_t* t = table + j * kKsub;
            for (int r = 0; r < 16; ++r) {
                acc[r] += t[c[r] & 0x0f];
                acc[r + 16] += t[c[r] >> 4];
            }
        }
        for (int r = 0; r < kBlock; ++r) out[b * kBlock + r] = static_cast<uint16_t>(acc[r]);
    }
}

int64_t filter(const uint16_t* sums, int64_t n, uint32_t floor, uint32_t* out) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i)
        if (sums[i] >= floor) out[c++] = static_cast<uint32_t>(i);
    return c;
}

}  // namespace scalar

// Appends i0 + (bit positions of mask) to out: few bits are set once a search's threshold has risen.
static inline int64_t append_bits(uint32_t mask, uint32_t i0, uint32_t* out, int64_t c) {
    while (mask) {
        out[c++] = i0 + static_cast<uint32_t>(__builtin_ctz(mask));
        mask &= mask - 1;
    }
    return c;
}

// The wide scans' software prefetch (pq4.h kPrefetchBytes): a cursor that starts kPrefetchBytes past the first
// block and requests the next 64 bytes once per 64 bytes read, on from the scanned blocks into `next` and never past
// the end of that. Where a block is not a whole number of lines (an odd number of sub-space pairs) the distance
// drifts by half a line per block, which stays small over a list.
class Ahead {
public:
    Ahead(const uint8_t* blocks, size_t bytes, const uint8_t* next, size_t next_bytes)
        : blocks_(blocks), next_(next), bytes_(bytes), stop_(bytes + next_bytes) {}
    void step() {
        if (at_ < stop_) {
            const uint8_t* p = at_ < bytes_ ? blocks_ + at_ : next_ + (at_ - bytes_);
            _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);  // to L2 (pq4.h)
        }
        at_ += 64;
    }

private:
    const uint8_t* blocks_;
    const uint8_t* next_;
    size_t bytes_, stop_;
    size_t at_ = kPrefetchBytes;  // offset from `blocks` of the next request
};

// Bits of the vectors of a block that exist: the last block of a list is padded.
static inline uint32_t live_bits(int64_t n, int64_t i0) {
    const int64_t left = n - i0;
    return left >= 32 ? 0xffffffffu : (uint32_t{1} << left) - 1;
}

// ---------------------------------------------------------------------------------------------------------------
// AVX2: two sub-spaces per 32-byte register (lane 0: sub-space j, lane 1: j + 1).
//
// A shuffle returns one byte per vector; the bytes are widened without unpacking by accumulating the register as
// 16-bit words twice: `whole` sums the words as they are (even vector + 256 x odd vector, modulo 2^16) and `odd`
// sums w >> 8 (the odd vectors). Once per block the even sums are recovered as whole - (odd << 8): exact, since
// arithmetic modulo 2^16 is consistent and every true sum is below 2^16 (quantize_lut's bound). The two lanes (two
// sub-spaces) are added and the even/odd words interleaved back, also once per block.

#define FASTDPR_PQ4_AVX2 __attribute__((target("avx2")))

namespace avx2 {

FASTDPR_PQ4_AVX2 static inline void finish(__m256i whole, __m256i odd, uint16_t* out) {
    const __m128i w = _mm_add_epi16(_mm256_castsi256_si128(whole), _mm256_extracti128_si256(whole, 1));
    const __m128i o = _mm_add_epi16(_mm256_castsi256_si128(odd), _mm256_extracti128_si256(odd, 1));
    const __m128i e = _mm_sub_epi16(w, _mm_slli_epi16(o, 8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi16(e, o));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8), _mm_unpackhi_epi16(e, o));
}

// Adds the scores of one pair of sub-spaces (codes c, tables lut) to the four accumulators.
FASTDPR_PQ4_AVX2 static inline void step(__m256i c, __m256i lut, __m256i& lo_e, __m256i& lo_o, __m256i& hi_e,
                                         __m256i& hi_o) {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(c, nib));
    const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(c, 4), nib));
    lo_e = _mm256_add_epi16(lo_e, lo);
    lo_o = _mm256_add_epi16(lo_o, _mm256_srli_epi16(lo, 8));
    hi_e = _mm256_add_epi16(hi_e, hi);
    hi_o = _mm256_add_epi16(hi_o, _mm256_srli_epi16(hi, 8));
}

FASTDPR_PQ4_AVX2 void scan(const uint8_t* blocks, int64_t nb, int64_t m, const uint8_t* table, uint16_t* out,
                           const uint8_t* next, size_t next_bytes) {
    const int64_t pairs = padded_m(m) / 2;
    const size_t bb = block_bytes(m);
    Ahead ahead(blocks, static_cast<size_t>(nb) * bb, next, next_bytes);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = blocks + b * bb;
        __m256i lo_e = _mm256_setzero_si256(), lo_o = _mm256_setzero_si256();
        __m256i hi_e = _mm256_setzero_si256(), hi_o = _mm256_setzero_si256();
        for (int64_t p = 0; p < pairs; ++p) {
            if ((p & 1) == 0) ahead.step();  // two pairs per line
            const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + p * 32));
            const __m256i lut = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + p * 32));
            step(c, lut, lo_e, lo_o, hi_e, hi_o);
        }
        finish(lo_e, lo_o, out + b * kBlock);
        finish(hi_e, hi_o, out + b * kBlock + 16);
    }
}

// Sums >= floor: AVX2 has no unsigned 16-bit comparison, but max(x, floor) == x is one. The two words-masks are
// packed to bytes (per 128-bit lane, so the lanes are put back in order) for one 32-bit movemask.
FASTDPR_PQ4_AVX2 int64_t filter(const uint16_t* sums, int64_t n, uint32_t floor, uint32_t* out) {
    if (floor > 65535) return 0;
    const __m256i f = _mm256_set1_epi16(static_cast<short>(floor));
    int64_t c = 0;
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + i0));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + i0 + 16));
        const __m256i ga = _mm256_cmpeq_epi16(_mm256_max_epu16(a, f), a);
        const __m256i gb = _mm256_cmpeq_epi16(_mm256_max_epu16(b, f), b);
        const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(ga, gb), 0xd8);
        const uint32_t mask = static_cast<uint32_t>(_mm256_movemask_epi8(bytes));
        c = append_bits(mask & live_bits(n, i0), static_cast<uint32_t>(i0), out, c);
    }
    return c;
}

}  // namespace avx2

// ---------------------------------------------------------------------------------------------------------------
// AVX-512BW: four sub-spaces per 64-byte register, the same widening; a remaining pair goes through the AVX2 step.

#define FASTDPR_PQ4_AVX512 __attribute__((target("avx512f,avx512bw,avx2")))

namespace avx512 {

FASTDPR_PQ4_AVX512 static inline __m256i fold(__m512i v) {
    return _mm256_add_epi16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

FASTDPR_PQ4_AVX512 void scan(const uint8_t* blocks, int64_t nb, int64_t m, const uint8_t* table, uint16_t* out,
                             const uint8_t* next, size_t next_bytes) {
    const int64_t mp = padded_m(m);
    const int64_t quads = mp / 4;
    const bool pair = (mp % 4) != 0;
    const size_t bb = block_bytes(m);
    const __m512i nib = _mm512_set1_epi8(0x0f);
    Ahead ahead(blocks, static_cast<size_t>(nb) * bb, next, next_bytes);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = blocks + b * bb;
        __m512i lo_e = _mm512_setzero_si512(), lo_o = _mm512_setzero_si512();
        __m512i hi_e = _mm512_setzero_si512(), hi_o = _mm512_setzero_si512();
        for (int64_t p = 0; p < quads; ++p) {
            ahead.step();
            const __m512i c = _mm512_loadu_si512(blk + p * 64);
            const __m512i lut = _mm512_loadu_si512(table + p * 64);
            const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(c, nib));
            const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(c, 4), nib));
            lo_e = _mm512_add_epi16(lo_e, lo);
            lo_o = _mm512_add_epi16(lo_o, _mm512_srli_epi16(lo, 8));
            hi_e = _mm512_add_epi16(hi_e, hi);
            hi_o = _mm512_add_epi16(hi_o, _mm512_srli_epi16(hi, 8));
        }
        __m256i le = fold(lo_e), lodd = fold(lo_o), he = fold(hi_e), hodd = fold(hi_o);
        if (pair) {
            const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + quads * 64));
            const __m256i lut = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + quads * 64));
            avx2::step(c, lut, le, lodd, he, hodd);
        }
        avx2::finish(le, lodd, out + b * kBlock);
        avx2::finish(he, hodd, out + b * kBlock + 16);
    }
}

FASTDPR_PQ4_AVX512 int64_t filter(const uint16_t* sums, int64_t n, uint32_t floor, uint32_t* out) {
    if (floor > 65535) return 0;
    const __m512i f = _mm512_set1_epi16(static_cast<short>(floor));
    int64_t c = 0;
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
        const uint32_t mask = _mm512_cmpge_epu16_mask(_mm512_loadu_si512(sums + i0), f);
        c = append_bits(mask & live_bits(n, i0), static_cast<uint32_t>(i0), out, c);
    }
    return c;
}

// The value unchanged but opaque to the optimiser: GCC contracts a * b + c into one fused multiply-add (one
// rounding instead of two), intrinsics included, wherever the target has FMA, and AVX-512F has it. A product that
// passes through here is rounded on its own, as in the scalar kernel.
FASTDPR_PQ4_AVX512 static inline __m512 no_fuse(__m512 x) {
    __asm__("" : "+v"(x));
    return x;
}
FASTDPR_PQ4_AVX512 static inline float no_fuse(float x) {
    __asm__("" : "+v"(x));
    return x;
}

// One 16-entry row per register. The float arithmetic is the scalar kernel's, operation for operation (no fused
// multiply-add: see no_fuse), so the tables are identical.
FASTDPR_PQ4_AVX512 void quantize_lut(const float* lut, int64_t m, QuantizedLUT& out) {
    const int64_t mp = padded_m(m);
    out.table.assign(static_cast<size_t>(mp) * kKsub, 0);
    thread_local std::vector<float> lows, highs;
    lows.resize(static_cast<size_t>(m));
    highs.resize(static_cast<size_t>(m));
    double bias = 0, sum_range = 0;
    float max_range = 0;
    __mmask16 finite = 0xffff;
    for (int64_t j = 0; j < m; ++j) {
        const __m512 row = _mm512_loadu_ps(lut + j * kKsub);
        // x - x is 0 exactly when x is finite
        finite &= _mm512_cmp_ps_mask(_mm512_sub_ps(row, row), _mm512_setzero_ps(), _CMP_EQ_OQ);
        const float lo = _mm512_reduce_min_ps(row), hi = _mm512_reduce_max_ps(row);
        lows[j] = lo;
        highs[j] = hi;
        bias += lo;
        sum_range += static_cast<double>(hi) - lo;
        max_range = std::max(max_range, hi - lo);
    }
    if (finite != 0xffff) return set_non_finite(out);
    const double delta = lut_scale(sum_range, max_range, m);
    const float inv = static_cast<float>(1.0 / delta);
    const __m512 vinv = _mm512_set1_ps(inv), half = _mm512_set1_ps(0.5f), top = _mm512_set1_ps(255.f);
    uint32_t max_sum = 0;
    for (int64_t j = 0; j < m; ++j) {
        const __m512 row = _mm512_loadu_ps(lut + j * kKsub);
        const __m512 x = _mm512_add_ps(no_fuse(_mm512_mul_ps(_mm512_sub_ps(row, _mm512_set1_ps(lows[j])), vinv)), half);
        const __m512i q = _mm512_cvttps_epi32(_mm512_min_ps(top, x));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(&out.table[j * kKsub]), _mm512_cvtepi32_epi8(q));
        // the row's largest entry is its largest float's, quantized the same way
        max_sum += static_cast<uint8_t>(std::min(255.f, no_fuse((highs[j] - lows[j]) * inv) + 0.5f));
    }
    out.bias = static_cast<float>(bias);
    out.delta = static_cast<float>(delta);
    out.max_sum = max_sum;
}

}  // namespace avx512

// ---------------------------------------------------------------------------------------------------------------
// dispatch: a table per CPU level (cpu.h); its avx512 level includes the BW byte instructions, and the levels
// above it scan with the avx512 kernels. The active level is simd::level(), the index kernels' one.

ScanFn scan_kernel(cpu::Level level) {
    switch (cpu::require(level, "pq4 scan")) {
        case cpu::Level::Scalar: return scalar::scan;
        case cpu::Level::AVX2: return avx2::scan;
        default: return avx512::scan;
    }
}

ScanFn scan_kernel() { return scan_kernel(simd::level()); }

FilterFn filter_kernel(cpu::Level level) {
    switch (cpu::require(level, "pq4 filter")) {
        case cpu::Level::Scalar: return scalar::filter;
        case cpu::Level::AVX2: return avx2::filter;
        default: return avx512::filter;
    }
}

FilterFn filter_kernel() { return filter_kernel(simd::level()); }

void quantize_lut(const float* lut, int64_t m, QuantizedLUT& out, cpu::Level level) {
    // AVX2 has no row-wide reductions worth the code: that level quantizes with the scalar kernel
    if (cpu::require(level, "pq4 quantize_lut") >= cpu::Level::AVX512)
        avx512::quantize_lut(lut, m, out);
    else
        scalar::quantize_lut(lut, m, out);
}

void quantize_lut(const float* lut, int64_t m, QuantizedLUT& out) { quantize_lut(lut, m, out, simd::level()); }

const char* kernel_name(cpu::Level level) {
    switch (cpu::require(level, "pq4 kernel")) {
        case cpu::Level::Scalar: return "scalar";
        case cpu::Level::AVX2: return "avx2";
        default: return "avx512bw";
    }
}

void topk(const uint8_t* blocks, int64_t n, int64_t m, const uint8_t* table, int64_t k, ScanFn scan,
          std::vector<uint16_t>& scores, std::vector<int64_t>& ids) {
    scores.clear();
    ids.clear();
    if (n <= 0 || k <= 0) return;
    constexpr int64_t kChunk = 64;  // blocks scanned per call: a small buffer that stays in L1
    std::vector<uint16_t> buf(static_cast<size_t>(kChunk * kBlock));
    TopK heap(static_cast<size_t>(std::min(k, n)));
    const int64_t nb = nblocks(n);
    for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
        const int64_t cb = std::min(kChunk, nb - b0);
        const int64_t rest = nb - (b0 + cb);  // the blocks of the next chunk are read next
        scan(blocks + b0 * block_bytes(m), cb, m, table, buf.data(), blocks + (b0 + cb) * block_bytes(m),
             static_cast<size_t>(std::min(kChunk, rest)) * block_bytes(m));
        const int64_t i0 = b0 * kBlock, cn = std::min(cb * kBlock, n - i0);
        float thr = heap.threshold();
        for (int64_t i = 0; i < cn; ++i) {
            if (buf[i] >= thr) {
                heap.push(static_cast<float>(buf[i]), i0 + i);
                thr = heap.threshold();
            }
        }
    }
    for (const Scored& s : heap.take_sorted()) {
        scores.push_back(static_cast<uint16_t>(s.score));
        ids.push_back(s.id);
    }
}

}  // namespace fastdpr::pq4

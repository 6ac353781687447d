// The probe and scan stages of the IVF-PQ search (ivfpq_search.h): the probe order of a query's lists, and the
// registry of scanners, one per code type, that score the code rows of a list and collect the candidates.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "ivfpq_search.h"
#include "kmeans.h"
#include "pq4.h"
#include "simd.h"

namespace fastdpr::ivfpq {
namespace {

constexpr int64_t kKsub8 = 256;  // codewords per sub-quantizer of 8-bit codes

// Sum of the table entries picked by one code row, accumulated in order j = 0..m-1 from `base` (the same order
// the numpy fallback uses, so both give the same float32 sums from the same tables). Four rows at a time for
// instruction-level parallelism: the loop is bound by dependent table loads, not arithmetic.
void adc_scan(const uint8_t* codes, int64_t n, int64_t m, const float* lut, float base, float* out) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint8_t* c0 = codes + i * m;
        const uint8_t* c1 = c0 + m;
        const uint8_t* c2 = c1 + m;
        const uint8_t* c3 = c2 + m;
        float s0 = base, s1 = base, s2 = base, s3 = base;
        for (int64_t j = 0; j < m; ++j) {
            const float* t = lut + j * kKsub8;
            s0 += t[c0[j]];
            s1 += t[c1[j]];
            s2 += t[c2[j]];
            s3 += t[c3[j]];
        }
        out[i] = s0, out[i + 1] = s1, out[i + 2] = s2, out[i + 3] = s3;
    }
    for (; i < n; ++i) {
        const uint8_t* c = codes + i * m;
        float s = base;
        for (int64_t j = 0; j < m; ++j) s += lut[j * kKsub8 + c[j]];
        out[i] = s;
    }
}

// The 4-bit look-up table of one query: lut[j][c] = <q_j, codeword c of sub-space j>, from the packed codebooks
// (pack_columns: per sub-space a (dsub, 32) tile, codeword c in column c). The scalar loop and the AVX-512 one do
// the same float operations in the same order (acc = 0, then acc += q_t * p_t for t = 0..dsub-1, each product
// rounded on its own: the empty asm keeps GCC from contracting it into an FMA, which AVX-512F has), so the tables,
// and everything quantized from them, are identical.
constexpr int64_t kLutTile = 32;

void lut4_scalar(const float* q, const float* cb_T, size_t stride, int64_t m, int64_t dsub, float* lut) {
    for (int64_t j = 0; j < m; ++j) {
        const float* p = cb_T + j * stride;
        const float* qj = q + j * dsub;
        float acc[pq4::kKsub] = {};
        for (int64_t t = 0; t < dsub; ++t)
            for (int64_t c = 0; c < pq4::kKsub; ++c) acc[c] += qj[t] * p[t * kLutTile + c];
        std::copy(acc, acc + pq4::kKsub, lut + j * pq4::kKsub);
    }
}

__attribute__((target("avx512f"))) void lut4_avx512(const float* q, const float* cb_T, size_t stride, int64_t m,
                                                     int64_t dsub, float* lut) {
    for (int64_t j = 0; j < m; ++j) {
        const float* p = cb_T + j * stride;
        const float* qj = q + j * dsub;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t t = 0; t < dsub; ++t) {
            __m512 prod = _mm512_mul_ps(_mm512_set1_ps(qj[t]), _mm512_loadu_ps(p + t * kLutTile));
            __asm__("" : "+v"(prod));
            acc = _mm512_add_ps(acc, prod);
        }
        _mm512_storeu_ps(lut + j * pq4::kKsub, acc);
    }
}

// Moves the k largest of the n distinct keys in v to v[0, k) (in no particular order), 0 < k < n. A quickselect
// whose partition has no data-dependent branch: each key is written to both ends of a scratch array and only one
// end advances. On candidate scores in random order std::nth_element's partition mispredicts about every other
// comparison.
void select_top(uint64_t* v, size_t n, size_t k, std::vector<uint64_t>& scratch) {
    // v[0, lo) are among the k largest, v[hi, n) are not: the k - lo largest of v[lo, hi) complete them
    size_t lo = 0, hi = n;
    scratch.resize(n);
    uint64_t* t = scratch.data();
    for (int depth = 0; hi - lo > 32 && depth < 64; ++depth) {
        const size_t len = hi - lo;
        const uint64_t a = v[lo], b = v[lo + len / 2], c = v[hi - 1];
        // the median of three distinct keys: the largest of them is above it, so both sides are non-empty
        const uint64_t pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
        size_t front = 0, back = len;
        for (size_t i = lo; i < hi; ++i) {
            const uint64_t x = v[i];
            const size_t above = x > pivot;
            t[front] = x;
            t[back - 1] = x;
            front += above;
            back -= 1 - above;
        }
        std::memcpy(v + lo, t, len * sizeof(uint64_t));
        const size_t want = k - lo;
        if (front == want) return;
        if (front > want)
            hi = lo + front;
        else
            lo += front;
    }
    std::nth_element(v + lo, v + (k - 1), v + hi, std::greater<uint64_t>());
}

// The 4-bit search's candidates: 4-bit lists are scanned so fast that a heap push per candidate would cost more
// than the scan, so candidates at or above a threshold go into a buffer that is cut back to the `keep` best (the
// order of `better`, hence the same set as a heap) whenever it holds 2 keep. A candidate is one 64-bit key: the
// order-preserving bits of its score above a slot that indexes its position, so a cut is a selection on distinct
// integers (select_top), and positions are read only when scores tie across a cut and for the candidates kept.
class Candidates {
public:
    void reset(size_t keep) {
        if (keep >= (size_t{1} << 31))  // slots are 32 bits and the buffer holds up to 2 keep
            throw std::invalid_argument("ivfpq: 4-bit search keeps at most 2^31 - 1 candidates (k and rerank), got " +
                                        std::to_string(keep));
        keep_ = keep;
        keys_.clear();
        pos_.clear();
        thr_ = -std::numeric_limits<float>::infinity();
    }
    // Scores below it cannot be among the `keep` best (-inf until the first cut).
    float threshold() const { return thr_; }

    // v >= threshold(), never NaN. `pos` points at the candidate's position in its list's positions, which are
    // read only for the candidates that survive to take() (and for ties at a cut): most candidates are cut, and
    // reading each one's position where it is found would be a cache miss in a list's positions for each.
    void push(float v, const uint32_t* pos) {
        keys_.push_back(uint64_t{order_bits(v)} << 32 | static_cast<uint32_t>(pos_.size()));
        pos_.push_back(pos);
        if (keys_.size() >= 2 * keep_) cut();
    }

    // The `keep` best (fewer if fewer came), in no particular order.
    void take(std::vector<Scored>& out) {
        cut();
        out.resize(keys_.size());
        for (size_t i = 0; i < keys_.size(); ++i) out[i] = {score_of(keys_[i]), *pos_[slot(keys_[i])]};
    }

private:
    // float -> uint32 with the same order (x + 0 turns -0 into +0, which compare equal as floats; no NaN comes)
    static uint32_t order_bits(float v) {
        uint32_t u;
        const float x = v + 0.f;
        std::memcpy(&u, &x, 4);
        return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    static float score_of(uint64_t key) {
        const uint32_t o = static_cast<uint32_t>(key >> 32);
        const uint32_t u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
        float v;
        std::memcpy(&v, &u, 4);
        return v;
    }
    static uint32_t slot(uint64_t key) { return static_cast<uint32_t>(key); }

    void cut() {
        const size_t n = keys_.size();
        if (n <= keep_) return;
        if (keep_ == 0) {
            keys_.clear(), pos_.clear();
            return;
        }
        select_top(keys_.data(), n, keep_, scratch_);
        const uint64_t edge = *std::min_element(keys_.begin(), keys_.begin() + keep_) >> 32;
        for (size_t i = keep_; i < n; ++i)
            if ((keys_[i] >> 32) == edge) {
                break_tie(edge);
                break;
            }
        // renumber the kept slots
        kept_pos_.resize(keep_);
        for (size_t i = 0; i < keep_; ++i) {
            kept_pos_[i] = pos_[slot(keys_[i])];
            keys_[i] = (keys_[i] & ~uint64_t{0xffffffffu}) | i;
        }
        keys_.resize(keep_);
        pos_.swap(kept_pos_);
        thr_ = score_of(edge << 32);
    }

    // Scores equal to the edge's on both sides of the cut: the keys ordered them by slot, `better` orders them by
    // position, so the smallest positions among them take the places inside the cut.
    void break_tie(uint64_t edge) {
        tie_at_.clear();
        for (size_t i = 0; i < keys_.size(); ++i)
            if ((keys_[i] >> 32) == edge) tie_at_.push_back(i);  // inside the cut first: i ascending
        tie_keys_.clear();
        for (size_t i : tie_at_) tie_keys_.push_back(keys_[i]);
        std::sort(tie_keys_.begin(), tie_keys_.end(),
                  [&](uint64_t a, uint64_t b) { return *pos_[slot(a)] < *pos_[slot(b)]; });
        for (size_t t = 0; t < tie_at_.size(); ++t) keys_[tie_at_[t]] = tie_keys_[t];
    }

    size_t keep_ = 0;
    float thr_ = 0.f;
    std::vector<uint64_t> keys_, tie_keys_, scratch_;
    std::vector<const uint32_t*> pos_, kept_pos_;
    std::vector<size_t> tie_at_;
};

// 8-bit codes: one m x 256 float table per query, candidates into a heap.
class Scanner8 final : public Scanner {
public:
    explicit Scanner8(const PackedQuantizers& qz) : qz_(qz), lut_(static_cast<size_t>(qz.m) * kKsub8) {}

    void start(const float* qv, size_t keep) override {
        const int64_t m = qz_.m, dsub = qz_.dsub;
        for (int64_t j = 0; j < m; ++j)
            inner_products_T(qv + j * dsub, 1, &qz_.codebooks_T[j * qz_.cb_stride], kKsub8, dsub,
                             &lut_[j * kKsub8]);
        heap_.reset(keep);
    }

    void scan(const uint8_t* codes, const uint32_t* pos, int64_t len, float list_score, const uint8_t*,
              size_t) override {
        buf_.resize(len);
        adc_scan(codes, len, qz_.m, lut_.data(), list_score, buf_.data());
        float thr = heap_.threshold();
        for (int64_t i = 0; i < len; ++i) {
            if (buf_[i] >= thr) {
                heap_.push(buf_[i], pos[i]);
                thr = heap_.threshold();
            }
        }
    }

    void take(std::vector<Scored>& found, bool) override { found = heap_.take_sorted(); }

private:
    const PackedQuantizers& qz_;
    std::vector<float> lut_, buf_;
    TopK heap_;
};

// 4-bit codes: a quantized m x 16 table per query in SIMD registers (pq4.h), candidates into a Candidates buffer.
class Scanner4 final : public Scanner {
public:
    explicit Scanner4(const PackedQuantizers& qz)
        : qz_(qz),
          lut_(static_cast<size_t>(qz.m) * pq4::kKsub),
          scan_(pq4::scan_kernel()),
          filter_(pq4::filter_kernel()),
          lut4_(simd::level() == cpu::Level::AVX512 ? lut4_avx512 : lut4_scalar) {}

    void start(const float* qv, size_t keep) override {
        // m x 16 products of d/m-dimensional sub-vectors, too small for the panel kernel
        lut4_(qv, qz_.codebooks_T.data(), qz_.cb_stride, qz_.m, qz_.dsub, lut_.data());
        pq4::quantize_lut(lut_.data(), qz_.m, qlut_);
        cand_.reset(keep);
    }

    void scan(const uint8_t* codes, const uint32_t* ids, int64_t n, float list_score, const uint8_t* next,
              size_t next_bytes) override;

    void take(std::vector<Scored>& found, bool sorted) override {
        cand_.take(found);
        if (sorted) std::sort(found.begin(), found.end(), Better{});
    }

private:
    const PackedQuantizers& qz_;
    std::vector<float> lut_;
    std::vector<uint16_t> sums_;  // the integer scores of a list
    std::vector<uint32_t> hits_;  // the indices in a list whose sums reach the threshold
    pq4::QuantizedLUT qlut_;
    Candidates cand_;
    const pq4::ScanFn scan_;
    const pq4::FilterFn filter_;
    void (*const lut4_)(const float*, const float*, size_t, int64_t, int64_t, float*);
};

void Scanner4::scan(const uint8_t* codes, const uint32_t* pos, int64_t len, float list_score, const uint8_t* next,
                    size_t next_bytes) {
    const float base = list_score + qlut_.bias, delta = qlut_.delta;
    // the threshold as a sum: a list none of whose code rows can reach it is not scanned, and in a scanned one only
    // the sums that reach it are turned into scores
    const uint32_t floor = pq4::first_reaching(base, delta, cand_.threshold());
    if (floor > qlut_.max_sum) return;
    const int64_t nb = pq4::nblocks(len);
    sums_.resize(static_cast<size_t>(nb * pq4::kBlock));
    hits_.resize(static_cast<size_t>(len));
    // the scan's prefetch runs on into the head of the next list (lists probed in score order are far apart in the
    // codes, and the hardware prefetcher stops at every 4 KiB page); it may be skipped, which costs only a few
    // wasted requests
    scan_(codes, nb, qz_.m, qlut_.table.data(), sums_.data(), next, next ? next_bytes : 0);
    const uint16_t* sums = sums_.data();
    const int64_t nhits = filter_(sums, len, floor, hits_.data());
    for (int64_t h = 0; h < nhits; ++h) {
        const uint32_t i = hits_[static_cast<size_t>(h)];
        const float v = pq4::score(base, delta, sums[i]);
        if (v >= cand_.threshold()) cand_.push(v, pos + i);  // it may have risen in this list
    }
}

// The registry of scanners by code type: the two of this file, and any registered later.
struct ScannerRegistry {
    std::mutex mu;
    std::map<std::string, ScannerFactory> factories{
        {"pq8", [](const PackedQuantizers& qz) { return std::make_unique<Scanner8>(qz); }},
        {"pq4", [](const PackedQuantizers& qz) { return std::make_unique<Scanner4>(qz); }},
    };
};

ScannerRegistry& scanners() {
    static ScannerRegistry registry;
    return registry;
}

}  // namespace

void register_scanner(const std::string& code_type, ScannerFactory factory) {
    if (!factory) throw std::invalid_argument("ivfpq: register_scanner('" + code_type + "') needs a factory");
    ScannerRegistry& r = scanners();
    std::lock_guard<std::mutex> lock(r.mu);
    r.factories[code_type] = std::move(factory);
}

std::unique_ptr<Scanner> make_scanner(const std::string& code_type, const PackedQuantizers& quantizers) {
    ScannerFactory factory;
    {
        ScannerRegistry& r = scanners();
        std::lock_guard<std::mutex> lock(r.mu);
        const auto it = r.factories.find(code_type);
        if (it == r.factories.end())
            throw std::invalid_argument("ivfpq: no scanner is registered for code type '" + code_type + "'");
        factory = it->second;
    }
    return factory(quantizers);
}

void Prober::probe(int64_t nlist, int64_t d, const float* list_spread, const Plan& plan, const float* qv,
                   const float* qc, std::vector<Scored>& lists) {
    top_.reset(plan.nprobe);
    if (plan.spread == 0.f) {
        top_.push_run(qc, nlist, 0);
    } else {
        const float qn = std::sqrt(simd::kernels().dot(qv, qv, d));
        order_.resize(static_cast<size_t>(nlist));
        for (int64_t l = 0; l < nlist; ++l) order_[l] = qc[l] + qn * (plan.spread * list_spread[l]);
        top_.push_run(order_.data(), nlist, 0);
    }
    lists = top_.take_sorted();
}

}  // namespace fastdpr::ivfpq

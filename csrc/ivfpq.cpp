#include "ivfpq.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "kmeans.h"
#include "bounds.h"
#include "parallel.h"
#include "pq4.h"
#include "simd.h"
#include "sq4.h"
#include "topk.h"

namespace fastdpr {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Residuals x - c are float32, and c is a mean of such rows: |x| <= 2^126 keeps them finite. Beyond it (or at NaN
// or Inf) the codes would be computed from Inf and NaN; fastdpr/index/ivfpq.py has the same rule.
void check_magnitude(const float* x, int64_t n, int64_t d, const char* what) {
    for (int64_t i = 0; i < n; ++i) {
        bool ok = true;
        for (int64_t t = 0; t < d; ++t) ok &= std::fabs(x[i * d + t]) <= 0x1p126f;  // false for NaN
        if (!ok)
            throw std::invalid_argument(std::string("ivfpq: ") + what + " row " + str(i) +
                                        " has NaN, Inf or a component beyond 2^126 (8.5e37): its residuals would "
                                        "leave float32; rescale the vectors");
    }
}

double residual_sq(const float* x, const float* c, int64_t d) {
    double s = 0;
    for (int64_t t = 0; t < d; ++t) {
        const double r = static_cast<double>(x[t]) - c[t];
        s += r * r;
    }
    return s;
}

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
            const float* t = lut + j * IVFPQ::kKsub;
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
        for (int64_t j = 0; j < m; ++j) s += lut[j * IVFPQ::kKsub + c[j]];
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
// comparison; this one measured ~12% of a whole 4-bit search (mean pooling, rerank 400) with std::nth_element.
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
    // reading each one's position where it is found, a cache miss in a list's positions, cost ~10% of a search
    // (1M x 384, nprobe 512, rerank 1000: ~3,900 candidates per query).
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

// The re-ranks of a batch of queries (4-bit rows, then full vectors). One query's candidates are rows scattered
// over the whole file, and reading them one query at a time costs a TLB miss (a page walk) per row; the batch's
// candidates are visited instead in address order, bucketed by the ~1 MiB of rows they fall in (a counting sort:
// two passes over the ids), so that the rows of one bucket share the TLB's entries. Each query keeps the list a
// per-query re-rank gives it (the scores come from the same kernels, and ties are broken by id whatever the
// visiting order).
//
// Batches of 128 queries: tried from 16 to 1,024 at 1M x 768 (rerank 2,000, 1 thread; a trial, not a committed
// benchmark), 32-128 ran 1.25-1.3x faster than 16; from 256 on, the batch's scaled queries and heaps outgrow L2.
constexpr int64_t kBatchQueries = 128;

// The batch's arrays come from ReturnedAllocator, so that its few MiB go back to the system when the search ends.
template <class T>
using Returned = std::vector<T, ReturnedAllocator<T>>;

struct RescoreBatch {
    Returned<uint32_t> bucket;  // bucket starts
    Returned<uint64_t> order;   // (id << 16 | query in the batch), in bucket order
    Returned<Scored> best;      // (queries, keep): per query a heap of its best (TopK's order: worst at the root)
    Returned<size_t> nbest;
    Returned<float> scaled;     // 4-bit: (queries, d), sq4::prepare_query
    Returned<float> offset;     // 4-bit: per query
};

// Query i (< nb <= 65536) re-scores its candidates ids[i][0, count[i]) as score(i, row of the id) (rows of
// `row_bytes` from `rows`, ids < ntotal); its best `keep` go to b.best + i * keep, best first, their number to
// b.nbest[i].
template <class Score>
void rescore_batch(const uint32_t* const* ids, const uint32_t* count, int64_t nb, const uint8_t* rows,
                   size_t row_bytes, int64_t ntotal, size_t keep, RescoreBatch& b, Score score) {
    const size_t nq = static_cast<size_t>(nb);
    size_t total = 0;
    for (size_t i = 0; i < nq; ++i) total += count[i];
    // buckets of at most ~1 MiB of rows, and no more buckets than candidates (one query's few thousand share no
    // pages: a finer sort would only cost time)
    int shift = 0;
    while ((size_t{2} << shift) * row_bytes <= (size_t{1} << 20)) ++shift;
    while ((static_cast<size_t>(ntotal) >> shift) > total) ++shift;
    const size_t nbuckets = (static_cast<size_t>(ntotal) >> shift) + 1;
    b.bucket.assign(nbuckets + 1, 0);
    b.best.resize(nq * keep);
    b.nbest.assign(nq, 0);
    for (size_t i = 0; i < nq; ++i)
        for (uint32_t c = 0; c < count[i]; ++c) ++b.bucket[(ids[i][c] >> shift) + 1];
    for (size_t t = 0; t < nbuckets; ++t) b.bucket[t + 1] += b.bucket[t];
    b.order.resize(total);
    for (size_t i = 0; i < nq; ++i)
        for (uint32_t c = 0; c < count[i]; ++c)
            b.order[b.bucket[ids[i][c] >> shift]++] = static_cast<uint64_t>(ids[i][c]) << 16 | i;
    for (size_t c = 0; c < total; ++c) {
        // the first and last lines of the row 8 candidates ahead; the hardware prefetcher brings the lines between
        // (on both pages a row may span). One request per line, 4 rows ahead, stalled on full fill buffers: rows of
        // 1.5 KiB (d 768, fp16) read one query at a time took ~400 ns, ~270 this way (d 384: equal).
        if (c + 8 < total) {
            const uint8_t* row = rows + (b.order[c + 8] >> 16) * row_bytes;
            __builtin_prefetch(row, 0, 3);
            __builtin_prefetch(row + row_bytes - 1, 0, 3);
        }
        const int64_t id = static_cast<int64_t>(b.order[c] >> 16);
        const size_t i = b.order[c] & 0xffff;
        heap_push(&b.best[i * keep], b.nbest[i], keep, {score(i, rows + id * row_bytes), id});
    }
    for (size_t i = 0; i < nq; ++i)
        std::sort(&b.best[i * keep], &b.best[i * keep] + b.nbest[i], BetterTotal{});
}

}  // namespace

IVFPQ::IVFPQ(int64_t dim, int64_t nlist, int64_t m, int nbits, VectorStorage storage, bool assign_by_ip)
    : d_(dim), nlist_(nlist), m_(m), dsub_(0), nbits_(nbits), ksub_(int64_t{1} << (nbits == 4 ? 4 : 8)),
      storage_(storage), assign_by_ip_(assign_by_ip) {
    // checked before anything is allocated, with the ranges the loader accepts
    if (dim <= 0 || dim > kMaxDim) throw std::invalid_argument("ivfpq: dim must be in [1, 2^20], got " + str(dim));
    if (nlist <= 0 || nlist > kMaxNlist)
        throw std::invalid_argument("ivfpq: nlist must be in [1, 2^28], got " + str(nlist));
    if (m <= 0 || dim % m != 0)
        throw std::invalid_argument("ivfpq: m=" + str(m) + " must divide the dimension " + str(dim));
    if (nbits != 8 && nbits != 4)
        throw std::invalid_argument("ivfpq: nbits=" + str(nbits) + " is not supported (8- or 4-bit codes)");
    if (nbits == 4 && m > pq4::kMaxM)
        throw std::invalid_argument("ivfpq: 4-bit codes take at most " + str(pq4::kMaxM) + " sub-quantizers, got m=" +
                                    str(m));
    dsub_ = dim / m;
    code_off_.assign(static_cast<size_t>(nlist), 0);
    code_room_.assign(static_cast<size_t>(nlist), 0);
    list_pos_.resize(nlist);
    list_sq_.assign(static_cast<size_t>(nlist), 0.0);
    list_spread_.assign(static_cast<size_t>(nlist), 0.f);
}

void IVFPQ::check_trained(const char* what) const {
    if (!trained_) throw std::runtime_error(std::string("ivfpq: the index is not trained; call train() before ") + what);
}

size_t IVFPQ::vector_bytes() const {
    switch (storage_) {
        case VectorStorage::F16: return 2 * static_cast<size_t>(d_);
        case VectorStorage::F32: return 4 * static_cast<size_t>(d_);
        default: return 0;
    }
}

// Bytes of `rows` code rows of one list: 8-bit (rows, m); 4-bit whole pq4 blocks.
static size_t code_bytes(int64_t rows, int64_t m, int nbits) {
    return nbits == 4 ? pq4::packed_bytes(rows, m) : static_cast<size_t>(rows * m);
}

size_t IVFPQ::list_code_bytes(int64_t l) const { return code_bytes(list_size(l), m_, nbits_); }

// Room for len[l] rows per list; each list's start rounded up to a cache line.
static std::vector<size_t> code_offsets(const std::vector<int64_t>& len, int64_t m, int nbits, size_t& total) {
    std::vector<size_t> off(len.size());
    total = 0;
    for (size_t l = 0; l < len.size(); ++l) {
        off[l] = total;
        total = (total + code_bytes(len[l], m, nbits) + 63) & ~size_t{63};
    }
    return off;
}

void IVFPQ::relayout(const std::vector<int64_t>& room) {
    size_t total = 0;
    std::vector<size_t> off = code_offsets(room, m_, nbits_, total);
    std::vector<uint8_t, HugePageAllocator<uint8_t>> codes(total, 0);  // zeros: the padding of 4-bit blocks
    for (int64_t l = 0; l < nlist_; ++l)
        if (const size_t bytes = list_code_bytes(l)) std::memcpy(codes.data() + off[l], list_codes(l), bytes);
    codes_.swap(codes);
    code_off_.swap(off);
    code_room_ = room;
}

size_t IVFPQ::memory_bytes() const {
    const size_t n = static_cast<size_t>(ntotal_);
    return codes_.size() + n * (sizeof(uint32_t) + vector_bytes() + (sq_bits_ ? sq4::row_bytes(d_) : 0)) +
           sizeof(float) * (centroids_T_.size() + codebooks_.size()) + sizeof(double) * list_sq_.size();
}

std::vector<float> IVFPQ::centroids() const {
    if (!trained_) return {};
    return unpack_columns(centroids_T_.data(), nlist_, d_);
}

void IVFPQ::refresh_spreads() {
    for (int64_t l = 0; l < nlist_; ++l) {
        const double n = static_cast<double>(list_pos_[l].size());
        list_spread_[l] =
            n < 2 ? 0.f : static_cast<float>(std::sqrt(list_sq_[l] / n / static_cast<double>(d_) * 2.0 * std::log(n)));
    }
}

void IVFPQ::prepare_tables(const float* centroids) {
    centroids_T_ = pack_columns(centroids, nlist_, d_);
    const size_t stride = packed_size(ksub_, dsub_);  // 256 is a whole number of tiles, 16 is padded to one
    codebooks_T_.assign(stride * m_, 0.f);
    for (int64_t j = 0; j < m_; ++j) {
        const std::vector<float> t = pack_columns(&codebooks_[j * ksub_ * dsub_], ksub_, dsub_);
        std::copy(t.begin(), t.end(), codebooks_T_.begin() + j * stride);
    }
}

void IVFPQ::train(const float* x, int64_t n, const IVFPQTrainParams& p) {
    if (p.niter < 1 || p.pq_niter < 1)
        throw std::invalid_argument("ivfpq: niter and pq_niter must be >= 1");
    check_range(p.max_points_per_centroid, 1, int64_t{1} << 30, "ivfpq: max_points_per_centroid");
    check_range(p.pq_max_points_per_centroid, 1, int64_t{1} << 30, "ivfpq: pq_max_points_per_centroid");
    check_magnitude(x, n, d_, "training vectors");
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (size() > 0) throw std::runtime_error("ivfpq: cannot retrain an index that already holds vectors");
    if (n < nlist_)
        throw std::invalid_argument("ivfpq: nlist=" + str(nlist_) + " needs at least that many training vectors, got " +
                                    str(n));
    if (n < ksub_)
        throw std::invalid_argument("ivfpq: " + str(nbits_) + "-bit product quantization needs at least " +
                                    str(ksub_) + " training vectors, got " + str(n));
    KMeansParams cp;
    cp.k = nlist_;
    cp.niter = p.niter;
    cp.seed = p.seed;
    cp.spherical = p.spherical;
    cp.balance = p.balance;
    cp.max_points_per_centroid = p.max_points_per_centroid;
    const std::vector<float> cent = kmeans(x, n, d_, cp).centroids;

    // The codebooks learn residuals of a seeded subsample.
    std::mt19937_64 rng(p.seed ^ 0x9e3779b97f4a7c15ULL);
    const int64_t np = std::min(n, ksub_ * p.pq_max_points_per_centroid);
    std::vector<int64_t> pick(n);
    std::iota(pick.begin(), pick.end(), int64_t{0});
    for (int64_t i = 0; i < np; ++i) {
        std::uniform_int_distribution<int64_t> u(i, n - 1);
        std::swap(pick[i], pick[u(rng)]);
    }
    pick.resize(np);
    std::sort(pick.begin(), pick.end());
    std::vector<float> sample(static_cast<size_t>(np) * d_);
    for (int64_t i = 0; i < np; ++i) std::memcpy(&sample[i * d_], x + pick[i] * d_, sizeof(float) * d_);
    std::vector<int64_t> lists(np);
    assign_lists(cent.data(), sample.data(), np, lists.data());
    for (int64_t i = 0; i < np; ++i)
        for (int64_t t = 0; t < d_; ++t) sample[i * d_ + t] -= cent[lists[i] * d_ + t];

    codebooks_.assign(static_cast<size_t>(m_) * ksub_ * dsub_, 0.f);
    std::vector<float> sub(static_cast<size_t>(np) * dsub_);
    for (int64_t j = 0; j < m_; ++j) {
        for (int64_t i = 0; i < np; ++i)
            std::memcpy(&sub[i * dsub_], &sample[i * d_ + j * dsub_], sizeof(float) * dsub_);
        KMeansParams sp;
        sp.k = ksub_;
        sp.niter = p.pq_niter;
        sp.seed = p.seed + 1 + static_cast<uint64_t>(j);
        sp.max_points_per_centroid = p.pq_max_points_per_centroid;
        const std::vector<float> cb = kmeans(sub.data(), np, dsub_, sp).centroids;
        std::copy(cb.begin(), cb.end(), codebooks_.begin() + j * ksub_ * dsub_);
    }
    prepare_tables(cent.data());
    if (sq_bits_) {
        sq_lo_.resize(static_cast<size_t>(d_));
        sq_step_.resize(static_cast<size_t>(d_));
        sq4::train(x, n, d_, sq_lo_.data(), sq_step_.data());
    }
    trained_ = true;
}

// The ranges of an index trained by set_trained() come with its first add, which may be a single row: its range
// alone would be a point (every step 0, every later row coded as that row: recall@10 0.644 -> 0.042). A first add
// of fewer than kSqMinRows rows therefore gets ranges that cover also what the trained state can reconstruct, per
// dimension the extremes of centroid + codeword. Not always: those extremes together reach a little beyond the
// data, and coarser steps cost recall where the rows alone give the range well (synthetic 6,000 x 64, 4-bit codes:
// recall@10 0.797 from the rows, 0.786 with the reconstructions; 0.795 from one row and the reconstructions).
constexpr int64_t kSqMinRows = 256;  // as many as the fewest training vectors of an 8-bit index

void IVFPQ::fit_sq_ranges(const float* cent, const float* x, int64_t n) {
    sq_lo_.resize(static_cast<size_t>(d_));
    sq_step_.resize(static_cast<size_t>(d_));
    sq4::train(x, n, d_, sq_lo_.data(), sq_step_.data());
    if (n >= kSqMinRows) return;
    for (int64_t t = 0; t < d_; ++t) {
        const int64_t j = t / dsub_, u = t % dsub_;
        float clo = cent[t], chi = cent[t], wlo = codebooks_[j * ksub_ * dsub_ + u], whi = wlo;
        for (int64_t l = 1; l < nlist_; ++l) {
            clo = std::min(clo, cent[l * d_ + t]);
            chi = std::max(chi, cent[l * d_ + t]);
        }
        for (int64_t c = 1; c < ksub_; ++c) {
            const float w = codebooks_[(j * ksub_ + c) * dsub_ + u];
            wlo = std::min(wlo, w), whi = std::max(whi, w);
        }
        const float hi = std::max(sq_lo_[t] + sq_step_[t] * static_cast<float>(sq4::kLevels - 1), chi + whi);
        sq_lo_[t] = std::min(sq_lo_[t], clo + wlo);
        sq_step_[t] = (hi - sq_lo_[t]) / static_cast<float>(sq4::kLevels - 1);
    }
}

void IVFPQ::set_sq(int bits) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (bits != 0 && bits != 4)
        throw std::invalid_argument("ivfpq: sq must be 4 (4-bit rows for a first re-rank) or 0, got " +
                                    std::to_string(bits));
    if (size() > 0 && bits != sq_bits_)
        throw std::runtime_error("ivfpq: cannot change sq of an index holding vectors");
    sq_bits_ = bits;
    if (!bits) sq_lo_.clear(), sq_step_.clear();
}

void IVFPQ::set_trained(const float* centroids, const float* codebooks) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (size() > 0) throw std::runtime_error("ivfpq: cannot replace the trained state of an index holding vectors");
    codebooks_.assign(codebooks, codebooks + m_ * ksub_ * dsub_);
    prepare_tables(centroids);
    trained_ = true;
}

void IVFPQ::assign_lists(const float* cent, const float* x, int64_t n, int64_t* lists) const {
    assign_nearest(x, n, cent, nlist_, d_, assign_by_ip_, lists, nullptr);
}

void IVFPQ::encode_residuals(const float* cent, const float* x, int64_t n, const int64_t* lists,
                             uint8_t* codes) const {
    std::vector<float> sub(static_cast<size_t>(n) * dsub_);
    std::vector<int64_t> lab(n);
    for (int64_t j = 0; j < m_; ++j) {
        for (int64_t i = 0; i < n; ++i) {
            const float* xi = x + i * d_ + j * dsub_;
            const float* ci = cent + lists[i] * d_ + j * dsub_;
            for (int64_t t = 0; t < dsub_; ++t) sub[i * dsub_ + t] = xi[t] - ci[t];
        }
        assign_nearest(sub.data(), n, &codebooks_[j * ksub_ * dsub_], ksub_, dsub_, false, lab.data(), nullptr);
        for (int64_t i = 0; i < n; ++i) codes[i * m_ + j] = static_cast<uint8_t>(lab[i]);
    }
    if (nbits_ == 4 && aniso_eta_ != 1.f) refine_anisotropic(cent, x, n, lists, codes);
}

void IVFPQ::set_aniso_eta(float eta) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (!(eta > 0.f) || !std::isfinite(eta))
        throw std::invalid_argument("ivfpq: aniso_eta must be a positive number, got " + std::to_string(eta));
    if (nbits_ != 4 && eta != 1.f) throw std::invalid_argument("ivfpq: aniso_eta applies to 4-bit codes only");
    if (size() > 0 && eta != aniso_eta_)
        throw std::runtime_error("ivfpq: cannot change aniso_eta of an index holding vectors");
    aniso_eta_ = eta;
}

// Coordinate descent on L(r) = ||r||^2 + (eta - 1) <r, u>^2 (u = x / ||x||, r = x - c - reconstruction): one
// sub-space at a time, the codeword that minimises L with the others fixed. Each step cannot raise L, so sweeps
// from the nearest-codeword codes keep what the L2 start got right. Four sweeps, not two: at 1M x 768 (m 96,
// aniso 0.2, nprobe 256, rerank 1,000, spread 0.5) recall@100 0.927 -> 0.934 (benchmarks/results/ann_compressed.md
// before and after; eight sweeps gave no more in a trial run, not committed, and built slower).
// fastdpr/index/pq4.py (training) takes the same steps.
void IVFPQ::refine_anisotropic(const float* cent, const float* x, int64_t n, const int64_t* lists,
                               uint8_t* codes) const {
    constexpr int kSweeps = 4;
    constexpr int64_t kMaxDsub = 64;  // wider sub-vectors keep their nearest codeword
    if (dsub_ > kMaxDsub) return;
    const float w = aniso_eta_ - 1.f;
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 256) if (n >= 1024)
    for (int64_t i = 0; i < n; ++i) {
        errors.run([&] {
            thread_local std::vector<float> r, u;
            r.resize(d_);
            u.resize(d_);
            const float* xi = x + i * d_;
            const float* ci = cent + lists[i] * d_;
            double nrm = 0;
            for (int64_t t = 0; t < d_; ++t) nrm += static_cast<double>(xi[t]) * xi[t];
            if (!(nrm > 0) || !std::isfinite(nrm)) return;
            const float inv = static_cast<float>(1.0 / std::sqrt(nrm));
            uint8_t* code = codes + i * m_;
            float s = 0;  // <r, u>
            for (int64_t j = 0; j < m_; ++j) {
                const float* cw = &codebooks_[(j * ksub_ + code[j]) * dsub_];
                for (int64_t t = 0; t < dsub_; ++t) {
                    const int64_t k = j * dsub_ + t;
                    u[k] = xi[k] * inv;
                    r[k] = xi[k] - ci[k] - cw[t];
                    s += r[k] * u[k];
                }
            }
            for (int sweep = 0; sweep < kSweeps; ++sweep) {
                for (int64_t j = 0; j < m_; ++j) {
                    float* rj = &r[j * dsub_];
                    const float* uj = &u[j * dsub_];
                    const float* cb = &codebooks_[j * ksub_ * dsub_];
                    // e = r_j + current codeword (the part to quantise), s0 = <r, u> without this sub-space's code
                    float e[kMaxDsub];
                    float s0 = s;
                    const float* cur = cb + code[j] * dsub_;
                    const int64_t ds = dsub_;
                    float best = std::numeric_limits<float>::infinity();
                    int64_t arg = code[j];
                    for (int64_t t = 0; t < ds; ++t) {
                        e[t] = rj[t] + cur[t];
                        s0 += cur[t] * uj[t];
                    }
                    for (int64_t c = 0; c < ksub_; ++c) {
                        const float* cw = cb + c * ds;
                        float l2 = 0, proj = 0;
                        for (int64_t t = 0; t < ds; ++t) {
                            const float dlt = e[t] - cw[t];
                            l2 += dlt * dlt;
                            proj += uj[t] * cw[t];
                        }
                        const float par = s0 - proj;
                        const float loss = l2 + w * par * par;
                        if (loss < best) best = loss, arg = c;
                    }
                    const float* nw = cb + arg * ds;
                    float pj = 0;
                    for (int64_t t = 0; t < ds; ++t) {
                        rj[t] = e[t] - nw[t];
                        pj += uj[t] * nw[t];
                    }
                    s = s0 - pj;
                    code[j] = static_cast<uint8_t>(arg);
                }
            }
        });
    }
    errors.rethrow();
}

// The row goes at index list_size(l), inside the room relayout() made (4-bit: on zero padding).
void IVFPQ::append_codes(int64_t l, const uint8_t* row) {
    uint8_t* dst = codes_.data() + code_off_[l];
    const int64_t len = list_size(l);
    if (nbits_ == 8) {
        std::memcpy(dst + len * m_, row, static_cast<size_t>(m_));
        return;
    }
    for (int64_t j = 0; j < m_; ++j) pq4::set_code(dst, m_, len, j, row[j]);
}

void IVFPQ::encode(const float* x, int64_t n, int64_t* lists, uint8_t* codes) const {
    std::shared_lock<std::shared_mutex> lock(mu_);
    check_trained("encode()");
    const std::vector<float> cent = centroids();
    assign_lists(cent.data(), x, n, lists);
    encode_residuals(cent.data(), x, n, lists, codes);
}

void IVFPQ::own_vectors() {
    if (!vec_map_) return;
    const size_t bytes = static_cast<size_t>(ntotal_) * vector_bytes();
    if (vec_ptr_) {
        vec_owned_.assign(vec_ptr_, vec_ptr_ + bytes);
        vec_ptr_ = vec_owned_.data();
    }
    if (sq_ptr_) {
        sq_owned_.assign(sq_ptr_, sq_ptr_ + static_cast<size_t>(ntotal_) * sq4::row_bytes(d_));
        sq_ptr_ = sq_owned_.data();
    }
    vec_map_.reset();
}

void IVFPQ::add(const float* x, int64_t n) {
    check_magnitude(x, n, d_, "vectors");
    std::unique_lock<std::shared_mutex> lock(mu_);
    check_trained("add()");
    if (n <= 0) return;
    if (n > kMaxVectors - ntotal_)
        throw std::invalid_argument("ivfpq: an index holds at most 2^32 - 1 vectors; " + str(ntotal_) + " + " +
                                    str(n) + " is more");
    own_vectors();
    const std::vector<float> cent = centroids();
    constexpr int64_t kChunk = 1 << 15;  // bounds the residual buffers on large adds
    // every row's list first, so that the codes are laid out once with room for all of them
    std::vector<int64_t> all_lists(static_cast<size_t>(n));
    for (int64_t c0 = 0; c0 < n; c0 += kChunk)
        assign_lists(cent.data(), x + c0 * d_, std::min(kChunk, n - c0), all_lists.data() + c0);
    {
        std::vector<int64_t> len(static_cast<size_t>(nlist_));
        for (int64_t l = 0; l < nlist_; ++l) len[l] = list_size(l);
        for (const int64_t l : all_lists) ++len[l];
        bool fits = true;
        for (int64_t l = 0; l < nlist_; ++l) fits = fits && len[l] <= code_room_[l];
        // the first add gets exact room; later ones half as much again, so that adding in many batches copies
        // the codes a logarithmic number of times, not once per batch
        if (!fits) {
            if (ntotal_ > 0)
                for (int64_t& r : len) r += r / 2;
            relayout(len);
        }
    }
    std::vector<uint8_t> codes;
    const simd::Kernels& K = simd::kernels();
    const size_t vb = vector_bytes();
    if (vb) vec_owned_.reserve((static_cast<size_t>(ntotal_) + n) * vb);
    const size_t sqb = sq_bits_ ? sq4::row_bytes(d_) : 0;
    if (sqb) {
        if (sq_lo_.empty()) fit_sq_ranges(cent.data(), x, n);  // installed by set_trained()
        sq_owned_.reserve((static_cast<size_t>(ntotal_) + n) * sqb);
    }
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const int64_t nc = std::min(kChunk, n - c0);
        const float* xc = x + c0 * d_;
        const int64_t* lists = all_lists.data() + c0;
        codes.resize(static_cast<size_t>(nc) * m_);
        encode_residuals(cent.data(), xc, nc, lists, codes.data());
        const int64_t pos0 = size();
        for (int64_t i = 0; i < nc; ++i) {
            const int64_t l = lists[i];
            append_codes(l, &codes[i * m_]);
            list_pos_[l].push_back(static_cast<uint32_t>(pos0 + i));
            list_sq_[l] += residual_sq(xc + i * d_, &cent[l * d_], d_);
        }
        ntotal_ += nc;
        if (vb) {
            const size_t old = vec_owned_.size();
            vec_owned_.resize(old + nc * vb);
            if (storage_ == VectorStorage::F32)
                std::memcpy(&vec_owned_[old], xc, nc * vb);
            else
                K.to_half(xc, reinterpret_cast<uint16_t*>(&vec_owned_[old]), static_cast<size_t>(nc) * d_);
            vec_ptr_ = vec_owned_.data();
        }
        if (sqb) {
            const size_t old = sq_owned_.size();
            sq_owned_.resize(old + nc * sqb);
            sq4::encode(xc, nc, d_, sq_lo_.data(), sq_step_.data(), &sq_owned_[old]);
            sq_ptr_ = sq_owned_.data();
        }
    }
    refresh_spreads();
}

void IVFPQ::search(const float* q, int64_t nq, int64_t k, int64_t nprobe, int64_t rerank, float* scores,
                   int64_t* out_ids, int threads, float spread, int64_t exact) const {
    if (k <= 0) throw std::invalid_argument("ivfpq: k must be positive, got " + str(k));
    if (nprobe <= 0) throw std::invalid_argument("ivfpq: nprobe must be positive, got " + str(nprobe));
    if (rerank < 0) throw std::invalid_argument("ivfpq: rerank must be >= 0, got " + str(rerank));
    if (!(spread >= 0.f) || !std::isfinite(spread))
        throw std::invalid_argument("ivfpq: spread must be a finite number >= 0, got " + std::to_string(spread));
    if (rerank > 0 && storage_ == VectorStorage::None && !sq_bits_)
        throw std::invalid_argument(
            "ivfpq: rerank needs the full vectors or 4-bit rows; build the index with store=fp16|fp32 or sq=4");
    const int nthreads = resolve_threads(threads);
    std::shared_lock<std::shared_mutex> lock(mu_);
    check_trained("search()");
    // A query's ranking does not change when it is scaled, its scores do not leave float32 when it is not extreme:
    // one of magnitude ~1e38 would overflow every table (and the 4-bit tables' quantization with them) to
    // nothing found at all. Such queries are searched at a largest |q| in [0.5, 1) and their scores scaled back
    // (exact: powers of two).
    std::vector<float> scaled_q;
    std::vector<int> q_exponent;
    for (int64_t i = 0; i < nq; ++i) {
        const int e = magnitude_exponent(q + i * d_, d_);
        if (e == 0) continue;
        if (scaled_q.empty()) {
            scaled_q.assign(q, q + static_cast<size_t>(nq) * d_);
            q_exponent.assign(static_cast<size_t>(nq), 0);
        }
        q_exponent[i] = e;
        for (int64_t t = 0; t < d_; ++t) scaled_q[i * d_ + t] = std::ldexp(q[i * d_ + t], -e);
    }
    if (!scaled_q.empty()) {
        search_unscaled(scaled_q.data(), nq, k, nprobe, rerank, scores, out_ids, nthreads, spread, exact);
        for (int64_t i = 0; i < nq; ++i)
            if (q_exponent[i] != 0)
                for (int64_t j = 0; j < k; ++j) scores[i * k + j] = std::ldexp(scores[i * k + j], q_exponent[i]);
        return;
    }
    search_unscaled(q, nq, k, nprobe, rerank, scores, out_ids, nthreads, spread, exact);
}

void IVFPQ::search_unscaled(const float* q, int64_t nq, int64_t k, int64_t nprobe, int64_t rerank, float* scores,
                            int64_t* out_ids, int nthreads, float spread, int64_t exact) const {
    nprobe = std::min(nprobe, nlist_);
    // Candidates beyond the index size cannot exist: k and rerank beyond it only pad the output (the heaps are
    // sized by what can be found, never by what was asked).
    const int64_t kf = std::min(k, ntotal_);
    const int64_t kc = rerank > 0 ? std::min(std::max(k, rerank), ntotal_) : kf;
    const simd::Kernels& K = simd::kernels();
    const pq4::ScanFn scan4 = pq4::scan_kernel();
    const pq4::FilterFn filter4 = pq4::filter_kernel();
    const sq4::DotFn dot4 = sq4::dot_kernel();
    // the 4-bit rows are read when they are all there is, or when they cut the candidates before the exact scores
    const bool sq_stage = rerank > 0 && sq_bits_ && (storage_ == VectorStorage::None || exact > 0);
    const int64_t ke = storage_ == VectorStorage::None ? kf : std::min(std::max(kf, exact), kc);
    const auto lut4 = simd::current() == simd::Level::AVX512 ? lut4_avx512 : lut4_scalar;
    const size_t cb_stride = packed_size(ksub_, dsub_);
    // queries per coarse-product call: each centroid tile streamed from memory feeds 16 queries (two register
    // blocks of 8 while the tile sits in L2; the centroids of 2,048 lists at d 768 are 6 MiB)
    constexpr int64_t G = 16;
    const float ninf = -std::numeric_limits<float>::infinity();

    struct Scratch {
        std::vector<float> qc, lut, buf, order;
        std::vector<uint16_t> sums;  // 4-bit: integer scores of a list
        std::vector<uint32_t> hits;  // 4-bit: the indices in a list whose sums reach the threshold
        std::vector<Scored> found;   // a query's candidates (kept for its capacity)
        pq4::QuantizedLUT qlut;
        Candidates cand;  // 4-bit: candidates at or above the running threshold
        TopK probe, heap;
    };
    std::vector<Scratch> scratch(static_cast<size_t>(nthreads));  // one per thread, filled inside
    ParallelErrors errors;
    // The first k of query qi's results found[0, n) out, padded.
    const auto write = [&](int64_t qi, const Scored* found, size_t n) {
        float* so = scores + qi * k;
        int64_t* io = out_ids + qi * k;
        int64_t i = 0;
        for (; i < static_cast<int64_t>(n) && i < k; ++i) {
            so[i] = found[i].score;
            io[i] = found[i].id;
        }
        for (; i < k; ++i) so[i] = ninf, io[i] = -1;
    };
    // With a re-rank the queries go in batches: the ids of their candidates wait in `pending` (kc per query) for the
    // re-ranks of the whole batch in row order (rescore_batch): by 4-bit rows where they cut, then by full vectors.
    // (fewer queries when each has very many candidates: a batch holds at most ~2^20 ids, or one group's)
    const bool batched = rerank > 0;
    const int64_t batch =
        batched ? std::clamp(((int64_t{1} << 20) / std::max<int64_t>(kc, 1)) / G * G, G, kBatchQueries) : nq;
    static_assert(kBatchQueries % G == 0 && kBatchQueries <= 65536);
    Returned<uint32_t> pending;
    std::vector<uint32_t> npending;  // per query of the batch: how many ids wait
    std::vector<RescoreBatch> batches(batched ? static_cast<size_t>(nthreads) : 0);
    for (int64_t b0 = 0; b0 < nq; b0 += batch) {
        const int64_t bn = std::min(batch, nq - b0);
        if (batched) {
            pending.resize(static_cast<size_t>(bn * kc));
            npending.assign(static_cast<size_t>(bn), 0);
        }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1 && bn > G)
        for (int64_t g = b0 / G; g < (b0 + bn + G - 1) / G; ++g) {
            errors.run([&] {
                Scratch& sc = scratch[static_cast<size_t>(thread_index())];
                if (sc.qc.empty()) {
                    sc.qc.resize(static_cast<size_t>(G) * nlist_);
                    sc.lut.resize(static_cast<size_t>(m_) * kKsub);
                }
                std::vector<float>& qc = sc.qc;
                std::vector<float>& lut = sc.lut;
                std::vector<float>& buf = sc.buf;
                TopK& probe = sc.probe;
                TopK& heap = sc.heap;
                const int64_t q0 = g * G, gn = std::min(G, nq - q0);
                inner_products_T(q + q0 * d_, gn, centroids_T_.data(), nlist_, d_, qc.data());
                for (int64_t r = 0; r < gn; ++r) {
                    const float* qv = q + (q0 + r) * d_;
                    const float* qcr = qc.data() + r * nlist_;
                    probe.reset(nprobe);
                    if (spread == 0.f) {
                        probe.push_run(qcr, nlist_, 0);
                    } else {
                        const float qn = std::sqrt(K.dot(qv, qv, d_));
                        sc.order.resize(static_cast<size_t>(nlist_));
                        for (int64_t l = 0; l < nlist_; ++l) sc.order[l] = qcr[l] + qn * (spread * list_spread_[l]);
                        probe.push_run(sc.order.data(), nlist_, 0);
                    }
                    const std::vector<Scored> lists = probe.take_sorted();
                    if (nbits_ == 4) {
                        // m x 16 products of d/m-dimensional sub-vectors, too small for the panel kernel
                        lut4(qv, codebooks_T_.data(), cb_stride, m_, dsub_, lut.data());
                        pq4::quantize_lut(lut.data(), m_, sc.qlut);
                    } else {
                        for (int64_t j = 0; j < m_; ++j)
                            inner_products_T(qv + j * dsub_, 1, &codebooks_T_[j * cb_stride], kKsub, dsub_,
                                             &lut[j * kKsub]);
                    }
                    heap.reset(kc);
                    Candidates& cand = sc.cand;
                    if (nbits_ == 4) cand.reset(static_cast<size_t>(kc));
                    for (size_t li = 0; li < lists.size(); ++li) {
                        const int64_t l = lists[li].id;
                        const float list_score = qcr[l];  // <q, c>: the probe order may add the spread
                        const int64_t len = static_cast<int64_t>(list_pos_[l].size());
                        if (len == 0) continue;
                        if (nbits_ == 4) {
                            const float base = list_score + sc.qlut.bias, delta = sc.qlut.delta;
                            // the threshold as a sum: a list none of whose code rows can reach it is not scanned,
                            // and in a scanned one only the sums that reach it are turned into scores
                            const uint32_t floor = pq4::first_reaching(base, delta, cand.threshold());
                            if (floor > sc.qlut.max_sum) continue;
                            const int64_t nb = pq4::nblocks(len);
                            sc.sums.resize(static_cast<size_t>(nb * pq4::kBlock));
                            sc.hits.resize(static_cast<size_t>(len));
                            // the scan's prefetch runs on into the head of the next list (lists probed in score
                            // order are far apart in codes_, and the hardware prefetcher stops at every 4 KiB page);
                            // it may be skipped, which costs only a few wasted requests
                            const bool more = li + 1 < lists.size();
                            scan4(list_codes(l), nb, m_, sc.qlut.table.data(), sc.sums.data(),
                                  more ? list_codes(lists[li + 1].id) : nullptr,
                                  more ? list_code_bytes(lists[li + 1].id) : 0);
                            const uint16_t* sums = sc.sums.data();
                            const uint32_t* pos = list_pos_[l].data();
                            const int64_t nhits = filter4(sums, len, floor, sc.hits.data());
                            for (int64_t h = 0; h < nhits; ++h) {
                                const uint32_t i = sc.hits[static_cast<size_t>(h)];
                                const float v = pq4::score(base, delta, sums[i]);
                                if (v >= cand.threshold()) cand.push(v, pos + i);  // it may have risen in this list
                            }
                            continue;
                        }
                        buf.resize(len);
                        adc_scan(list_codes(l), len, m_, lut.data(), list_score, buf.data());
                        const uint32_t* pos = list_pos_[l].data();
                        float thr = heap.threshold();
                        for (int64_t i = 0; i < len; ++i) {
                            if (buf[i] >= thr) {
                                heap.push(buf[i], pos[i]);
                                thr = heap.threshold();
                            }
                        }
                    }
                    std::vector<Scored>& found = sc.found;
                    if (nbits_ == 4) {
                        cand.take(found);
                        // re-ranking re-sorts anyway
                        if (rerank == 0) std::sort(found.begin(), found.end(), Better{});
                    } else {
                        found = heap.take_sorted();
                    }
                    if (!batched) {
                        write(q0 + r, found.data(), found.size());
                        continue;
                    }
                    const size_t i = static_cast<size_t>(q0 + r - b0);
                    for (size_t c = 0; c < found.size(); ++c)  // <= kc
                        pending[i * kc + c] = static_cast<uint32_t>(found[c].id);
                    npending[i] = static_cast<uint32_t>(found.size());
                }
            });
        }
        errors.rethrow();
        if (!batched) continue;
        // the re-ranks: one part of the batch per thread, of consecutive queries
        const int64_t parts = std::min<int64_t>(nthreads, bn);
#pragma omp parallel for schedule(static, 1) num_threads(nthreads) if (parts > 1)
        for (int64_t t = 0; t < parts; ++t) {
            errors.run([&] {
                const int64_t i0 = bn * t / parts, n = bn * (t + 1) / parts - i0;
                RescoreBatch& rb = batches[static_cast<size_t>(t)];
                std::vector<uint32_t*> ids(static_cast<size_t>(n));
                std::vector<uint32_t> count(static_cast<size_t>(n));
                for (int64_t j = 0; j < n; ++j) {
                    ids[j] = pending.data() + static_cast<size_t>((i0 + j) * kc);
                    count[j] = npending[static_cast<size_t>(i0 + j)];
                }
                if (sq_stage) {
                    // the queries with more candidates than `exact` (all of them without stored vectors)
                    std::vector<int64_t> cut;
                    for (int64_t j = 0; j < n; ++j)
                        if (storage_ == VectorStorage::None || count[j] > static_cast<uint32_t>(ke)) cut.push_back(j);
                    const size_t nc = cut.size(), dd = static_cast<size_t>(d_);
                    std::vector<const uint32_t*> cut_ids(nc);
                    std::vector<uint32_t> cut_count(nc);
                    rb.scaled.resize(nc * dd);
                    rb.offset.resize(nc);
                    for (size_t c = 0; c < nc; ++c) {
                        cut_ids[c] = ids[cut[c]];
                        cut_count[c] = count[cut[c]];
                        rb.offset[c] = sq4::prepare_query(q + (b0 + i0 + cut[c]) * d_, d_, sq_lo_.data(),
                                                          sq_step_.data(), &rb.scaled[c * dd]);
                    }
                    rescore_batch(cut_ids.data(), cut_count.data(), static_cast<int64_t>(nc), sq_ptr_,
                                  sq4::row_bytes(d_), ntotal_, static_cast<size_t>(ke), rb,
                                  [&](size_t c, const uint8_t* row) {
                                      return rb.offset[c] + dot4(&rb.scaled[c * dd], row, d_);
                                  });
                    for (size_t c = 0; c < nc; ++c) {
                        const Scored* best = &rb.best[c * static_cast<size_t>(ke)];
                        if (storage_ == VectorStorage::None) {  // the 4-bit scores are the answer
                            write(b0 + i0 + cut[c], best, rb.nbest[c]);
                            continue;
                        }
                        for (size_t r = 0; r < rb.nbest[c]; ++r) ids[cut[c]][r] = static_cast<uint32_t>(best[r].id);
                        count[cut[c]] = static_cast<uint32_t>(rb.nbest[c]);
                    }
                    if (storage_ == VectorStorage::None) return;
                }
                const bool f32 = storage_ == VectorStorage::F32;
                rescore_batch(ids.data(), count.data(), n, vec_ptr_, vector_bytes(), ntotal_, static_cast<size_t>(kf),
                              rb, [&](size_t j, const uint8_t* row) {
                                  const float* qv = q + (b0 + i0 + static_cast<int64_t>(j)) * d_;
                                  return f32 ? K.dot(qv, reinterpret_cast<const float*>(row), d_)
                                             : K.dot_f16(qv, reinterpret_cast<const uint16_t*>(row), d_);
                              });
                for (int64_t j = 0; j < n; ++j)
                    write(b0 + i0 + j, &rb.best[static_cast<size_t>(j * kf)], rb.nbest[static_cast<size_t>(j)]);
            });
        }
        errors.rethrow();
    }
}

void IVFPQ::save(io::Writer& w) const {
    std::shared_lock<std::shared_mutex> lock(mu_);
    w.meta("dim", d_);
    w.meta("nlist", nlist_);
    w.meta("m", m_);
    w.meta("nbits", int64_t{nbits_});
    if (nbits_ == 4) w.meta_float("aniso_eta", aniso_eta_);
    w.meta("storage", static_cast<int64_t>(storage_));
    if (sq_bits_) w.meta("sq_bits", int64_t{sq_bits_});
    w.meta("assign_by_ip", int64_t{assign_by_ip_ ? 1 : 0});
    w.meta("trained", int64_t{trained_ ? 1 : 0});
    w.meta("ntotal", ntotal_);
    if (trained_) {
        w.add_vector("centroids", centroids());
        w.add_vector("codebooks", codebooks_);
    }
    std::vector<int64_t> offsets(nlist_ + 1, 0);
    for (int64_t l = 0; l < nlist_; ++l) offsets[l + 1] = offsets[l] + static_cast<int64_t>(list_pos_[l].size());
    std::vector<uint8_t> codes;
    std::vector<int64_t> pos;  // int64 in the file (the format predates 4-byte positions in memory)
    codes.reserve(nbits_ == 4 ? pq4::packed_bytes(ntotal_, m_) + nlist_ * pq4::block_bytes(m_)
                              : static_cast<size_t>(ntotal_) * m_);
    pos.reserve(ntotal_);
    for (int64_t l = 0; l < nlist_; ++l) {
        codes.insert(codes.end(), list_codes(l), list_codes(l) + list_code_bytes(l));
        pos.insert(pos.end(), list_pos_[l].begin(), list_pos_[l].end());
    }
    w.add_vector("list_offsets", offsets);
    w.add_vector("codes", codes);
    w.add_vector("list_pos", pos);
    w.add_vector("list_resid_sq", list_sq_);
    if (storage_ != VectorStorage::None) w.add("vectors", vec_ptr_, static_cast<size_t>(ntotal_) * vector_bytes());
    if (sq_bits_ && !sq_lo_.empty()) {
        w.add_vector("sq_lo", sq_lo_);
        w.add_vector("sq_step", sq_step_);
        w.add("sq_rows", sq_ptr_, static_cast<size_t>(ntotal_) * sq4::row_bytes(d_));
    }
}

std::unique_ptr<IVFPQ> IVFPQ::load(const io::Reader& rd, bool mmap_vectors) {
    if (rd.type() != "ivfpq") rd.fail("it holds a '" + rd.type() + "' index, not an ivfpq one");
    const int64_t d = rd.meta_int("dim", 1, kMaxDim);
    const int64_t nlist = rd.meta_int("nlist", 1, kMaxNlist);
    const int64_t m = rd.meta_int("m", 1, d);
    if (d % m != 0) rd.fail("m does not divide dim");
    const int nbits = static_cast<int>(rd.meta_int("nbits", 4, 8));
    if (nbits != 4 && nbits != 8) rd.fail("nbits must be 4 or 8");
    if (nbits == 4 && m > pq4::kMaxM) rd.fail("m is too large for 4-bit codes");
    const int64_t ksub = int64_t{1} << nbits;
    float eta = 1.f;
    if (nbits == 4 && rd.has_meta("aniso_eta")) {
        eta = static_cast<float>(rd.meta_float("aniso_eta"));
        if (!(eta > 0.f) || !std::isfinite(eta)) rd.fail("aniso_eta must be a positive number");
    }
    const auto storage = static_cast<VectorStorage>(rd.meta_int("storage", 0, 2));
    const bool by_ip = rd.meta_int("assign_by_ip", 0, 1) == 1;
    const bool trained = rd.meta_int("trained", 0, 1) == 1;
    const int64_t n = rd.meta_int("ntotal", 0, kMaxVectors);
    if (!trained && n > 0) rd.fail("untrained index with vectors");

    // Every section's size is checked against the metadata before anything is allocated: the metadata alone (a
    // huge nlist, say) must not make the loader allocate what the file does not hold.
    const float* c = trained ? rd.array<float>("centroids", static_cast<size_t>(nlist * d)) : nullptr;
    const float* cb = trained ? rd.array<float>("codebooks", static_cast<size_t>(m * ksub * (d / m))) : nullptr;
    if (trained) {
        rd.check_finite("centroids", c, static_cast<size_t>(nlist * d));
        rd.check_finite("codebooks", cb, static_cast<size_t>(m * ksub * (d / m)));
    }
    const int64_t* off = rd.array<int64_t>("list_offsets", static_cast<size_t>(nlist + 1));
    if (off[0] != 0 || off[nlist] != n) rd.fail("list offsets do not cover the vectors");
    for (int64_t l = 0; l < nlist; ++l)
        if (off[l + 1] < off[l]) rd.fail("list offsets are not increasing");
    // 8-bit: (n, m) codes; 4-bit: each list's pq4 blocks, one list after the other
    size_t all_code_bytes = 0;
    for (int64_t l = 0; l < nlist; ++l) all_code_bytes += code_bytes(off[l + 1] - off[l], m, nbits);
    const uint8_t* codes = rd.array<uint8_t>("codes", all_code_bytes);
    const int64_t* pos = rd.array<int64_t>("list_pos", static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        if (pos[i] < 0 || pos[i] >= n) rd.fail("list position out of range");
    {  // every vector filed exactly once (a repeated position would come back twice from one search)
        std::vector<bool> seen(static_cast<size_t>(n), false);
        for (int64_t i = 0; i < n; ++i) {
            if (seen[static_cast<size_t>(pos[i])]) rd.fail("list positions repeat a vector");
            seen[static_cast<size_t>(pos[i])] = true;
        }
    }
    const size_t vbytes = static_cast<size_t>(n) * static_cast<size_t>(d) *
                          (storage == VectorStorage::F32 ? 4 : storage == VectorStorage::F16 ? 2 : 0);
    const uint8_t* v = storage != VectorStorage::None ? rd.array<uint8_t>("vectors", vbytes) : nullptr;
    if (storage == VectorStorage::F32) rd.check_finite("vectors", reinterpret_cast<const float*>(v), vbytes / 4);
    if (storage == VectorStorage::F16)
        rd.check_finite_half("vectors", reinterpret_cast<const uint16_t*>(v), vbytes / 2);

    const int sq_bits = rd.has_meta("sq_bits") ? static_cast<int>(rd.meta_int("sq_bits", 4, 4)) : 0;
    const float *sq_lo = nullptr, *sq_step = nullptr;
    const uint8_t* sq_rows = nullptr;
    if (sq_bits && (rd.has("sq_lo") || n > 0)) {  // ranges come with the first rows
        sq_lo = rd.array<float>("sq_lo", static_cast<size_t>(d));
        sq_step = rd.array<float>("sq_step", static_cast<size_t>(d));
        for (int64_t t = 0; t < d; ++t)
            if (!std::isfinite(sq_lo[t]) || !(sq_step[t] >= 0) || !std::isfinite(sq_lo[t] + 15.f * sq_step[t]))
                rd.fail("4-bit row ranges must be finite (steps >= 0)");
        sq_rows = rd.array<uint8_t>("sq_rows", static_cast<size_t>(n) * sq4::row_bytes(d));
    }

    auto idx = std::make_unique<IVFPQ>(d, nlist, m, nbits, storage, by_ip);
    idx->sq_bits_ = sq_bits;
    if (trained) idx->set_trained(c, cb);
    idx->aniso_eta_ = eta;
    {
        std::vector<int64_t> len(static_cast<size_t>(nlist));
        for (int64_t l = 0; l < nlist; ++l) len[l] = off[l + 1] - off[l];
        idx->relayout(len);  // empty lists of the new sizes
    }
    size_t at = 0;
    for (int64_t l = 0; l < nlist; ++l) {
        idx->list_pos_[l].assign(pos + off[l], pos + off[l + 1]);  // < n <= kMaxVectors: checked above
        const size_t bytes = idx->list_code_bytes(l);
        // (an index of empty lists has no code buffer at all: memcpy must not see its null pointer)
        if (bytes) std::memcpy(idx->codes_.data() + idx->code_off_[l], codes + at, bytes);
        at += bytes;
    }
    idx->ntotal_ = n;
    // files written before the spreads were kept have none: the probe order is then <q, c> whatever the spread
    if (rd.has("list_resid_sq")) {
        const double* sq = rd.array<double>("list_resid_sq", static_cast<size_t>(nlist));
        for (int64_t l = 0; l < nlist; ++l)
            if (!(sq[l] >= 0) || !std::isfinite(sq[l])) rd.fail("list residual sums must be finite and >= 0");
        idx->list_sq_.assign(sq, sq + nlist);
        idx->refresh_spreads();
        for (int64_t l = 0; l < nlist; ++l)  // a finite sum can still give a spread beyond float32
            if (!std::isfinite(idx->list_spread_[l])) rd.fail("list residual sums too large for their spreads");
    }
    // re-rank rows (full vectors, 4-bit rows): left in the file mapping, or copied into owned memory
    const auto place = [&](const uint8_t* src, size_t bytes, auto& owned, const uint8_t*& ptr) {
        if (mmap_vectors && bytes > 0) {
            idx->vec_map_ = rd.mapping();
            ptr = src;
        } else {
            owned.assign(src, src + bytes);
            ptr = owned.data();
        }
    };
    if (storage != VectorStorage::None) place(v, vbytes, idx->vec_owned_, idx->vec_ptr_);
    if (sq_lo) {
        idx->sq_lo_.assign(sq_lo, sq_lo + d);
        idx->sq_step_.assign(sq_step, sq_step + d);
        place(sq_rows, static_cast<size_t>(n) * sq4::row_bytes(d), idx->sq_owned_, idx->sq_ptr_);
    }
    return idx;
}

}  // namespace fastdpr

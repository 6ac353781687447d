#include "ivfpq.h"

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

#include "bounds.h"
#include "ivfpq_search.h"
#include "kmeans.h"
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


}  // namespace

IVFPQ::IVFPQ(int64_t dim, int64_t nlist, int64_t m, int nbits, VectorStorage storage, bool assign_by_ip)
    : d_(dim), nlist_(nlist), m_(m), dsub_(0), nbits_(nbits), ksub_(int64_t{1} << (nbits == 4 ? 4 : 8)),
      storage_(storage), assign_by_ip_(assign_by_ip),
      lists_(0, CodeLayout{1, 8}) {  // no lists until the arguments are checked: a bad nlist must not allocate
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
    lists_ = IVFLists(nlist, CodeLayout{m, nbits});
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

size_t IVFPQ::memory_bytes() const {
    const size_t n = static_cast<size_t>(ntotal_);
    return lists_.memory_bytes() + n * (vector_bytes() + (sq_bits_ ? sq4::row_bytes(d_) : 0)) +
           sizeof(float) * (tables_.centroids_T.size() + codebooks_.size()) + sizeof(double) * list_sq_.size();
}

std::vector<float> IVFPQ::centroids() const {
    if (!trained_) return {};
    return unpack_columns(tables_.centroids_T.data(), nlist_, d_);
}

void IVFPQ::refresh_spreads() {
    for (int64_t l = 0; l < nlist_; ++l) {
        const double n = static_cast<double>(lists_.size(l));
        list_spread_[l] =
            n < 2 ? 0.f : static_cast<float>(std::sqrt(list_sq_[l] / n / static_cast<double>(d_) * 2.0 * std::log(n)));
    }
}

void IVFPQ::prepare_tables(const float* centroids) {
    tables_.pack(centroids, nlist_, d_, codebooks_.data(), m_, ksub_);
}

void IVFPQ::train(const float* x, int64_t n, const IVFPQTrainParams& p) {
    if (p.niter < 1 || p.pq_niter < 1)
        throw std::invalid_argument("ivfpq: niter and pq_niter must be >= 1");
    check_range(p.max_points_per_centroid, 1, int64_t{1} << 30, "ivfpq: max_points_per_centroid");
    check_range(p.pq_max_points_per_centroid, 1, int64_t{1} << 30, "ivfpq: pq_max_points_per_centroid");
    if (p.groups < 0 || p.groups > nlist_)
        throw std::invalid_argument("ivfpq: groups must be in [0, nlist=" + str(nlist_) +
                                    "] (0: one flat k-means), got " + str(p.groups));
    check_magnitude(x, n, d_, "training vectors");
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (size() > 0) throw std::runtime_error("ivfpq: cannot retrain an index that already holds vectors");
    // the sample below is filed under the new centroids, whose groups then stay cached: dropped again if training
    // fails before they are installed
    forget_coarse_groups();
    try {
        train_locked(x, n, p);
    } catch (...) {
        forget_coarse_groups();
        throw;
    }
}

void IVFPQ::train_locked(const float* x, int64_t n, const IVFPQTrainParams& p) {
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
    const std::vector<float> cent =
        p.groups > 0 ? two_level_kmeans(x, n, d_, cp, p.groups) : kmeans(x, n, d_, cp).centroids;

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
// alone would be a point (every step 0, every later row coded as that row, and the 4-bit re-rank would rank
// nothing). A first add of fewer than kSqMinRows rows therefore gets ranges that cover also what the trained state
// can reconstruct, per dimension the extremes of centroid + codeword. Not always: those extremes together reach a
// little beyond the data, and coarser steps cost recall where the rows alone give the range well.
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
    forget_coarse_groups();
    trained_ = true;
}

std::shared_ptr<const CoarseGroups> IVFPQ::coarse_groups(const float* cent) const {
    std::lock_guard<std::mutex> g(coarse_mu_);
    if (!coarse_) coarse_ = std::make_shared<const CoarseGroups>(cent, nlist_, d_);
    return coarse_;
}

void IVFPQ::forget_coarse_groups() {
    std::lock_guard<std::mutex> g(coarse_mu_);
    coarse_.reset();
}

// Filing against every centroid costs n x nlist x d multiply-adds: 21M rows into 65,536 lists of 768 dimensions
// are 1e15.
// Through CoarseGroups a row meets ~4 sqrt(nlist) group centres and the members of kAssignProbeGroups of them
// (coarse.cpp says why these counts). 200,000 calibrated 768-dimensional rows into 16,384 lists: 0.991 of them in
// their exact list, the others in a near one, about 8x faster than flat (benchmarks/results/coarse.md). Indexes
// below kGroupedAssignMinLists (every one built before) keep exact filing.
void IVFPQ::assign_lists(const float* cent, const float* x, int64_t n, int64_t* lists) const {
    if (nlist_ >= kGroupedAssignMinLists) {
        coarse_groups(cent)->assign(x, n, kAssignProbeGroups, assign_by_ip_, lists);
        return;
    }
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
// from the nearest-codeword codes keep what the L2 start got right. Four sweeps: more of them keep lowering L while
// each costs a pass over the sub-spaces at build time.
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

namespace {
// Capacity for `need` bytes, grown by half again when it must grow: adding in many batches then copies the rows a
// logarithmic number of times, not once per batch (quadratic in the batches, and twice the rows resident while
// each copy lasts).
template <class Vec>
void grow_to(Vec& v, size_t need) {
    if (need > v.capacity()) v.reserve(std::max(need, v.capacity() + v.capacity() / 2));
}
}  // namespace

void IVFPQ::reserve(int64_t n) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (n <= ntotal_) return;
    if (n > kMaxVectors) throw std::invalid_argument("ivfpq: an index holds at most 2^32 - 1 vectors");
    own_vectors();
    const size_t vb = vector_bytes();
    if (vb) vec_owned_.reserve(static_cast<size_t>(n) * vb);
    if (sq_bits_) sq_owned_.reserve(static_cast<size_t>(n) * sq4::row_bytes(d_));
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
        std::vector<int64_t> added(static_cast<size_t>(nlist_), 0);
        for (const int64_t l : all_lists) ++added[l];
        lists_.make_room(added);
    }
    std::vector<uint8_t> codes;
    const simd::Kernels& K = simd::kernels();
    const size_t vb = vector_bytes();
    if (vb) grow_to(vec_owned_, (static_cast<size_t>(ntotal_) + n) * vb);
    const size_t sqb = sq_bits_ ? sq4::row_bytes(d_) : 0;
    if (sqb) {
        if (sq_lo_.empty()) fit_sq_ranges(cent.data(), x, n);  // installed by set_trained()
        grow_to(sq_owned_, (static_cast<size_t>(ntotal_) + n) * sqb);
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
            lists_.append(l, &codes[i * m_], static_cast<uint32_t>(pos0 + i));
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
    const ivfpq::IndexView ix = view();
    const ivfpq::Plan plan = ivfpq::Plan::make(ix, k, nprobe, rerank, spread, exact);
    ivfpq::search(ix, plan, q, nq, scores, out_ids, nthreads);
}

ivfpq::IndexView IVFPQ::view() const {
    ivfpq::RerankRows rows;
    rows.ntotal = ntotal_;
    rows.vectors = vec_ptr_;
    rows.has_vectors = storage_ != VectorStorage::None;
    rows.vectors_f32 = storage_ == VectorStorage::F32;
    rows.vector_bytes = vector_bytes();
    rows.sq_rows = sq_ptr_;
    rows.has_sq = sq_bits_ != 0;
    rows.sq_lo = sq_lo_.data();
    rows.sq_step = sq_step_.data();
    return {tables_, list_spread_.data(), lists_, rows};
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
    lists_.save(w);  // list_offsets, codes, list_pos
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
    // list_offsets, codes (8-bit: (n, m); 4-bit: each list's pq4 blocks, one list after the other), list_pos
    IVFLists lists = IVFLists::load(rd, nlist, CodeLayout{m, nbits}, n);
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
    idx->lists_ = std::move(lists);
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
            idx->vec_map_->advise_random(src, bytes);
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

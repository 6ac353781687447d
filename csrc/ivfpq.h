// IVF-PQ for maximum inner product.
//
// Coarse level: nlist k-means centroids (fastdpr/index/ivfpq.py asks for L2 k-means with balanced lists by default:
// it ranks a query's top-100 into far fewer vectors scanned than spherical lists on non-normalised vectors). A vector
// is filed under its nearest centroid in L2 (with unit centroids: the largest inner product; assign_by_ip forces
// the latter) and
// its residual r = x - c is product-quantised: m sub-vectors of d/m dimensions, each replaced by the index of the nearest of 256 codewords.
// Inner products decompose exactly over that split:
//     <q, x> ~= <q, c> + <q, r_hat> = <q, c> + sum_j LUT_j[code_j],   LUT_j[t] = <q_j, codeword_j,t>
// and for inner product the table does not depend on the list (unlike L2), so one m x 256 table per query serves
// every probed list. Lists are probed in order of <q, c> (+ spread |q| s_l, see list_spread()). The top `rerank`
// candidates can be re-scored exactly from the stored full vectors (fp16 or fp32, memory-mappable on load), after
// an optional cut to the best `exact` by 4-bit scalar-quantized rows (set_sq, csrc/sq4.h), which are read a quarter
// as many bytes per candidate.
//
// nbits = 4: 16 codewords per sub-space, codes packed in blocks of 32 vectors per list and scored with uint8
// tables in SIMD registers (pq4.h), then re-ranked exactly. With aniso_eta > 1 a vector's codes are chosen for the
// score-aware loss ||r_perp||^2 + eta ||r_par||^2 of its quantization error r = x - x_hat (r_par: along x), by
// coordinate descent over the sub-spaces from the nearest-codeword start (fastdpr/index/pq4.py trains the
// codebooks for the same loss and explains eta).
//
// The index files rows and keeps the re-rank rows; the lists are a store of their own (IVFLists, csrc/ivf_lists.h)
// that it owns, and the search is the stages of csrc/ivfpq_search.h, which read the quantizers, the lists and the
// re-rank rows through an IndexView and never this class.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "coarse.h"
#include "huge_alloc.h"
#include "io.h"
#include "ivf_lists.h"
#include "ivfpq_search.h"

namespace fastdpr {

enum class VectorStorage : int { None = 0, F16 = 1, F32 = 2 };

struct IVFPQTrainParams {
    int niter = 20;              // Lloyd iterations of the coarse k-means
    int pq_niter = 20;           // ... and of each sub-quantizer's k-means
    uint64_t seed = 1234;
    // Training points per centroid (subsampled above that): IVF lists are placed well from ~40-64 points each,
    // while 256 codewords of a sub-quantizer learn from up to 256 x 256 residuals.
    int64_t max_points_per_centroid = 64;
    int64_t pq_max_points_per_centroid = 256;
    bool spherical = false;      // spherical coarse k-means (unit-norm centroids)
    double balance = 0;          // coarse k-means re-seeds lists under balance x the mean size (KMeansParams)
    // 0: one flat k-means for the coarse centroids; > 0 (at most nlist): two_level_kmeans (csrc/coarse.h) with
    // that many top-level groups, n x (groups + nlist / groups) x d per iteration instead of n x nlist x d
    int64_t groups = 0;
};

class IVFPQ {
public:
    static constexpr int kNbits = 8;
    static constexpr int64_t kKsub = 256;
    static constexpr int64_t kMaxVectors = (int64_t{1} << 32) - 1;  // positions are uint32
    // From this many lists on, rows are filed through CoarseGroups (csrc/coarse.h) instead of against every
    // centroid, probing this many of its ~4 sqrt(nlist) groups (measured in coarse.cpp and ivfpq.cpp).
    static constexpr int64_t kGroupedAssignMinLists = 16384;
    static constexpr int64_t kAssignProbeGroups = 16;

    // assign_by_ip: file vectors under the centroid of largest inner product instead of the nearest in L2.
    // nbits: 8 (256 codewords, one byte per code) or 4 (16 codewords, fast scan; m <= pq4::kMaxM).
    IVFPQ(int64_t dim, int64_t nlist, int64_t m, int nbits, VectorStorage storage, bool assign_by_ip = false);

    int64_t dim() const { return d_; }
    int64_t nlist() const { return nlist_; }
    int64_t m() const { return m_; }
    int64_t dsub() const { return dsub_; }
    int nbits() const { return nbits_; }
    int64_t ksub() const { return ksub_; }  // codewords per sub-quantizer: 2^nbits
    float aniso_eta() const { return aniso_eta_; }
    // Weight of the quantization error parallel to the vector (1: plain nearest codeword). 4-bit codes only;
    // only on an empty index (the codes already stored were chosen with the old weight).
    void set_aniso_eta(float eta);
    int64_t size() const { return ntotal_; }
    bool is_trained() const { return trained_; }
    bool assign_by_ip() const { return assign_by_ip_; }
    VectorStorage storage() const { return storage_; }
    bool vectors_mapped() const { return static_cast<bool>(vec_map_); }

    // Trains the coarse centroids and the codebooks on x (n, d). Needs n >= nlist and n >= 256.
    void train(const float* x, int64_t n, const IVFPQTrainParams& params);
    // Installs a trained state: centroids (nlist, d) and codebooks (m, ksub, dsub). Only on an empty index.
    void set_trained(const float* centroids, const float* codebooks);

    // Appends rows; they are known by their positions size() .. size()+n-1 (external ids are mapped outside).
    void add(const float* x, int64_t n);
    // Room for the rows of `n` vectors in all (stored and 4-bit rows), so that adding up to n in many calls never
    // moves them; add() alone grows the room by half again whenever it runs out.
    void reserve(int64_t n);
    // The list each row would be filed under and its m codes, without adding anything.
    void encode(const float* x, int64_t n, int64_t* lists, uint8_t* codes) const;

    // Top-k by approximate inner product over the nprobe lists of largest <q, c> + spread |q| s_l (see
    // list_spread()); with rerank > 0 the best max(k, rerank) candidates are re-scored exactly from the stored
    // vectors. Returns positions; missing results: -1 and -inf. Const and thread-safe; multi-threaded over queries
    // (threads <= 0: OpenMP's default).
    // With 4-bit rows kept (set_sq), the rerank candidates are first scored from them and only the best
    // max(k, exact) are re-scored from the stored vectors (exact <= 0: all of them, the 4-bit rows unused); an index
    // without stored vectors returns the 4-bit scores.
    void search(const float* q, int64_t nq, int64_t k, int64_t nprobe, int64_t rerank, float* scores,
                int64_t* positions, int threads = 0, float spread = 0.f, int64_t exact = 0) const;

    // Keep every vector also as a 4-bit scalar-quantized row (csrc/sq4.h) for a first re-rank: 4 or 0 (none).
    // Only on an empty index. Its ranges come from train(), or from the first add() after set_trained() together with
    // what the trained state can reconstruct (fit_sq_ranges).
    void set_sq(int bits);
    int sq_bits() const { return sq_bits_; }
    const uint8_t* sq_rows() const { return sq_ptr_; }  // size() x sq4::row_bytes(dim) bytes
    const std::vector<float>& sq_lo() const { return sq_lo_; }
    const std::vector<float>& sq_step() const { return sq_step_; }

    // (nlist, d) rows, unpacked from the copy the search streams (one copy is kept: at 1M x 768 and 2,048 lists a
    // second one would cost 6 bytes per vector).
    std::vector<float> centroids() const;
    const std::vector<float>& codebooks() const { return codebooks_; }
    // The inverted lists (csrc/ivf_lists.h): per list its code rows and their positions.
    const IVFLists& lists() const { return lists_; }
    int64_t list_size(int64_t l) const { return lists_.size(l); }
    // 8-bit: (len, m) codes; 4-bit: pq4 blocks (pq4::unpack gives the (len, m) codes); list_code_bytes(l) bytes.
    const uint8_t* list_codes(int64_t l) const { return lists_.codes(l); }
    size_t list_code_bytes(int64_t l) const { return lists_.code_bytes(l); }
    const std::vector<uint32_t>& list_positions(int64_t l) const { return lists_.id_vector(l); }
    // Sum over list l of ||x - c_l||^2, and the spread it gives the probe order: s_l = sqrt(mean ||x - c_l||^2 / d)
    // * sqrt(2 ln n_l), the expected largest <u, x - c_l> over the list's n_l members for a unit u if residuals
    // were isotropic Gaussians. Probing by <q, c> + spread |q| s_l visits first the lists whose members reach
    // further from their centroid (benchmarks/results/ann_probe_study.md: 0.958 -> 0.971 of the top-100 inside 256
    // of 2,048 lists at spread 0.5).
    double list_residual_sq(int64_t l) const { return list_sq_.at(l); }
    float list_spread(int64_t l) const { return list_spread_.at(l); }
    // Stored full vectors (size() x dim): fp32 or raw IEEE half bits; null when storage is None.
    const void* vectors() const { return vec_ptr_; }
    size_t vector_bytes() const;  // bytes per stored full vector (0, 2d or 4d)
    size_t memory_bytes() const;  // codes + positions + ids + stored vectors + centroids + codebooks

    // Sections and metadata into an open file writer (the caller adds its own and commits).
    void save(io::Writer& writer) const;
    // Every size and offset is checked against the metadata; a bad file is an io::FormatError, never a crash.
    // mmap_vectors: leave the stored full vectors in the file mapping (the page cache) instead of copying them.
    static std::unique_ptr<IVFPQ> load(const io::Reader& reader, bool mmap_vectors = false);

private:
    void check_trained(const char* what) const;
    void train_locked(const float* x, int64_t n, const IVFPQTrainParams& params);  // train() under its lock
    // search() with its checks done, the lock held and the queries of extreme magnitude scaled: the stages of
    // ivfpq_search.h over view()
    void search_unscaled(const float* q, int64_t nq, int64_t k, int64_t nprobe, int64_t rerank, float* scores,
                         int64_t* positions, int nthreads, float spread, int64_t exact) const;
    ivfpq::IndexView view() const;  // what the search stages read, valid while mu_ is held
    void prepare_tables(const float* centroids);  // tables_ from the centroids and codebooks_
    // `cent`: the centroid rows (centroids())
    void assign_lists(const float* cent, const float* x, int64_t n, int64_t* lists) const;
    // The groups of `cent` for filing with many lists, built at the first use after the trained state changed.
    std::shared_ptr<const CoarseGroups> coarse_groups(const float* cent) const;
    void forget_coarse_groups();
    void encode_residuals(const float* cent, const float* x, int64_t n, const int64_t* lists, uint8_t* codes) const;
    void refine_anisotropic(const float* cent, const float* x, int64_t n, const int64_t* lists,
                            uint8_t* codes) const;
    void refresh_spreads();  // list_spread_ from list_sq_ after adds or a load
    void fit_sq_ranges(const float* cent, const float* x, int64_t n);  // 4-bit row ranges at the first add
    void own_vectors();  // copy memory-mapped vectors (and 4-bit rows) into owned memory before appending

    // Searches share it; train/add/set_trained take it alone, so a search never sees lists being reallocated.
    mutable std::shared_mutex mu_;
    int64_t d_, nlist_, m_, dsub_;
    int nbits_;
    int64_t ksub_;
    float aniso_eta_ = 1.f;
    VectorStorage storage_;
    bool assign_by_ip_;
    bool trained_ = false;
    std::vector<float> codebooks_;    // (m, ksub, dsub)
    // the centroids and codebooks packed as the search streams them (the only copy of the centroids kept)
    ivfpq::PackedQuantizers tables_;
    // per list: code rows and positions (row numbers in the order added; 4 bytes each, hence at most kMaxVectors)
    IVFLists lists_;
    std::vector<double> list_sq_;  // per list: sum of ||x - c||^2 over its members
    std::vector<float> list_spread_;  // per list: s_l from list_sq_ and the list's size (refresh_spreads)
    int64_t ntotal_ = 0;
    std::vector<uint8_t, HugePageAllocator<uint8_t>> vec_owned_;  // re-rank rows: on huge pages
    const uint8_t* vec_ptr_ = nullptr;
    int sq_bits_ = 0;
    std::vector<float> sq_lo_, sq_step_;  // sq4 ranges (empty until trained)
    std::vector<uint8_t, HugePageAllocator<uint8_t>> sq_owned_;
    const uint8_t* sq_ptr_ = nullptr;
    std::shared_ptr<io::Mapping> vec_map_;  // the file both vec_ptr_ and sq_ptr_ point into when mapped
    // CoarseGroups of the current centroids (null until needed): built lazily under coarse_mu_, since encode()
    // runs under the shared lock and two of them may want it at once; dropped whenever the centroids change
    mutable std::mutex coarse_mu_;
    mutable std::shared_ptr<const CoarseGroups> coarse_;
};

}  // namespace fastdpr

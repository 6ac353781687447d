// IVF-PQ search in stages, composed by ivfpq::search (ivfpq_search.cpp) for IVFPQ::search:
//
//   probe   (ivfpq_scan.cpp)   the nprobe lists of one query, by <q, c> or by <q, c> + spread |q| s_l
//   scan    (ivfpq_scan.cpp)   a Scanner of the lists' code type (a registry by name: "pq8" 8-bit tables, "pq4" 4-bit
//                              fast scan) scores the (codes, ids, n) of a probed list that the search hands it and
//                              collects the candidates (a heap; the 4-bit threshold buffer)
//   re-rank (ivfpq_rerank.cpp) a chain of RerankSteps the search walks over a batch of queries' candidates, each step
//                              visiting the rows in address order: the 4-bit rows (sq=4) cut to `exact`, then the
//                              stored fp16/fp32 vectors to k
//
// A new code type is a Scanner registered under its name (register_scanner); a new re-rank step is a RerankStep
// placed in rerank_chain(). The stages know nothing of the index class (csrc/ivfpq.h): they read an IndexView of
// the quantizers' packed tables, the list store (csrc/ivf_lists.h) and the re-rank rows, valid while IVFPQ::search
// holds the index's shared lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "huge_alloc.h"
#include "ivf_lists.h"
#include "topk.h"

namespace fastdpr::ivfpq {

// The coarse centroids and the codebooks as the search streams them: packed by kmeans.h pack_columns.
struct PackedQuantizers {
    int64_t d = 0, nlist = 0, m = 0, dsub = 0, ksub = 0;
    std::vector<float, LineAlignedAllocator<float>> centroids_T;  // (nlist, d) packed for inner_products_T
    // per sub-quantizer its ksub codewords packed, cb_stride floats apart (a multiple of 16: every panel row
    // starts a cache line)
    std::vector<float, LineAlignedAllocator<float>> codebooks_T;
    size_t cb_stride = 0;

    // centroids (nlist, d) and codebooks (m, ksub, d / m); d % m == 0.
    void pack(const float* centroids, int64_t nlist, int64_t d, const float* codebooks, int64_t m, int64_t ksub);
};

// The rows the re-rank steps score (borrowed).
struct RerankRows {
    int64_t ntotal = 0;                // rows; candidates' ids are below it
    const uint8_t* vectors = nullptr;  // stored full vectors, vector_bytes each (null: none, or no rows yet)
    bool has_vectors = false;
    bool vectors_f32 = false;          // fp32; else raw IEEE half bits
    size_t vector_bytes = 0;
    const uint8_t* sq_rows = nullptr;  // 4-bit rows, sq4::row_bytes(d) each (null: none, or no rows yet)
    bool has_sq = false;
    const float* sq_lo = nullptr;      // their ranges (csrc/sq4.h)
    const float* sq_step = nullptr;
};

// What the stages read (borrowed; IVFPQ::search builds it).
struct IndexView {
    const PackedQuantizers& quantizers;
    const float* list_spread;  // per list: s_l
    const IVFLists& lists;
    RerankRows rows;
};

// One search's settings, resolved against the index.
struct Plan {
    int64_t k;        // results per query (the output's width)
    int64_t nprobe;   // lists probed, <= nlist
    float spread;     // weight of |q| s_l in the probe order
    int64_t kf;       // results that can exist: min(k, size)
    int64_t kc;       // candidates the scan keeps: max(k, rerank) with a re-rank, capped at the size; else kf
    int64_t ke;       // candidates the 4-bit rows keep for the exact re-rank (kf without stored vectors)
    bool rerank;      // the candidates go through the re-rank chain
    bool sq_stage;    // ... whose first step is the 4-bit rows

    static Plan make(const IndexView& ix, int64_t k, int64_t nprobe, int64_t rerank, float spread, int64_t exact);
};

// Top-k of the nq queries q into scores/positions (nq x k), over `nthreads` threads.
void search(const IndexView& ix, const Plan& plan, const float* q, int64_t nq, float* scores, int64_t* positions,
            int nthreads);

// Arrays whose few MiB go back to the system when the search ends (ReturnedAllocator).
template <class T>
using Returned = std::vector<T, ReturnedAllocator<T>>;

// --- probe ---------------------------------------------------------------------------------------------------------

// The probe order of one query: its nprobe lists, best first.
class Prober {
public:
    // qc: the query's <q, c> over every list; list_spread: s_l per list (read only with a spread).
    void probe(int64_t nlist, int64_t d, const float* list_spread, const Plan& plan, const float* qv, const float* qc,
               std::vector<Scored>& lists);

private:
    TopK top_;
    std::vector<float> order_;
};

// --- scan ----------------------------------------------------------------------------------------------------------

// Scores the code rows of the lists one query probes and collects its best `keep` candidates.
class Scanner {
public:
    virtual ~Scanner() = default;
    // Builds the query's tables and empties the collector.
    virtual void start(const float* qv, size_t keep) = 0;
    // n >= 1 rows of one list, laid out by the code type (IVFLists), and their ids (read as late as take(): they
    // must stay valid until then); `list_score` is <q, c>.
    // next/next_bytes: the codes of the list scanned after it (null: none), for prefetching.
    virtual void scan(const uint8_t* codes, const uint32_t* ids, int64_t n, float list_score, const uint8_t* next,
                      size_t next_bytes) = 0;
    // The candidates kept (their ids); best first if `sorted`, else in no particular order.
    virtual void take(std::vector<Scored>& found, bool sorted) = 0;
};

using ScannerFactory = std::function<std::unique_ptr<Scanner>(const PackedQuantizers&)>;
// Makes `code_type`'s scanners with `factory` from now on (replacing one registered under the same name).
void register_scanner(const std::string& code_type, ScannerFactory factory);
// A scanner of `code_type` (CodeLayout::code_type()) reading the quantizers' tables; std::invalid_argument naming
// the code type when none is registered.
std::unique_ptr<Scanner> make_scanner(const std::string& code_type, const PackedQuantizers& quantizers);

// --- re-rank -------------------------------------------------------------------------------------------------------

struct RescoreBatch;

// One step of the re-rank chain: re-scores a batch's candidates from one kind of row and keeps each query's best.
class RerankStep {
public:
    virtual ~RerankStep() = default;
    // The candidates a query keeps after this step.
    virtual int64_t keep(const Plan& plan) const = 0;
    // Query c of n (vector q + c d) re-scores its candidates ids[c][0, count[c]); its best `keep` go to
    // b.best + c keep, best first, their number to b.nbest[c].
    virtual void rescore(const float* q, int64_t d, const uint32_t* const* ids, const uint32_t* count, int64_t n,
                         size_t keep, RescoreBatch& b) const = 0;
};

// The steps a search's candidates go through, in order (empty without a re-rank).
std::vector<std::unique_ptr<const RerankStep>> rerank_chain(const IndexView& ix, const Plan& plan);

// Walks the chain over consecutive queries of a batch (one per thread; its arrays are kept between batches).
class Reranker {
public:
    Reranker();
    ~Reranker();
    Reranker(Reranker&&) noexcept;
    // Query j of n (vector q + j d) re-ranks its candidates ids[j][0, count[j]) (which the steps may overwrite).
    // A step other than the last cuts only the queries with more candidates than it keeps; the last one scores
    // every query and its results go to emit(j, best first, how many).
    using Emit = std::function<void(int64_t j, const Scored* best, size_t n)>;
    void run(const std::vector<std::unique_ptr<const RerankStep>>& chain, const Plan& plan, const float* q, int64_t d,
             int64_t n, uint32_t* const* ids, uint32_t* count, const Emit& emit);

private:
    std::unique_ptr<RescoreBatch> b_;
};

}  // namespace fastdpr::ivfpq

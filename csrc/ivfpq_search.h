// IVF-PQ search in stages, composed by ivfpq::search (ivfpq_search.cpp) for IVFPQ::search:
//
//   probe   (ivfpq_scan.cpp)   the nprobe lists of one query, by <q, c> or by <q, c> + spread |q| s_l
//   scan    (ivfpq_scan.cpp)   one Scanner per code type (8-bit tables, 4-bit fast scan) scores a probed list's codes
//                              and hands the candidates to its collector (a heap; the 4-bit threshold buffer)
//   re-rank (ivfpq_rerank.cpp) a chain over a batch of queries' candidates, each stage visiting the rows in address
//                              order: the 4-bit rows (sq=4) cut to `exact`, then the stored fp16/fp32 vectors to k
//
// A new code type is a Scanner; a new re-rank stage is one link of Reranker's chain. The stages read the index
// through an IndexView, valid while IVFPQ::search holds the index's shared lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "huge_alloc.h"
#include "ivfpq.h"
#include "topk.h"

namespace fastdpr::ivfpq {

// What the stages read of an index (borrowed; IVFPQ::view()).
struct IndexView {
    const IVFPQ& index;         // list codes and sizes, stored rows
    const float* centroids_T;   // (nlist, d) packed for inner_products_T
    const float* codebooks_T;   // per sub-quantizer its ksub codewords packed, `cb_stride` floats apart
    size_t cb_stride;
    const std::vector<uint32_t>* list_pos;  // per list: the positions of its rows
    const float* list_spread;               // per list: s_l
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
    bool sq_stage;    // ... whose first stage is the 4-bit rows

    static Plan make(const IVFPQ& index, int64_t k, int64_t nprobe, int64_t rerank, float spread, int64_t exact);
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
    // qc: the query's <q, c> over every list.
    void probe(const IndexView& ix, const Plan& plan, const float* qv, const float* qc, std::vector<Scored>& lists);

private:
    TopK top_;
    std::vector<float> order_;
};

// --- scan ----------------------------------------------------------------------------------------------------------

// Scores the codes of the lists one query probes and collects its best `keep` candidates.
class Scanner {
public:
    virtual ~Scanner() = default;
    // Builds the query's tables and empties the collector.
    virtual void start(const float* qv, size_t keep) = 0;
    // One non-empty list; `list_score` is <q, c>; `next` the list scanned after it (-1: none), for prefetching.
    virtual void scan(int64_t list, float list_score, int64_t next) = 0;
    // The candidates kept (positions as ids); best first if `sorted`, else in no particular order.
    virtual void take(std::vector<Scored>& found, bool sorted) = 0;
};

// The scanner of the index's code type.
std::unique_ptr<Scanner> make_scanner(const IndexView& ix);

// --- re-rank -------------------------------------------------------------------------------------------------------

struct RescoreBatch;

// The re-rank chain of consecutive queries of a batch (one per thread; its arrays are kept between batches).
class Reranker {
public:
    Reranker();
    ~Reranker();
    // Query j of n (vector q + j d) re-ranks its candidates ids[j][0, count[j]) (which the stages may overwrite);
    // its results go to emit(j, best first, how many).
    using Emit = std::function<void(int64_t j, const Scored* best, size_t n)>;
    void run(const IndexView& ix, const Plan& plan, const float* q, int64_t n, uint32_t* const* ids,
             uint32_t* count, const Emit& emit);

private:
    bool by_sq_rows(const IndexView& ix, const Plan& plan, const float* q, int64_t n, uint32_t* const* ids,
                    uint32_t* count, const Emit& emit);
    void by_vectors(const IndexView& ix, const Plan& plan, const float* q, int64_t n, uint32_t* const* ids,
                    const uint32_t* count, const Emit& emit);

    std::unique_ptr<RescoreBatch> b_;
};

}  // namespace fastdpr::ivfpq

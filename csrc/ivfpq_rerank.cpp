// The re-rank stages of the IVF-PQ search (ivfpq_search.h): a batch's candidates re-scored from the 4-bit rows,
// then from the stored vectors, each stage visiting the rows in address order.
#include <algorithm>
#include <cstring>

#include "ivfpq_search.h"
#include "simd.h"
#include "sq4.h"

namespace fastdpr::ivfpq {

struct RescoreBatch {
    Returned<uint32_t> bucket;  // bucket starts
    Returned<uint64_t> order;   // (id << 16 | query in the batch), in bucket order
    Returned<Scored> best;      // (queries, keep): per query a heap of its best (TopK's order: worst at the root)
    Returned<size_t> nbest;
    Returned<float> scaled;     // 4-bit: (queries, d), sq4::prepare_query
    Returned<float> offset;     // 4-bit: per query
};

namespace {

// The re-ranks of a batch of queries (4-bit rows, then full vectors). One query's candidates are rows scattered
// over the whole file, and reading them one query at a time costs a TLB miss (a page walk) per row; the batch's
// candidates are visited instead in address order, bucketed by the ~1 MiB of rows they fall in (a counting sort:
// two passes over the ids), so that the rows of one bucket share the TLB's entries. Each query keeps the list a
// per-query re-rank gives it (the scores come from the same kernels, and ties are broken by id whatever the
// visiting order).
//
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
        // (on both pages a row may span). One request per line, 4 rows ahead, stalls on full fill buffers.
        if (c + 8 < total) {
            const uint8_t* row = rows + (b.order[c + 8] >> 16) * row_bytes;
            __builtin_prefetch(row, 0, 3);
            __builtin_prefetch(row + row_bytes - 1, 0, 3);
        }
        const int64_t id = static_cast<int64_t>(b.order[c] >> 16);
        const size_t i = b.order[c] & 0xffff;
        heap_push(b.best.data() + i * keep, b.nbest[i], keep, {score(i, rows + id * row_bytes), id});
    }
    // data() + offset, not &best[offset]: with nothing to keep (an empty index) best is empty, and indexing it
    // would bind a reference to null
    for (size_t i = 0; i < nq; ++i)
        std::sort(b.best.data() + i * keep, b.best.data() + i * keep + b.nbest[i], BetterTotal{});
}

}  // namespace

Reranker::Reranker() : b_(std::make_unique<RescoreBatch>()) {}
Reranker::~Reranker() = default;

void Reranker::run(const IndexView& ix, const Plan& plan, const float* q, int64_t n, uint32_t* const* ids,
                   uint32_t* count, const Emit& emit) {
    if (plan.sq_stage && !by_sq_rows(ix, plan, q, n, ids, count, emit)) return;
    by_vectors(ix, plan, q, n, ids, count, emit);
}

// The 4-bit rows cut the candidates of the queries that have more than `ke` (all of them without stored vectors, whose
// answer this stage gives: it returns false, the chain ends here) to their best ke.
bool Reranker::by_sq_rows(const IndexView& ix, const Plan& plan, const float* q, int64_t n, uint32_t* const* ids,
                          uint32_t* count, const Emit& emit) {
    const IVFPQ& index = ix.index;
    const bool last = index.storage() == VectorStorage::None;
    std::vector<int64_t> cut;
    for (int64_t j = 0; j < n; ++j)
        if (last || count[j] > static_cast<uint32_t>(plan.ke)) cut.push_back(j);
    const int64_t d = index.dim();
    const size_t nc = cut.size(), dd = static_cast<size_t>(d);
    RescoreBatch& rb = *b_;
    std::vector<const uint32_t*> cut_ids(nc);
    std::vector<uint32_t> cut_count(nc);
    rb.scaled.resize(nc * dd);
    rb.offset.resize(nc);
    for (size_t c = 0; c < nc; ++c) {
        cut_ids[c] = ids[cut[c]];
        cut_count[c] = count[cut[c]];
        rb.offset[c] = sq4::prepare_query(q + cut[c] * d, d, index.sq_lo().data(), index.sq_step().data(),
                                          &rb.scaled[c * dd]);
    }
    const sq4::DotFn dot4 = sq4::dot_kernel();
    rescore_batch(cut_ids.data(), cut_count.data(), static_cast<int64_t>(nc), index.sq_rows(), sq4::row_bytes(d),
                  index.size(), static_cast<size_t>(plan.ke), rb,
                  [&](size_t c, const uint8_t* row) { return rb.offset[c] + dot4(&rb.scaled[c * dd], row, d); });
    for (size_t c = 0; c < nc; ++c) {
        const Scored* best = rb.best.data() + c * static_cast<size_t>(plan.ke);
        if (last) {
            emit(cut[c], best, rb.nbest[c]);
            continue;
        }
        for (size_t r = 0; r < rb.nbest[c]; ++r) ids[cut[c]][r] = static_cast<uint32_t>(best[r].id);
        count[cut[c]] = static_cast<uint32_t>(rb.nbest[c]);
    }
    return !last;
}

// The stored vectors (fp16 or fp32) give the exact scores and the best kf of every query.
void Reranker::by_vectors(const IndexView& ix, const Plan& plan, const float* q, int64_t n, uint32_t* const* ids,
                          const uint32_t* count, const Emit& emit) {
    const IVFPQ& index = ix.index;
    const int64_t d = index.dim();
    const simd::Kernels& K = simd::kernels();
    const bool f32 = index.storage() == VectorStorage::F32;
    RescoreBatch& rb = *b_;
    const uint8_t* rows = static_cast<const uint8_t*>(index.vectors());
    rescore_batch(ids, count, n, rows, index.vector_bytes(), index.size(), static_cast<size_t>(plan.kf), rb,
                  [&](size_t j, const uint8_t* row) {
                      const float* qv = q + static_cast<int64_t>(j) * d;
                      return f32 ? K.dot(qv, reinterpret_cast<const float*>(row), d)
                                 : K.dot_f16(qv, reinterpret_cast<const uint16_t*>(row), d);
                  });
    for (int64_t j = 0; j < n; ++j)
        emit(j, rb.best.data() + static_cast<size_t>(j * plan.kf), rb.nbest[static_cast<size_t>(j)]);
}

}  // namespace fastdpr::ivfpq

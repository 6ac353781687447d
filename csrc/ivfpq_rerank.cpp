// The re-rank chain of the IVF-PQ search (ivfpq_search.h): a batch's candidates re-scored by each step in turn (the
// 4-bit rows, then the stored vectors), each step visiting the rows in address order.
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
    Returned<float> queries;    // the vectors of a step's queries when it takes only some of the batch's
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

// The 4-bit rows (csrc/sq4.h): scores a quarter as many bytes per candidate as fp16 vectors read, to cut the
// candidates before the exact step, or to give the answer of an index without stored vectors.
class SqRowsStep final : public RerankStep {
public:
    explicit SqRowsStep(const RerankRows& rows) : rows_(rows) {}

    int64_t keep(const Plan& plan) const override { return plan.ke; }

    void rescore(const float* q, int64_t d, const uint32_t* const* ids, const uint32_t* count, int64_t n,
                 size_t keep, RescoreBatch& rb) const override {
        const size_t nc = static_cast<size_t>(n), dd = static_cast<size_t>(d);
        rb.scaled.resize(nc * dd);
        rb.offset.resize(nc);
        for (size_t c = 0; c < nc; ++c)
            rb.offset[c] = sq4::prepare_query(q + c * dd, d, rows_.sq_lo, rows_.sq_step, &rb.scaled[c * dd]);
        const sq4::DotFn dot4 = sq4::dot_kernel();
        rescore_batch(ids, count, n, rows_.sq_rows, sq4::row_bytes(d), rows_.ntotal, keep, rb,
                      [&](size_t c, const uint8_t* row) { return rb.offset[c] + dot4(&rb.scaled[c * dd], row, d); });
    }

private:
    RerankRows rows_;
};

// The stored vectors (fp16 or fp32): the exact scores.
class VectorsStep final : public RerankStep {
public:
    explicit VectorsStep(const RerankRows& rows) : rows_(rows) {}

    int64_t keep(const Plan& plan) const override { return plan.kf; }

    void rescore(const float* q, int64_t d, const uint32_t* const* ids, const uint32_t* count, int64_t n,
                 size_t keep, RescoreBatch& rb) const override {
        const simd::Kernels& K = simd::kernels();
        if (rows_.vectors_f32)
            rescore_batch(ids, count, n, rows_.vectors, rows_.vector_bytes, rows_.ntotal, keep, rb,
                          [&](size_t c, const uint8_t* row) {
                              return K.dot(q + c * d, reinterpret_cast<const float*>(row), d);
                          });
        else
            rescore_batch(ids, count, n, rows_.vectors, rows_.vector_bytes, rows_.ntotal, keep, rb,
                          [&](size_t c, const uint8_t* row) {
                              return K.dot_f16(q + c * d, reinterpret_cast<const uint16_t*>(row), d);
                          });
    }

private:
    RerankRows rows_;
};

}  // namespace

std::vector<std::unique_ptr<const RerankStep>> rerank_chain(const IndexView& ix, const Plan& plan) {
    std::vector<std::unique_ptr<const RerankStep>> chain;
    if (!plan.rerank) return chain;
    if (plan.sq_stage) chain.push_back(std::make_unique<SqRowsStep>(ix.rows));
    if (ix.rows.has_vectors) chain.push_back(std::make_unique<VectorsStep>(ix.rows));
    return chain;
}

Reranker::Reranker() : b_(std::make_unique<RescoreBatch>()) {}
Reranker::~Reranker() = default;
Reranker::Reranker(Reranker&&) noexcept = default;

void Reranker::run(const std::vector<std::unique_ptr<const RerankStep>>& chain, const Plan& plan, const float* q,
                   int64_t d, int64_t n, uint32_t* const* ids, uint32_t* count, const Emit& emit) {
    RescoreBatch& rb = *b_;
    std::vector<int64_t> at;
    std::vector<const uint32_t*> step_ids;
    std::vector<uint32_t> step_count;
    for (size_t s = 0; s < chain.size(); ++s) {
        const RerankStep& step = *chain[s];
        const bool last = s + 1 == chain.size();
        const int64_t keep = step.keep(plan);
        // a step before the last has nothing to cut in a query of at most `keep` candidates (the next step orders
        // them anyway)
        at.clear();
        for (int64_t j = 0; j < n; ++j)
            if (last || count[j] > static_cast<uint32_t>(keep)) at.push_back(j);
        const size_t nc = at.size(), dd = static_cast<size_t>(d);
        step_ids.resize(nc);
        step_count.resize(nc);
        for (size_t c = 0; c < nc; ++c) step_ids[c] = ids[at[c]], step_count[c] = count[at[c]];
        // The step reads its queries' vectors as rows 0..nc: a step over some of the batch gets them copied
        // together (nc d floats, against a dot product per candidate), so that the candidate loop looks nothing up
        // to find its query (benchmarks/results/ivfpq_stages_side_by_side.md).
        const float* qs = q;
        if (nc != static_cast<size_t>(n)) {
            rb.queries.resize(nc * dd);
            for (size_t c = 0; c < nc; ++c) std::memcpy(&rb.queries[c * dd], q + at[c] * d, dd * sizeof(float));
            qs = rb.queries.data();
        }
        step.rescore(qs, d, step_ids.data(), step_count.data(), static_cast<int64_t>(nc), static_cast<size_t>(keep),
                     rb);
        for (size_t c = 0; c < nc; ++c) {
            const Scored* best = rb.best.data() + c * static_cast<size_t>(keep);
            if (last) {
                emit(at[c], best, rb.nbest[c]);
                continue;
            }
            for (size_t r = 0; r < rb.nbest[c]; ++r) ids[at[c]][r] = static_cast<uint32_t>(best[r].id);
            count[at[c]] = static_cast<uint32_t>(rb.nbest[c]);
        }
    }
}

}  // namespace fastdpr::ivfpq

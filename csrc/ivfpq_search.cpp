// The IVF-PQ search composed of its stages (ivfpq_search.h): per group of queries the coarse products, then per
// query the probe and the scan; with a re-rank the candidates of a batch of queries wait for the re-rank chain.
#include "ivfpq_search.h"

#include <algorithm>
#include <limits>

#include "kmeans.h"
#include "parallel.h"

namespace fastdpr::ivfpq {
namespace {

// Queries per coarse-product call: each centroid tile streamed from memory feeds 16 queries (two register blocks of
// 8 while the tile sits in L2; the centroids of 2,048 lists at d 768 are 6 MiB).
constexpr int64_t G = 16;

// Queries per re-rank batch at most: enough that their candidates share the pages the re-rank visits in row order,
// few enough that the batch's scaled queries and heaps stay in L2.
constexpr int64_t kBatchQueries = 128;
static_assert(kBatchQueries % G == 0 && kBatchQueries <= 65536);  // the re-rank keys a query in 16 bits

// Queries per batch: all of them without a re-rank; with one, fewer when each has very many candidates (a batch
// holds at most ~2^20 ids, or one group's).
int64_t batch_size(const Plan& p, int64_t nq) {
    if (!p.rerank) return nq;
    return std::clamp(((int64_t{1} << 20) / std::max<int64_t>(p.kc, 1)) / G * G, G, kBatchQueries);
}

// The first k of a query's results found[0, n) into its output row, padded with -inf and -1.
void write_row(const Plan& p, const Scored* found, size_t n, float* scores, int64_t* positions) {
    int64_t i = 0;
    for (; i < static_cast<int64_t>(n) && i < p.k; ++i) {
        scores[i] = found[i].score;
        positions[i] = found[i].id;
    }
    for (; i < p.k; ++i) scores[i] = -std::numeric_limits<float>::infinity(), positions[i] = -1;
}

// One thread's probe and scan state, kept across groups and batches.
struct Worker {
    std::vector<float> qc;  // (G, nlist) <q, c>
    Prober prober;
    std::vector<Scored> lists, found;
    std::unique_ptr<Scanner> scanner;
};

// The candidates of query `qv` (its <q, c> in qc) into w.found: the probe, then a scan of every non-empty list,
// its codes and ids handed from the list store to the scanner.
void scan_query(const IndexView& ix, const Plan& p, const float* qv, const float* qc, Worker& w) {
    const PackedQuantizers& qz = ix.quantizers;
    const IVFLists& lists = ix.lists;
    w.prober.probe(qz.nlist, qz.d, ix.list_spread, p, qv, qc, w.lists);
    w.scanner->start(qv, static_cast<size_t>(p.kc));
    for (size_t li = 0; li < w.lists.size(); ++li) {
        const int64_t l = w.lists[li].id;
        const int64_t n = lists.size(l);
        if (n == 0) continue;
        const int64_t next = li + 1 < w.lists.size() ? w.lists[li + 1].id : -1;
        // <q, c>: the probe order may add the spread
        w.scanner->scan(lists.codes(l), lists.ids(l), n, qc[l], next >= 0 ? lists.codes(next) : nullptr,
                        next >= 0 ? lists.code_bytes(next) : 0);
    }
    w.scanner->take(w.found, !p.rerank);  // re-ranking sorts anyway
}

// What a batch's scans leave for its re-rank: per query its candidates' positions (kc apart) and their number.
struct Pending {
    Returned<uint32_t> ids;
    std::vector<uint32_t> count;
};

// Queries [b0, b0 + bn) through the probe and the scan, a group of G queries per task: their results to the output,
// or with a re-rank their candidates to `pending`.
void scan_batch(const IndexView& ix, const Plan& p, const float* q, int64_t b0, int64_t bn, float* scores,
                int64_t* positions, int nthreads, std::vector<Worker>& workers, Pending& pending) {
    const int64_t d = ix.quantizers.d, nlist = ix.quantizers.nlist;
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1 && bn > G)
    for (int64_t g = b0 / G; g < (b0 + bn + G - 1) / G; ++g) {
        errors.run([&] {
            Worker& w = workers[static_cast<size_t>(thread_index())];
            if (!w.scanner) {
                w.qc.resize(static_cast<size_t>(G * nlist));
                w.scanner = make_scanner(ix.lists.layout().code_type(), ix.quantizers);
            }
            const int64_t q0 = g * G, gn = std::min(G, b0 + bn - q0);
            inner_products_T(q + q0 * d, gn, ix.quantizers.centroids_T.data(), nlist, d, w.qc.data());
            for (int64_t r = 0; r < gn; ++r) {
                const int64_t qi = q0 + r;
                scan_query(ix, p, q + qi * d, w.qc.data() + r * nlist, w);
                if (!p.rerank) {
                    write_row(p, w.found.data(), w.found.size(), scores + qi * p.k, positions + qi * p.k);
                    continue;
                }
                const size_t i = static_cast<size_t>(qi - b0);
                for (size_t c = 0; c < w.found.size(); ++c)  // <= kc
                    pending.ids[i * p.kc + c] = static_cast<uint32_t>(w.found[c].id);
                pending.count[i] = static_cast<uint32_t>(w.found.size());
            }
        });
    }
    errors.rethrow();
}

// The re-rank chain over queries [b0, b0 + bn): one part of consecutive queries per thread.
void rerank_batch(const std::vector<std::unique_ptr<const RerankStep>>& chain, int64_t d, const Plan& p,
                  const float* q, int64_t b0, int64_t bn, float* scores, int64_t* positions, int nthreads,
                  std::vector<Reranker>& rerankers, Pending& pending) {
    const int64_t parts = std::min<int64_t>(nthreads, bn);
    ParallelErrors errors;
#pragma omp parallel for schedule(static, 1) num_threads(nthreads) if (parts > 1)
    for (int64_t t = 0; t < parts; ++t) {
        errors.run([&] {
            const int64_t i0 = bn * t / parts, n = bn * (t + 1) / parts - i0;
            std::vector<uint32_t*> ids(static_cast<size_t>(n));
            for (int64_t j = 0; j < n; ++j) ids[j] = pending.ids.data() + static_cast<size_t>((i0 + j) * p.kc);
            const int64_t first = b0 + i0;  // the part's first query
            rerankers[static_cast<size_t>(t)].run(
                chain, p, q + first * d, d, n, ids.data(), pending.count.data() + i0,
                [&](int64_t j, const Scored* best, size_t nbest) {
                    write_row(p, best, nbest, scores + (first + j) * p.k, positions + (first + j) * p.k);
                });
        });
    }
    errors.rethrow();
}

}  // namespace

void PackedQuantizers::pack(const float* centroids, int64_t nl, int64_t dim, const float* codebooks, int64_t msub,
                            int64_t ks) {
    d = dim, nlist = nl, m = msub, dsub = dim / msub, ksub = ks;
    const std::vector<float> c = pack_columns(centroids, nlist, d);
    centroids_T.assign(c.begin(), c.end());
    cb_stride = packed_size(ksub, dsub);  // 256 is a whole number of tiles, 16 is padded to one
    codebooks_T.assign(cb_stride * static_cast<size_t>(m), 0.f);
    for (int64_t j = 0; j < m; ++j) {
        const std::vector<float> t = pack_columns(codebooks + j * ksub * dsub, ksub, dsub);
        std::copy(t.begin(), t.end(), codebooks_T.begin() + static_cast<std::ptrdiff_t>(j * cb_stride));
    }
}

Plan Plan::make(const IndexView& ix, int64_t k, int64_t nprobe, int64_t rerank, float spread, int64_t exact) {
    const int64_t ntotal = ix.rows.ntotal;
    const bool stored = ix.rows.has_vectors;
    Plan p;
    p.k = k;
    p.nprobe = std::min(nprobe, ix.quantizers.nlist);
    p.spread = spread;
    // Candidates beyond the index size cannot exist: k and rerank beyond it only pad the output (the heaps are
    // sized by what can be found, never by what was asked).
    p.kf = std::min(k, ntotal);
    p.kc = rerank > 0 ? std::min(std::max(k, rerank), ntotal) : p.kf;
    p.ke = stored ? std::min(std::max(p.kf, exact), p.kc) : p.kf;
    p.rerank = rerank > 0;
    // the 4-bit rows are read when they are all there is, or when they cut the candidates before the exact scores
    p.sq_stage = rerank > 0 && ix.rows.has_sq && (!stored || exact > 0);
    return p;
}

void search(const IndexView& ix, const Plan& p, const float* q, int64_t nq, float* scores, int64_t* positions,
            int nthreads) {
    const int64_t batch = batch_size(p, nq);
    std::vector<Worker> workers(static_cast<size_t>(nthreads));
    std::vector<Reranker> rerankers(p.rerank ? static_cast<size_t>(nthreads) : 0);
    const std::vector<std::unique_ptr<const RerankStep>> chain = rerank_chain(ix, p);
    Pending pending;
    for (int64_t b0 = 0; b0 < nq; b0 += batch) {
        const int64_t bn = std::min(batch, nq - b0);
        if (p.rerank) {
            pending.ids.resize(static_cast<size_t>(bn * p.kc));
            pending.count.assign(static_cast<size_t>(bn), 0);
        }
        scan_batch(ix, p, q, b0, bn, scores, positions, nthreads, workers, pending);
        if (p.rerank)
            rerank_batch(chain, ix.quantizers.d, p, q, b0, bn, scores, positions, nthreads, rerankers, pending);
    }
}

}  // namespace fastdpr::ivfpq

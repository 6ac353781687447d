#include "flat.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>

#include "bounds.h"
#include "parallel.h"
#include "topk.h"

namespace fastdpr {

const char* storage_name(Storage s) { return s == Storage::F16 ? "fp16" : "fp32"; }

Storage parse_storage(const std::string& s) {
    if (s == "fp32" || s == "float32") return Storage::F32;
    if (s == "fp16" || s == "float16") return Storage::F16;
    throw std::invalid_argument("unknown storage '" + s + "' (expected fp32 or fp16)");
}

// ---------------------------------------------------------------------------------------------------------------
// VectorStore

void VectorStore::unmap() {
    if (!mapped_) return;
    if (storage_ == Storage::F16) {
        f16_.assign(f16(), f16() + n_ * dim_);
    } else {
        f32_.assign(f32(), f32() + n_ * dim_);
    }
    mapped_ = nullptr;
    mapping_.reset();
}

void VectorStore::reserve(size_t n) {
    const size_t count = checked_mul(n, dim_, "vector store");
    unmap();
    if (storage_ == Storage::F16) f16_.reserve(count);
    else f32_.reserve(count);
}

void VectorStore::append(const float* x, size_t n) {
    if (n == 0) return;
    if (n > static_cast<size_t>(kMaxRows) - n_)
        throw std::invalid_argument("an index holds at most 2^40 vectors; " + std::to_string(n_) + " + " +
                                    std::to_string(n) + " is more");
    const size_t count = checked_mul(n, dim_, "vectors");
    checked_mul(n_ + n, bytes_per_vector(), "vector store");
    unmap();
    if (storage_ == Storage::F16) {
        const size_t old = f16_.size();
        f16_.resize(old + count);
        simd::to_half(x, f16_.data() + old, count);
    } else {
        f32_.insert(f32_.end(), x, x + count);
    }
    n_ += n;
}

void VectorStore::save(io::Writer& w, const std::string& name) const {
    w.add(name, row_ptr(0), n_ * bytes_per_vector());
}

void VectorStore::load(const io::Reader& r, const std::string& name, size_t n, bool mmap) {
    const io::Section s = r.section(name);
    if (dim_ == 0 || s.length / bytes_per_vector() != n || s.length != n * bytes_per_vector())
        r.fail("section '" + name + "' does not hold " + std::to_string(n) + " vectors of dimension " +
               std::to_string(dim_));
    if (storage_ == Storage::F16) r.check_finite_half(name, reinterpret_cast<const uint16_t*>(s.data), n * dim_);
    else r.check_finite(name, reinterpret_cast<const float*>(s.data), n * dim_);
    n_ = n;
    f32_.clear();
    f16_.clear();
    if (mmap) {
        mapped_ = s.data;  // sections are 64-byte aligned in the file, and the mapping is page aligned
        mapping_ = r.mapping();
    } else {
        mapped_ = nullptr;
        if (storage_ == Storage::F16) {
            const uint16_t* p = reinterpret_cast<const uint16_t*>(s.data);
            f16_.assign(p, p + n * dim_);
        } else {
            const float* p = reinterpret_cast<const float*>(s.data);
            f32_.assign(p, p + n * dim_);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// blocked exact search

namespace {

// Queries per block: the packed vector panels are reused by all of them, so packing costs little per query.
// 384 is a multiple of both GEMM tile heights (12 and 6) and of 4; with d in chunks of 256 the block touches
// 384 KiB of queries at a time, which stays in L2.
constexpr size_t kQueryBlock = 384;
constexpr size_t kVectorBlock = 256;  // vectors per block (a multiple of every panel width: 8, 16, 32)
constexpr size_t kMinGemmQueries = 8; // fewer queries: plain dot products (packing would not pay)
constexpr size_t kDepthChunk = 256;

struct Scratch {
    std::vector<float> queries;  // query block padded to a multiple of the tile height
    std::vector<float> vectors;  // fp16 block converted to fp32
    std::vector<float> panels;   // packed vector block
    std::vector<float> scores;   // kQueryBlock x kVectorBlock
};

// Scores of queries [q0, q1) against vectors [v0, v1) pushed into heaps[(q - q0) * stride].
void search_block(const VectorStore& store, const simd::Kernels& K, const float* queries, size_t q0, size_t q1,
                  size_t v0, size_t v1, TopK* heaps, size_t stride, Scratch& s) {
    const size_t d = store.dim();
    const size_t nq = q1 - q0;
    const bool gemm = nq >= kMinGemmQueries;
    const float* qptr = queries + q0 * d;
    const size_t mr = K.mr, nr = K.nr;
    const size_t nq_pad = (nq + mr - 1) / mr * mr;
    if (gemm) {
        // Query tiles packed k-major (tile[k * mr + i]): the micro-kernel's broadcasts read one contiguous run per
        // k instead of mr rows d floats apart, which map to a few L1 sets at d = 768. Zero
        // rows pad the last tile; their scores are computed and ignored.
        s.queries.assign(nq_pad * d, 0.0f);
        for (size_t t = 0; t < nq; t += mr)
            for (size_t i = 0; i < mr && t + i < nq; ++i) {
                const float* row = qptr + (t + i) * d;
                float* tile = s.queries.data() + t * d + i;
                for (size_t k = 0; k < d; ++k) tile[k * mr] = row[k];
            }
        qptr = s.queries.data();
    }
    s.scores.resize(kQueryBlock * kVectorBlock);
    float* S = s.scores.data();
    const bool f16 = store.storage() == Storage::F16;
    for (size_t b0 = v0; b0 < v1; b0 += kVectorBlock) {
        const size_t nv = std::min(kVectorBlock, v1 - b0);
        if (!gemm) {
            for (size_t i = 0; i < nq; ++i) {
                if (f16) K.dot_batch_f16(qptr + i * d, store.f16() + b0 * d, nv, d, S + i * kVectorBlock);
                else K.dot_batch(qptr + i * d, store.f32() + b0 * d, nv, d, S + i * kVectorBlock);
            }
        } else {
            const float* src = store.f32() + b0 * d;
            if (f16) {
                s.vectors.resize(nv * d);
                K.from_half(store.f16() + b0 * d, s.vectors.data(), nv * d);
                src = s.vectors.data();
            }
            const size_t n_panels = (nv + nr - 1) / nr;
            s.panels.resize(n_panels * nr * d);
            for (size_t p = 0; p < n_panels; ++p)
                K.pack(src + p * nr * d, d, std::min(nr, nv - p * nr), d, s.panels.data() + p * nr * d);
            // d in chunks so that a panel chunk (32 x 256 fp32 = 32 KiB) stays in L1 while every query tile
            // passes over it; partial sums continue in S, so the order of summation over k is unchanged
            for (size_t k0 = 0; k0 < d; k0 += kDepthChunk) {
                const size_t kc = std::min(kDepthChunk, d - k0);
                for (size_t p = 0; p < n_panels; ++p)
                    for (size_t i = 0; i < nq_pad; i += mr)
                        K.gemm(qptr + i * d + k0 * mr, mr, s.panels.data() + p * nr * d + k0 * nr, kc,
                               S + i * kVectorBlock + p * nr, kVectorBlock, k0 > 0);
            }
        }
        for (size_t i = 0; i < nq; ++i) heaps[i * stride].push_run(S + i * kVectorBlock, nv, static_cast<int64_t>(b0));
    }
}

}  // namespace

void exact_search(const VectorStore& store, const float* queries, size_t nq, size_t k, float* scores, int64_t* ids,
                  int n_threads) {
    const size_t n = store.size();
    const int threads = resolve_threads(n_threads);
    if (nq == 0 || k == 0) return;
    const simd::Kernels& K = simd::kernels();
    const size_t n_qblocks = (nq + kQueryBlock - 1) / kQueryBlock;
    const size_t n_vblocks = std::max<size_t>(1, (n + kVectorBlock - 1) / kVectorBlock);
    // Few query blocks for the threads: also split the vectors, with one partial top-k per split, merged after.
    // At least 4 tasks per thread, so that tasks of unequal size even out (3 query blocks on 2 threads, one task
    // each, would leave one thread idle for a third of the time).
    size_t n_splits = 1;
    if (threads > 1 && static_cast<size_t>(4 * threads) > n_qblocks)
        n_splits = std::min(n_vblocks, (static_cast<size_t>(4 * threads) + n_qblocks - 1) / n_qblocks);
    const size_t blocks_per_split = (n_vblocks + n_splits - 1) / n_splits;
    // k beyond n only pads the output rows: the heaps never hold more than n
    std::vector<TopK> heaps(checked_mul(nq, n_splits, "queries"), TopK(std::min(k, n)));
    const long long n_tasks = static_cast<long long>(n_qblocks * n_splits);
    std::vector<Scratch> scratch(static_cast<size_t>(threads));  // one per thread, grown inside
    ParallelErrors errors;

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && n_tasks > 1)
    for (long long t = 0; t < n_tasks; ++t) {
        errors.run([&] {
            const size_t qb = static_cast<size_t>(t) / n_splits, sp = static_cast<size_t>(t) % n_splits;
            const size_t q0 = qb * kQueryBlock, q1 = std::min(nq, q0 + kQueryBlock);
            const size_t v0 = std::min(n, sp * blocks_per_split * kVectorBlock);
            const size_t v1 = std::min(n, v0 + blocks_per_split * kVectorBlock);
            if (v0 < v1)
                search_block(store, K, queries, q0, q1, v0, v1, &heaps[q0 * n_splits + sp], n_splits,
                             scratch[static_cast<size_t>(thread_index())]);
        });
    }
    errors.rethrow();
    for (size_t q = 0; q < nq; ++q) {
        TopK& out = heaps[q * n_splits];
        for (size_t sp = 1; sp < n_splits; ++sp) out.merge(heaps[q * n_splits + sp]);
        out.write(scores + q * k, ids + q * k, k);
    }
}

void score_rows(const VectorStore& store, const float* query, const int64_t* ids, size_t n, float* out) {
    const simd::Kernels& K = simd::kernels();
    for (size_t j = 0; j < n; ++j) {
        if (j + 1 < n) simd::prefetch(store.row_ptr(static_cast<size_t>(ids[j + 1])), store.bytes_per_vector());
        out[j] = store.dot(K, query, static_cast<size_t>(ids[j]));
    }
}

// ---------------------------------------------------------------------------------------------------------------
// FlatIndex

FlatIndex::FlatIndex(size_t dim, Storage storage) : store_(dim, storage) {
    if (dim < 1 || dim > static_cast<size_t>(kMaxDim))
        throw std::invalid_argument("dimension must be in [1, 2^20], got " + std::to_string(dim));
}

size_t FlatIndex::size() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return store_.size();
}

void FlatIndex::add(const float* x, size_t n) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    store_.append(x, n);
}

void FlatIndex::search(const float* q, size_t nq, size_t k, float* scores, int64_t* ids, int n_threads) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    exact_search(store_, q, nq, k, scores, ids, n_threads);
}

void FlatIndex::save(io::Writer& w) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    w.meta("dim", static_cast<int64_t>(store_.dim()));
    w.meta("count", static_cast<int64_t>(store_.size()));
    w.meta("storage", storage_name(store_.storage()));
    store_.save(w, "vectors");
}

std::unique_ptr<FlatIndex> FlatIndex::load(const io::Reader& r, bool mmap) {
    const size_t dim = static_cast<size_t>(r.meta_int("dim", 1, kMaxDim));
    const size_t count = static_cast<size_t>(r.meta_int("count", 0, kMaxRows));
    Storage storage;
    try {
        storage = parse_storage(r.meta("storage"));
    } catch (const std::invalid_argument& e) {
        r.fail(e.what());
    }
    auto index = std::make_unique<FlatIndex>(dim, storage);
    index->store_.load(r, "vectors", count, mmap);
    return index;
}

}  // namespace fastdpr

// Exact maximum-inner-product search, blocked over queries x vectors with a 4x4 SIMD micro-kernel, multi-threaded
// with OpenMP; vectors stored as fp32 or fp16. Also the vector store shared by the other index types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "io.h"
#include "simd.h"

namespace fastdpr {

enum class Storage : int { F32 = 0, F16 = 1 };
const char* storage_name(Storage s);
Storage parse_storage(const std::string& s);  // "fp32" | "fp16"

// Rows of `dim` numbers, owned or pointing into a memory-mapped index file (copied on the first append).
class VectorStore {
public:
    VectorStore(size_t dim = 0, Storage storage = Storage::F32) : dim_(dim), storage_(storage) {}

    size_t dim() const { return dim_; }
    size_t size() const { return n_; }
    Storage storage() const { return storage_; }
    size_t bytes_per_vector() const { return dim_ * (storage_ == Storage::F16 ? 2 : 4); }

    void append(const float* x, size_t n);  // converts to the storage type
    void reserve(size_t n);

    const float* f32() const { return mapped_ ? static_cast<const float*>(mapped_) : f32_.data(); }
    const uint16_t* f16() const { return mapped_ ? static_cast<const uint16_t*>(mapped_) : f16_.data(); }
    const void* row_ptr(size_t i) const {
        return storage_ == Storage::F16 ? static_cast<const void*>(f16() + i * dim_)
                                        : static_cast<const void*>(f32() + i * dim_);
    }
    float dot(const simd::Kernels& K, const float* q, size_t i) const {
        return storage_ == Storage::F16 ? K.dot_f16(q, f16() + i * dim_, dim_) : K.dot(q, f32() + i * dim_, dim_);
    }

    void save(io::Writer& w, const std::string& name) const;
    // `n` rows from section `name`; with `mmap` the rows stay in the file mapping (zero copy).
    void load(const io::Reader& r, const std::string& name, size_t n, bool mmap);

private:
    void unmap();
    size_t dim_ = 0, n_ = 0;
    Storage storage_ = Storage::F32;
    std::vector<float> f32_;
    std::vector<uint16_t> f16_;
    const void* mapped_ = nullptr;
    std::shared_ptr<io::Mapping> mapping_;
};

// Exact top-k of `nq` queries against rows [0, n) of `store`: scores/ids are nq x k, best first, padded with
// (-inf, -1) when n < k (the work and the heaps are sized by min(k, n)). `n_threads` 0 means OpenMP's default; a
// negative or absurd count is std::invalid_argument (parallel.h). The result does not depend on `n_threads`.
void exact_search(const VectorStore& store, const float* queries, size_t nq, size_t k, float* scores, int64_t* ids,
                  int n_threads = 0);

// Exact inner products of one query with a list of rows (re-ranking candidates): out[j] = <q, row ids[j]>.
void score_rows(const VectorStore& store, const float* query, const int64_t* ids, size_t n, float* out);

class FlatIndex {
public:
    FlatIndex(size_t dim, Storage storage);  // dim in [1, kMaxDim]

    size_t dim() const { return store_.dim(); }
    size_t size() const;
    Storage storage() const { return store_.storage(); }
    const VectorStore& store() const { return store_; }

    void add(const float* x, size_t n);
    void search(const float* q, size_t nq, size_t k, float* scores, int64_t* ids, int n_threads = 0) const;

    void save(io::Writer& w) const;
    static std::unique_ptr<FlatIndex> load(const io::Reader& r, bool mmap);

private:
    VectorStore store_;
    mutable std::shared_mutex mutex_;  // searches share it; add takes it alone
};

}  // namespace fastdpr

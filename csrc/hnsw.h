// HNSW graph for maximum inner product.
//
// Memory layout: one record per node holds what scoring and expanding it on level 0 reads, so that a neighbour's
// score and, later, its expansion touch one contiguous block (the separate link and vector arrays cost two cache
// misses per neighbour):
//   [half vector: d halves, padded to 4 bytes][w, e, scale][count][M0 links]
// padded to a multiple of 64 bytes. The graph walk (build and search) scores the half vectors: a search is bound by
// fetching neighbours' vectors, and halves are half the bytes. With fp16 storage they are the stored vectors; with fp32 storage they are the vectors
// divided by a power of two (`scale`, so any range fits), the fp32 vectors are kept apart, and the list a search
// found is re-ranked with them, so returned scores are exact. Upper levels are per node (few nodes have them).
// Visited marks are reset by bumping a tag; the first line of every fresh neighbour's record is requested at once,
// then each whole half vector one neighbour ahead of its scoring.
//
// Searches always rank by the exact inner product with the stored vectors; what varies is the similarity the graph
// is built with (`Graph`):
//   IP     native inner-product graph (ip-NSW): neighbours chosen and pruned by <a, b>;
//   Cosine graph built on directions <a, b>/(|a||b|), searched by inner product;
//   L2     the MIPS->L2 reduction (p' = [p, sqrt(phi - |p|^2)]): neighbours by <a, b> + e_a e_b, phi fixed by the
//          first add (or given) and larger vectors rejected afterwards.
// Searching an L2-reduced graph by inner product is exact with respect to the reduction: for q' = [q, 0],
// |q' - p'|^2 = |q|^2 + phi - 2 <q, p>, the same order.
//
// The file layout is the one of the separate arrays (sections "vectors", "links0", "upper"): files written before
// the record layout load unchanged, and a reader without the compiled core still finds the vectors. Loading builds
// the records; memory-mapped fp32 vectors stay in the mapping.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "flat.h"
#include "huge_alloc.h"
#include "io.h"

namespace fastdpr {

enum class Graph : int { IP = 0, Cosine = 1, L2 = 2 };
const char* graph_name(Graph g);
Graph parse_graph(const std::string& s);  // "ip" | "cos" | "l2"

struct HNSWParams {
    size_t M = 32;                // links per node on upper levels; 2M on level 0
    size_t ef_construction = 200;
    size_t ef_search = 128;       // default beam width
    size_t entry_points = 1;      // beam width on level 1, whose results all seed the level-0 search
    Graph graph = Graph::IP;
    Storage storage = Storage::F32;
    double phi = 0.0;             // L2 reduction: max squared norm; 0 = take it from the first add
    uint64_t seed = 12345;
    // Degree floor: after the neighbour heuristic, lists are topped up with the best pruned candidates to at least
    // this many links (-1: M). M keeps hub-heavy inner-product data searchable; 0 is the plain heuristic (sparser
    // graph, faster build and search where hubs are no problem).
    int64_t floor = -1;
    size_t degree_floor() const { return floor < 0 ? M : std::min(static_cast<size_t>(floor), M); }
};

class HNSWIndex {
public:
    HNSWIndex(size_t dim, const HNSWParams& params);

    size_t dim() const { return dim_; }
    size_t size() const;
    const HNSWParams& params() const { return params_; }
    double phi() const { return phi_; }
    int max_level() const { return max_level_; }

    // Inserts the rows in parallel (n_threads <= 0: OpenMP's default). Throws std::invalid_argument for the L2
    // reduction when a vector's squared norm exceeds phi.
    void add(const float* x, size_t n, int n_threads = 0);

    // ef = 0: params().ef_search. A beam narrower than k (ef < k) returns the best k of every node it scored.
    // entry_points = 0: params().entry_points.
    void search(const float* q, size_t nq, size_t k, size_t ef, float* scores, int64_t* ids, int n_threads = 0,
                size_t entry_points = 0) const;

    // Graph statistics for tests/benchmarks: mean level-0 degree, number of nodes reachable from the entry.
    double mean_degree() const;
    size_t reachable() const;

    void save(io::Writer& w) const;
    static std::unique_ptr<HNSWIndex> load(const io::Reader& r, bool mmap);

private:
    template <Graph G, Storage S>
    friend struct BuildOps;
    template <Storage S>
    friend struct SearchOps;

    size_t capacity(int level) const { return level == 0 ? M0_ : params_.M; }
    char* record(size_t i) { return records_.data() + i * stride_; }
    const char* record(size_t i) const { return records_.data() + i * stride_; }
    const void* vec(size_t i) const { return record(i); }
    // hints node i's half vector into cache (whole = false: only its first line)
    void prefetch(size_t i, bool whole) const { simd::prefetch(vec(i), whole ? vec_bytes_ : 1); }
    float* terms(size_t i) { return reinterpret_cast<float*>(record(i) + terms_off_); }  // {w, e, scale}
    const float* terms(size_t i) const { return reinterpret_cast<const float*>(record(i) + terms_off_); }
    uint32_t* links(uint32_t node, int level) {
        return level == 0 ? reinterpret_cast<uint32_t*>(record(node) + links_off_)
                          : &upper_[node][static_cast<size_t>(level - 1) * (params_.M + 1)];
    }
    const uint32_t* links(uint32_t node, int level) const {
        return level == 0 ? reinterpret_cast<const uint32_t*>(record(node) + links_off_)
                          : &upper_[node][static_cast<size_t>(level - 1) * (params_.M + 1)];
    }
    void row(size_t i, float* out) const;  // the stored vector as fp32
    void fill_half(size_t i, std::vector<float>& buf);
    void prepare_terms(size_t from);
    void resize(size_t n);  // records for n nodes (new ones zeroed), keeping the first n_
    int random_level();

    HNSWParams params_;
    size_t dim_;
    size_t M0_;
    double level_mult_;
    double phi_ = 0.0;
    size_t n_ = 0;
    size_t vec_bytes_ = 0;    // the vector's bytes in a record (padded to 4)
    size_t terms_off_ = 0;    // offset of {w, e, scale}: sim(a, b) = <a, b> w_a w_b + e_a e_b while building;
                              // the half vector times scale approximates the stored one
    size_t links_off_ = 0;    // offset of the level-0 count and links
    size_t stride_ = 0;       // bytes per record, a multiple of 64
    std::vector<char, HugePageAllocator<char>> records_;
    VectorStore exact_;
    simd::DotFn dot_ = nullptr;  // fp32 storage: the vectors results are ranked by (fp16 storage: the records' halves)
    std::vector<int8_t> levels_;
    std::vector<std::vector<uint32_t>> upper_;
    std::unique_ptr<std::mutex[]> node_locks_;
    size_t n_locks_ = 0;
    std::mutex entry_lock_;
    bool shared_build_ = false;  // add() runs inserts on several threads: node locks are taken
    int64_t entry_ = -1;
    int max_level_ = -1;
    uint64_t rng_state_;
    mutable std::shared_mutex mutex_;  // searches share it; add takes it alone
};

}  // namespace fastdpr

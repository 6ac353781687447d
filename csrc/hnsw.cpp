#include "hnsw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <stdexcept>

#include "bounds.h"
#include "parallel.h"
#include "topk.h"

namespace fastdpr {

const char* graph_name(Graph g) {
    switch (g) {
        case Graph::IP:
            return "ip";
        case Graph::Cosine:
            return "cos";
        case Graph::L2:
            return "l2";
    }
    return "?";
}

Graph parse_graph(const std::string& s) {
    if (s == "ip") return Graph::IP;
    if (s == "cos" || s == "cosine") return Graph::Cosine;
    if (s == "l2") return Graph::L2;
    throw std::invalid_argument("unknown graph similarity '" + s + "' (expected ip, cos or l2)");
}

namespace {

constexpr int kMaxLevel = 60;

// Visited marks for one thread: a node is visited when its tag equals the current one; a new search bumps the tag
// instead of clearing the array.
struct Visited {
    std::vector<uint16_t> tags;
    uint16_t cur = 0;
    void prepare(size_t n) {
        if (tags.size() < n) tags.resize(n + n / 8 + 1024, 0);
        if (++cur == 0) {
            std::fill(tags.begin(), tags.end(), 0);
            cur = 1;
        }
    }
    bool test_and_set(uint32_t i) {
        if (tags[i] == cur) return true;
        tags[i] = cur;
        return false;
    }
};

// A node's lock, taken only while several threads insert: add() holds the index's mutex exclusively, so a
// single-threaded build has no one to exclude, and locking every link list it reads would only cost it time.
class NodeGuard {
public:
    NodeGuard(std::mutex& mu, bool take) : mu_(take ? &mu : nullptr) {
        if (mu_) mu_->lock();
    }
    ~NodeGuard() {
        if (mu_) mu_->unlock();
    }
    NodeGuard(const NodeGuard&) = delete;
    NodeGuard& operator=(const NodeGuard&) = delete;

private:
    std::mutex* mu_;
};

using Cand = std::pair<float, uint32_t>;  // (similarity, node)
struct BestFirst {                        // heap top = highest similarity
    bool operator()(const Cand& a, const Cand& b) const { return a.first < b.first; }
};
struct WorstFirst {  // heap top = lowest similarity
    bool operator()(const Cand& a, const Cand& b) const { return a.first > b.first; }
};

// One thread's search state, kept between searches so that a search allocates nothing.
struct Scratch {
    Visited visited;
    std::vector<Cand> frontier, best;  // heaps: BestFirst / WorstFirst
    std::vector<Cand> results;         // WorstFirst heap of the best `keep` nodes scored, when keep > ef
    std::vector<uint32_t> fresh;
    std::vector<float> x;  // a query or a node's vector as fp32
};

Scratch& thread_scratch() {
    thread_local Scratch s;
    return s;
}

uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// <q, a record's half vector> through the active SIMD level. With fp32 storage the halves are the vector divided
// by the record's power-of-two scale, which the score multiplies back (`scaled`, fixed at compile time so that the
// hot loops carry no storage branch).
template <bool scaled>
struct Dot {
    float (*fn)(const float*, const uint16_t*, size_t);
    size_t d;
    Dot(const simd::Kernels& K, size_t dim) : fn(K.dot_f16), d(dim) {}
    float operator()(const float* q, const char* rec, const float* terms) const {
        const float ip = fn(q, reinterpret_cast<const uint16_t*>(rec), d);
        if constexpr (scaled) return ip * terms[2];
        else return ip;
    }
};

// Beam search on one level from the seeds in s.best (any order, already marked visited), leaving up to `ef` nodes
// in s.best as a WorstFirst heap. `score(node)` scores a node; `read_links(node, out)` writes its list to `out`
// (under the node's lock while building) and returns the count; `prefetch(node, whole)` hints its record's vector
// (whole = false: only its first line).
// With keep > ef, s.results also collects the best `keep` of every node scored (seeds included): s.best holds the
// best ef of them anyway, so only a beam narrower than the result list needs the second heap.
template <class Score, class ReadLinks, class Prefetch>
void beam_search(Scratch& s, size_t ef, Score&& score, ReadLinks&& read_links, Prefetch&& prefetch,
                 size_t keep = 0) {
    auto& results = s.results;
    const bool collect = keep > ef;
    if (collect) {
        results.assign(s.best.begin(), s.best.end());
        std::make_heap(results.begin(), results.end(), WorstFirst());
        while (results.size() > keep) {
            std::pop_heap(results.begin(), results.end(), WorstFirst());
            results.pop_back();
        }
    }
    auto& frontier = s.frontier;
    auto& best = s.best;
    frontier.assign(best.begin(), best.end());
    std::make_heap(frontier.begin(), frontier.end(), BestFirst());
    std::make_heap(best.begin(), best.end(), WorstFirst());
    while (best.size() > ef) {
        std::pop_heap(best.begin(), best.end(), WorstFirst());
        best.pop_back();
    }
    uint32_t* buf = s.fresh.data();
    while (!frontier.empty()) {
        const Cand c = frontier.front();
        if (best.size() >= ef && c.first < best.front().first) break;
        std::pop_heap(frontier.begin(), frontier.end(), BestFirst());
        frontier.pop_back();
        // Keep only the unvisited neighbours first, so that the prefetches go to records that are scored next
        // (late in a search most neighbours were seen already). Then every fresh record's first line is requested
        // at once, so their latencies overlap, and each whole vector one record ahead. Whole vectors two ahead
        // (24 lines of a 384-d half vector) filled the core's line-fill buffers and stalled on the prefetches
        // themselves.
        const size_t cnt = read_links(c.second, buf);
        size_t fresh = 0;
        for (size_t j = 0; j < cnt; ++j)
            if (!s.visited.test_and_set(buf[j])) buf[fresh++] = buf[j];
        for (size_t j = 1; j < fresh; ++j) prefetch(buf[j], false);
        if (fresh) prefetch(buf[0], true);
        for (size_t j = 0; j < fresh; ++j) {
            const uint32_t nb = buf[j];
            if (j + 1 < fresh) prefetch(buf[j + 1], true);
            const float sim = score(nb);
            if (collect && (results.size() < keep || sim > results.front().first)) {
                results.emplace_back(sim, nb);
                std::push_heap(results.begin(), results.end(), WorstFirst());
                if (results.size() > keep) {
                    std::pop_heap(results.begin(), results.end(), WorstFirst());
                    results.pop_back();
                }
            }
            if (best.size() < ef || sim > best.front().first) {
                frontier.emplace_back(sim, nb);
                std::push_heap(frontier.begin(), frontier.end(), BestFirst());
                best.emplace_back(sim, nb);
                std::push_heap(best.begin(), best.end(), WorstFirst());
                if (best.size() > ef) {
                    std::pop_heap(best.begin(), best.end(), WorstFirst());
                    best.pop_back();
                }
            }
        }
    }
}

// s.best as a list, best first.
void sorted_best(Scratch& s, std::vector<Cand>& out) {
    out.assign(s.best.begin(), s.best.end());
    std::sort(out.begin(), out.end(), [](const Cand& x, const Cand& y) { return x.first > y.first; });
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

HNSWIndex::HNSWIndex(size_t dim, const HNSWParams& params)
    : params_(params), dim_(dim), exact_(dim, Storage::F32), rng_state_(params.seed) {
    // the same ranges the loader accepts, so that every index that can be built can be saved and loaded again
    if (dim < 1 || dim > static_cast<size_t>(kMaxDim))
        throw std::invalid_argument("dimension must be in [1, 2^20], got " + std::to_string(dim));
    if (params_.M < 2 || params_.M > 4096) throw std::invalid_argument("HNSW M must be in [2, 4096]");
    if (params_.ef_construction < 1 || params_.ef_construction > static_cast<size_t>(kMaxBeam))
        throw std::invalid_argument("HNSW ef_construction must be in [1, 2^30]");
    if (params_.ef_search < 1 || params_.ef_search > static_cast<size_t>(kMaxBeam))
        throw std::invalid_argument("HNSW ef_search must be in [1, 2^30]");
    if (params_.entry_points < 1 || params_.entry_points > static_cast<size_t>(kMaxEntryPoints))
        throw std::invalid_argument("HNSW entry_points must be in [1, 2^20]");
    if (params_.floor < -1 || params_.floor > static_cast<int64_t>(params_.M))
        throw std::invalid_argument("HNSW floor must be in [0, M] (or -1: M)");
    M0_ = 2 * params_.M;
    level_mult_ = 1.0 / std::log(static_cast<double>(params_.M));
    phi_ = params_.phi;
    vec_bytes_ = (dim_ * 2 + 3) / 4 * 4;
    terms_off_ = vec_bytes_;
    links_off_ = terms_off_ + 3 * sizeof(float);
    stride_ = (links_off_ + (M0_ + 1) * sizeof(uint32_t) + 63) / 64 * 64;
}

size_t HNSWIndex::size() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return n_;
}

int HNSWIndex::random_level() {
    const double u = (static_cast<double>(splitmix(rng_state_) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const int level = static_cast<int>(-std::log(u) * level_mult_);
    return std::min(level, kMaxLevel);
}

void HNSWIndex::resize(size_t n) {
    const size_t bytes = checked_mul(n, stride_, "HNSW records");
    if (bytes > records_.capacity()) records_.reserve(std::max(bytes, records_.capacity() + records_.capacity() / 2));
    records_.resize(bytes, 0);
    levels_.resize(n, 0);
    upper_.resize(n);
}

void HNSWIndex::row(size_t i, float* out) const {
    if (params_.storage == Storage::F16) simd::from_half(reinterpret_cast<const uint16_t*>(vec(i)), out, dim_);
    else std::memcpy(out, exact_.f32() + i * dim_, dim_ * sizeof(float));
}

// Record i's half vector from the stored one: a copy for fp16 storage, else the fp32 vector divided by a power of
// two that brings its largest component into [0.5, 1] (exact scaling, so the halves keep fp16's relative precision
// whatever the vector's range, and nothing overflows).
void HNSWIndex::fill_half(size_t i, std::vector<float>& buf) {
    const simd::Kernels& K = simd::kernels();
    uint16_t* half = reinterpret_cast<uint16_t*>(record(i));
    float* t = terms(i);
    if (params_.storage == Storage::F16) {
        t[2] = 1.0f;
        return;
    }
    const float* x = exact_.f32() + i * dim_;
    float peak = 0;
    for (size_t j = 0; j < dim_; ++j) peak = std::max(peak, std::fabs(x[j]));
    int e = 0;
    if (peak > 0) std::frexp(peak, &e);  // peak = m 2^e, m in [0.5, 1)
    const float scale = std::ldexp(1.0f, e), inv = std::ldexp(1.0f, -e);
    buf.resize(dim_);
    for (size_t j = 0; j < dim_; ++j) buf[j] = x[j] * inv;
    K.to_half(buf.data(), half, dim_);
    t[2] = scale;
}

void HNSWIndex::prepare_terms(size_t from) {
    std::vector<float> x(dim_);
    const simd::Kernels& K = simd::kernels();
    for (size_t i = from; i < n_; ++i) {
        row(i, x.data());
        const double sq = K.dot(x.data(), x.data(), dim_);
        float* t = terms(i);  // t[2], the half vector's scale, is fill_half's
        t[0] = 1.0f;
        t[1] = 0.0f;
        if (params_.graph == Graph::Cosine) {
            t[0] = sq > 0 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
        } else if (params_.graph == Graph::L2) {
            t[1] = static_cast<float>(std::sqrt(std::max(0.0, phi_ - sq)));  // clamp rounding at 0
        }
    }
}

// Inserting nodes, with the graph's build similarity and the storage type fixed at compile time.
template <Graph G, Storage S>
struct BuildOps {
    HNSWIndex& h;
    Dot<S == Storage::F32> dot;
    const simd::Kernels& K;

    BuildOps(HNSWIndex& index) : h(index), dot(simd::kernels(), index.dim_), K(simd::kernels()) {}

    // sim(a, b) for a given as fp32 `xa` with terms `ta`, b's side from its record
    float sim(const float* xa, const float* ta, uint32_t b) const {
        const float ip = dot(xa, h.record(b), h.terms(b));
        if constexpr (G == Graph::IP) {
            return ip;
        } else if constexpr (G == Graph::Cosine) {
            return ip * ta[0] * h.terms(b)[0];
        } else {
            return ip + ta[1] * h.terms(b)[1];
        }
    }

    // Node i's vector as fp32: the stored one for fp32 storage, else converted into `buf`.
    const float* as_f32(uint32_t i, std::vector<float>& buf) const {
        if constexpr (S == Storage::F32) {
            return h.exact_.f32() + static_cast<size_t>(i) * h.dim_;
        } else {
            buf.resize(h.dim_);
            h.row(i, buf.data());
            return buf.data();
        }
    }

    void prefetch(uint32_t i, bool whole = true) const { h.prefetch(i, whole); }

    // The HNSW neighbour heuristic with the build similarity: keep (at most m) candidates only when no already
    // kept neighbour is more similar to it than the base node is (diversifies directions), then top up with the
    // best of the rest to at least `floor` so that nodes keep their degree (important for inner product, where
    // high-norm nodes would otherwise prune everything). `cands` sorted best first.
    void select_neighbors(std::vector<Cand>& cands, size_t m, size_t floor, std::vector<Cand>& kept,
                          std::vector<Cand>& pruned, std::vector<float>& buf) const {
        if (cands.size() <= m) return;
        kept.clear();
        pruned.clear();
        // The kept nodes' half vectors, converted once into buf (slot j: kept[j]; the candidate under test in the
        // next slot): the pairwise similarities are then fp32 dot products in cache, where converting halves for
        // every pair would dominate a build.
        const size_t d = h.dim_;
        buf.resize((m + 1) * d);
        for (const Cand& c : cands) {
            if (kept.size() >= m) break;
            float* xc = &buf[kept.size() * d];
            K.from_half(reinterpret_cast<const uint16_t*>(h.record(c.second)), xc, d);
            const float* tc = h.terms(c.second);
            bool good = true;
            for (size_t j = 0; j < kept.size(); ++j) {
                const float* ts = h.terms(kept[j].second);
                float sc = K.dot(xc, &buf[j * d], d);
                if constexpr (S == Storage::F32) sc *= tc[2] * ts[2];
                if constexpr (G == Graph::Cosine) sc *= tc[0] * ts[0];
                if constexpr (G == Graph::L2) sc += tc[1] * ts[1];
                if (sc > c.first) {
                    good = false;
                    break;
                }
            }
            (good ? kept : pruned).push_back(c);
        }
        for (size_t i = 0; kept.size() < floor && i < pruned.size(); ++i) kept.push_back(pruned[i]);
        cands.swap(kept);
    }

    void connect(uint32_t node, int level, const std::vector<Cand>& nbrs) {
        const size_t cap = h.capacity(level);
        {
            NodeGuard g(h.node_locks_[node], h.shared_build_);
            uint32_t* l = h.links(node, level);
            l[0] = static_cast<uint32_t>(std::min(nbrs.size(), cap));
            for (size_t j = 0; j < l[0]; ++j) l[1 + j] = nbrs[j].second;
        }
        std::vector<float> xbuf, sbuf;
        std::vector<Cand> cands, kept, pruned;
        for (const Cand& nb : nbrs) {
            const uint32_t other = nb.second;
            NodeGuard g(h.node_locks_[other], h.shared_build_);
            uint32_t* l = h.links(other, level);
            const size_t cnt = l[0];
            bool present = false;
            for (size_t j = 0; j < cnt; ++j) present |= l[1 + j] == node;
            if (present) continue;
            if (cnt < cap) {
                l[1 + cnt] = node;
                l[0] = static_cast<uint32_t>(cnt + 1);
                continue;
            }
            // Full: re-select among the old links and the new node, by similarity to `other`, down to M (the
            // degree a node starts with), not to the 2M capacity, which leaves room: a list cut back to near its
            // capacity is full again at once and re-runs this quadratic selection for every later link. On
            // topped-up inner-product lists the heuristic keeps most of 2M candidates, so a cut to capacity would
            // re-select on nearly every append, and the build would spend most of its time in their pairwise dot
            // products.
            const float* xo = as_f32(other, xbuf);
            const float* to = h.terms(other);
            cands.clear();
            cands.emplace_back(nb.first, node);
            for (size_t j = 0; j < cnt; ++j) {
                if (j + 1 < cnt) prefetch(l[2 + j]);
                cands.emplace_back(sim(xo, to, l[1 + j]), l[1 + j]);
            }
            std::sort(cands.begin(), cands.end(), [](const Cand& x, const Cand& y) { return x.first > y.first; });
            select_neighbors(cands, std::min(cap, h.params_.M), std::min(cap, h.params_.degree_floor()), kept,
                             pruned, sbuf);
            l[0] = static_cast<uint32_t>(cands.size());
            for (size_t j = 0; j < cands.size(); ++j) l[1 + j] = cands[j].second;
        }
    }

    void insert(uint32_t node) {
        Scratch& s = thread_scratch();
        const int level = h.levels_[node];
        std::vector<float> own;
        const float* x = as_f32(node, own);
        const float* tx = h.terms(node);
        std::unique_lock<std::mutex> entry_guard(h.entry_lock_);
        const int top = h.max_level_;
        const int64_t entry = h.entry_;
        if (entry < 0) {  // first node
            h.entry_ = node;
            h.max_level_ = level;
            return;
        }
        if (level <= top) entry_guard.unlock();  // a new top level keeps the lock until the entry point moves

        uint32_t cur = static_cast<uint32_t>(entry);
        float cur_sim = sim(x, tx, cur);
        for (int l = top; l > level; --l) {
            bool changed = true;
            while (changed) {
                changed = false;
                NodeGuard g(h.node_locks_[cur], h.shared_build_);
                const uint32_t* ls = h.links(cur, l);
                for (uint32_t j = 0; j < ls[0]; ++j) {
                    const float sc = sim(x, tx, ls[1 + j]);
                    if (sc > cur_sim) {
                        cur_sim = sc;
                        cur = ls[1 + j];
                        changed = true;
                    }
                }
            }
        }
        s.fresh.resize(h.M0_ + 1);
        s.visited.prepare(h.n_);
        s.visited.test_and_set(cur);
        s.best.assign(1, Cand(cur_sim, cur));
        std::vector<Cand> nbrs, kept, pruned;
        std::vector<float> buf;
        auto score = [&](uint32_t b) { return sim(x, tx, b); };
        auto pre = [&](uint32_t b, bool whole) { prefetch(b, whole); };
        for (int l = std::min(level, top); l >= 0; --l) {
            auto read_links = [&](uint32_t c, uint32_t* out) -> size_t {
                NodeGuard g(h.node_locks_[c], h.shared_build_);
                const uint32_t* ls = h.links(c, l);
                const size_t cnt = ls[0];
                std::memcpy(out, ls + 1, cnt * sizeof(uint32_t));
                return cnt;
            };
            beam_search(s, h.params_.ef_construction, score, read_links, pre);
            // the results seed the next level down; its beam marks visited nodes anew
            sorted_best(s, nbrs);
            s.visited.prepare(h.n_);
            for (const Cand& c : nbrs) s.visited.test_and_set(c.second);
            std::vector<Cand> chosen;
            chosen.reserve(nbrs.size());
            for (const Cand& c : nbrs)
                if (c.second != node) chosen.push_back(c);
            select_neighbors(chosen, h.params_.M, h.params_.degree_floor(), kept, pruned, buf);
            connect(node, l, chosen);
        }
        if (level > top) {
            h.entry_ = node;
            h.max_level_ = level;
        }
    }

    void insert_range(size_t start, size_t end, int threads) {
        if (h.entry_ < 0) insert(static_cast<uint32_t>(start++));
        ParallelErrors errors;
        h.shared_build_ = threads > 1 && end - std::min(start, end) > 1;
        const long long b = static_cast<long long>(start), e = static_cast<long long>(end);
#pragma omp parallel for schedule(dynamic, 64) num_threads(threads) if (h.shared_build_)
        for (long long i = b; i < e; ++i) errors.run([&] { insert(static_cast<uint32_t>(i)); });
        // A failed insert (out of memory) leaves nodes without links: they stay stored but unreachable, and the
        // graph that was there before is intact. Report it.
        errors.rethrow();
    }
};

void HNSWIndex::add(const float* x, size_t n, int n_threads) {
    const int threads = resolve_threads(n_threads);
    std::unique_lock<std::shared_mutex> lock(mutex_);
    if (n == 0) return;
    const size_t d = dim_;
    if (n_ + n > std::numeric_limits<uint32_t>::max() - 1) throw std::invalid_argument("HNSW holds at most 2^32 - 2 vectors");
    checked_mul(n, d, "vectors");
    const simd::Kernels& K = simd::kernels();
    if (params_.graph == Graph::L2) {
        double max_sq = 0;
        size_t arg = 0;
        for (size_t i = 0; i < n; ++i) {
            const double sq = K.dot(x + i * d, x + i * d, d);
            if (sq > max_sq) max_sq = sq, arg = i;
        }
        if (phi_ <= 0 && n_ == 0) phi_ = max_sq;
        if (max_sq > phi_ * (1.0 + 1e-6))
            throw std::invalid_argument("mips=l2: vector " + std::to_string(arg) + " of this add has squared norm " +
                                        std::to_string(max_sq) + " above phi = " + std::to_string(phi_) +
                                        ", fixed by the first add; rebuild the index with phi set high enough "
                                        "or use the native inner-product graph");
    }
    const size_t n0 = n_;
    if (params_.storage == Storage::F32) exact_.append(x, n);
    resize(n0 + n);
    std::vector<float> buf;
    for (size_t i = 0; i < n; ++i) {
        if (params_.storage == Storage::F16) K.to_half(x + i * d, reinterpret_cast<uint16_t*>(record(n0 + i)), d);
        fill_half(n0 + i, buf);
    }
    n_ = n0 + n;
    prepare_terms(n0);
    for (size_t i = n0; i < n0 + n; ++i) {
        levels_[i] = static_cast<int8_t>(random_level());
        if (levels_[i] > 0) upper_[i].assign(static_cast<size_t>(levels_[i]) * (params_.M + 1), 0);
    }
    if (n_locks_ < n0 + n) {  // nobody holds a node lock while add() owns the index
        n_locks_ = n0 + n + (n0 + n) / 2;
        node_locks_.reset(new std::mutex[n_locks_]);
    }
    const Storage st = params_.storage;
    const size_t end = n0 + n;
    switch (params_.graph) {
        case Graph::IP:
            if (st == Storage::F16) BuildOps<Graph::IP, Storage::F16>(*this).insert_range(n0, end, threads);
            else BuildOps<Graph::IP, Storage::F32>(*this).insert_range(n0, end, threads);
            break;
        case Graph::Cosine:
            if (st == Storage::F16) BuildOps<Graph::Cosine, Storage::F16>(*this).insert_range(n0, end, threads);
            else BuildOps<Graph::Cosine, Storage::F32>(*this).insert_range(n0, end, threads);
            break;
        case Graph::L2:
            if (st == Storage::F16) BuildOps<Graph::L2, Storage::F16>(*this).insert_range(n0, end, threads);
            else BuildOps<Graph::L2, Storage::F32>(*this).insert_range(n0, end, threads);
            break;
    }
}

// Searching by the exact inner product with the stored vectors, the storage type fixed at compile time.
template <Storage S>
struct SearchOps {
    const HNSWIndex& h;
    Dot<S == Storage::F32> dot;

    SearchOps(const HNSWIndex& index) : h(index), dot(simd::kernels(), index.dim_) {}

    float score(const float* q, uint32_t b) const { return dot(q, h.record(b), h.terms(b)); }

    void search_one(const float* q, size_t k, size_t ef, size_t entry_points, float* scores, int64_t* ids) const {
        Scratch& s = thread_scratch();
        uint32_t cur = static_cast<uint32_t>(h.entry_);
        float cur_sim = score(q, cur);
        for (int l = h.max_level_; l > 1; --l) {
            bool changed = true;
            while (changed) {
                changed = false;
                const uint32_t* ls = h.links(cur, l);
                for (uint32_t j = 0; j < ls[0]; ++j) {
                    const float sc = score(q, ls[1 + j]);
                    if (sc > cur_sim) {
                        cur_sim = sc;
                        cur = ls[1 + j];
                        changed = true;
                    }
                }
            }
        }
        s.fresh.resize(h.M0_ + 1);
        auto scorer = [&](uint32_t b) { return score(q, b); };
        auto pre = [&](uint32_t b, bool whole) { h.prefetch(b, whole); };
        s.visited.prepare(h.n_);
        s.visited.test_and_set(cur);
        s.best.assign(1, Cand(cur_sim, cur));
        if (h.max_level_ >= 1) {  // a small beam on level 1 gives several well-spread entry points into level 0
            auto read1 = [&](uint32_t c, uint32_t* out) -> size_t {
                const uint32_t* ls = h.links(c, 1);
                std::memcpy(out, ls + 1, ls[0] * sizeof(uint32_t));
                return ls[0];
            };
            beam_search(s, std::max<size_t>(1, entry_points), scorer, read1, pre);
            // the level-0 beam starts from these, with fresh visited marks
            s.visited.prepare(h.n_);
            for (const Cand& c : s.best) s.visited.test_and_set(c.second);
        }
        auto read0 = [&](uint32_t c, uint32_t* out) -> size_t {
            const uint32_t* ls = h.links(c, 0);
            std::memcpy(out, ls + 1, ls[0] * sizeof(uint32_t));
            return ls[0];
        };
        beam_search(s, ef, scorer, read0, pre, k);
        std::vector<Cand>& found = k > ef ? s.results : s.best;
        if constexpr (S == Storage::F32) {
            // The beam ranked by the half vectors; the list it found is ranked by the stored ones. The fp32 rows
            // are cold (one miss per line), so only the best k + k/8 by the half scores are read: halves misorder
            // only near-ties.
            const size_t reread = k + k / 8;
            if (found.size() > reread) {
                std::nth_element(found.begin(), found.begin() + static_cast<std::ptrdiff_t>(reread), found.end(),
                                 [](const Cand& x, const Cand& y) { return x.first > y.first; });
                found.resize(reread);
            }
            const simd::Kernels& K = simd::kernels();
            for (size_t j = 0; j < found.size(); ++j) {
                if (j + 1 < found.size())
                    simd::prefetch(h.exact_.f32() + static_cast<size_t>(found[j + 1].second) * h.dim_,
                                   h.dim_ * sizeof(float));
                found[j].first = K.dot(q, h.exact_.f32() + static_cast<size_t>(found[j].second) * h.dim_, h.dim_);
            }
        }
        TopK top(std::min(k, found.size()));
        for (const Cand& c : found) top.push(c.first, c.second);
        top.write(scores, ids, k);
    }
};

void HNSWIndex::search(const float* q, size_t nq, size_t k, size_t ef, float* scores, int64_t* ids, int n_threads,
                       size_t entry_points) const {
    const int threads = resolve_threads(n_threads);
    if (ef > static_cast<size_t>(kMaxBeam) || entry_points > static_cast<size_t>(kMaxEntryPoints))
        throw std::invalid_argument("HNSW search: ef must be <= 2^30 and entry_points <= 2^20");
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (k == 0 || nq == 0) return;
    const size_t d = dim_;
    if (entry_ < 0) {
        for (size_t i = 0; i < nq * k; ++i) scores[i] = -std::numeric_limits<float>::infinity(), ids[i] = -1;
        return;
    }
    // a beam wider than the graph finds nothing more: k beyond the size only pads the output
    const size_t n = n_;
    ef = std::min(ef ? ef : params_.ef_search, n);
    entry_points = std::min(entry_points ? entry_points : params_.entry_points, n);
    const long long total = static_cast<long long>(nq);
    ParallelErrors errors;
    auto run = [&](auto ops) {
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads) if (threads > 1 && nq > 1)
        for (long long i = 0; i < total; ++i)
            errors.run([&] {
                ops.search_one(q + static_cast<size_t>(i) * d, k, ef, entry_points,
                               scores + static_cast<size_t>(i) * k, ids + static_cast<size_t>(i) * k);
            });
    };
    if (params_.storage == Storage::F16) run(SearchOps<Storage::F16>(*this));
    else run(SearchOps<Storage::F32>(*this));
    errors.rethrow();
}

double HNSWIndex::mean_degree() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (n_ == 0) return 0;
    double total = 0;
    for (size_t i = 0; i < n_; ++i) total += links(static_cast<uint32_t>(i), 0)[0];
    return total / static_cast<double>(n_);
}

size_t HNSWIndex::reachable() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (entry_ < 0) return 0;
    std::vector<char> seen(n_, 0);
    std::vector<uint32_t> stack{static_cast<uint32_t>(entry_)};
    seen[static_cast<size_t>(entry_)] = 1;
    size_t count = 1;
    while (!stack.empty()) {
        const uint32_t c = stack.back();
        stack.pop_back();
        const uint32_t* ls = links(c, 0);
        for (uint32_t j = 0; j < ls[0]; ++j)
            if (!seen[ls[1 + j]]) seen[ls[1 + j]] = 1, ++count, stack.push_back(ls[1 + j]);
    }
    return count;
}

// ---------------------------------------------------------------------------------------------------------------
// save / load

void HNSWIndex::save(io::Writer& w) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    w.meta("dim", static_cast<int64_t>(dim_));
    w.meta("count", static_cast<int64_t>(n_));
    w.meta("storage", storage_name(params_.storage));
    w.meta("M", static_cast<int64_t>(params_.M));
    w.meta("ef_construction", static_cast<int64_t>(params_.ef_construction));
    w.meta("ef_search", static_cast<int64_t>(params_.ef_search));
    w.meta("entry_points", static_cast<int64_t>(params_.entry_points));
    w.meta("floor", params_.floor);
    w.meta("graph", graph_name(params_.graph));
    w.meta_float("phi", phi_);
    w.meta("seed", static_cast<int64_t>(params_.seed & 0x7fffffffffffffffull));
    w.meta("rng_state", std::to_string(rng_state_));
    w.meta("entry", entry_);
    w.meta("max_level", static_cast<int64_t>(max_level_));
    // the sections of the separate-array layout, gathered from the records
    if (params_.storage == Storage::F32) {
        exact_.save(w, "vectors");
    } else {
        const size_t row_bytes = dim_ * 2;
        std::vector<char> vectors(n_ * row_bytes);
        for (size_t i = 0; i < n_; ++i) std::memcpy(&vectors[i * row_bytes], vec(i), row_bytes);
        w.add_vector("vectors", vectors);
    }
    w.add_vector("levels", levels_);
    {
        const size_t stride0 = M0_ + 1;
        std::vector<uint32_t> links0(n_ * stride0);
        for (size_t i = 0; i < n_; ++i)
            std::memcpy(&links0[i * stride0], links(static_cast<uint32_t>(i), 0), stride0 * sizeof(uint32_t));
        w.add_vector("links0", links0);
    }
    std::vector<uint32_t> upper;
    for (const auto& u : upper_) upper.insert(upper.end(), u.begin(), u.end());
    w.add_vector("upper", upper);
}

// The records are built from the file's arrays; with `mmap`, fp32 vectors stay in the file mapping (the records
// hold their half copies).
std::unique_ptr<HNSWIndex> HNSWIndex::load(const io::Reader& r, bool mmap) {
    HNSWParams p;
    const size_t dim = static_cast<size_t>(r.meta_int("dim", 1, kMaxDim));
    const size_t n = static_cast<size_t>(r.meta_int("count", 0, std::numeric_limits<uint32_t>::max() - 1));
    p.M = static_cast<size_t>(r.meta_int("M", 2, 4096));
    p.ef_construction = static_cast<size_t>(r.meta_int("ef_construction", 1, kMaxBeam));
    p.ef_search = static_cast<size_t>(r.meta_int("ef_search", 1, kMaxBeam));
    p.entry_points = static_cast<size_t>(r.meta_int("entry_points", 1, kMaxEntryPoints));
    p.seed = static_cast<uint64_t>(r.meta_int("seed"));
    // files written before the floor was a setting were built with floor M
    p.floor = r.has_meta("floor") ? r.meta_int("floor", -1, static_cast<int64_t>(p.M)) : -1;
    try {
        p.storage = parse_storage(r.meta("storage"));
        p.graph = parse_graph(r.meta("graph"));
    } catch (const std::invalid_argument& e) {
        r.fail(e.what());
    }
    p.phi = r.meta_float("phi");
    if (!std::isfinite(p.phi) || p.phi < 0) r.fail("bad phi");
    auto index = std::make_unique<HNSWIndex>(dim, p);
    index->phi_ = p.phi;
    try {
        index->rng_state_ = std::stoull(r.meta("rng_state"));
    } catch (const std::logic_error&) {
        r.fail("bad rng_state");
    }
    const int64_t entry = r.meta_int("entry", -1, static_cast<int64_t>(n) - 1);
    const int max_level = static_cast<int>(r.meta_int("max_level", -1, kMaxLevel));
    if ((n == 0) != (entry < 0) || (entry < 0) != (max_level < 0)) r.fail("inconsistent entry point");
    const size_t row_bytes = dim * (p.storage == Storage::F16 ? 2 : 4);
    const size_t stride0 = index->M0_ + 1, stride = p.M + 1;
    if (n > std::numeric_limits<size_t>::max() / std::max(stride0 * sizeof(uint32_t), index->stride_))
        r.fail("count too large");
    const io::Section vs = r.section("vectors");
    if (vs.length / row_bytes != n || vs.length != n * row_bytes)
        r.fail("section 'vectors' does not hold " + std::to_string(n) + " vectors of dimension " +
               std::to_string(dim));
    if (p.storage == Storage::F16) r.check_finite_half("vectors", reinterpret_cast<const uint16_t*>(vs.data), n * dim);
    const int8_t* levels = r.array<int8_t>("levels", n);
    const uint32_t* links0 = r.array<uint32_t>("links0", n * stride0);
    size_t upper_total = 0;
    int seen_max = -1;
    for (size_t i = 0; i < n; ++i) {
        const int lv = levels[i];
        if (lv < 0 || lv > kMaxLevel) r.fail("node level out of range");
        seen_max = std::max(seen_max, lv);
        upper_total += static_cast<size_t>(lv) * stride;
    }
    if (seen_max != max_level || (entry >= 0 && levels[static_cast<size_t>(entry)] != max_level))
        r.fail("entry point is not on the top level");
    const uint32_t* up = r.array<uint32_t>("upper", upper_total);
    if (p.storage == Storage::F32) index->exact_.load(r, "vectors", n, mmap);
    index->resize(n);
    index->n_ = n;
    std::vector<float> buf;
    for (size_t i = 0; i < n; ++i) {
        index->levels_[i] = levels[i];
        if (p.storage == Storage::F16) std::memcpy(index->record(i), vs.data + i * row_bytes, row_bytes);
        index->fill_half(i, buf);
        std::memcpy(index->links(static_cast<uint32_t>(i), 0), links0 + i * stride0, stride0 * sizeof(uint32_t));
    }
    for (size_t i = 0, off = 0; i < n; ++i) {
        const size_t len = static_cast<size_t>(levels[i]) * stride;
        index->upper_[i].assign(up + off, up + off + len);
        off += len;
    }
    // every link must name an existing node and every count fit its list: a bad file must not steer reads
    auto check = [&](const uint32_t* ls, size_t cap, int level) {
        if (ls[0] > cap) r.fail("link count out of range");
        for (uint32_t j = 0; j < ls[0]; ++j)
            if (ls[1 + j] >= n || index->levels_[ls[1 + j]] < level) r.fail("link to a node that does not exist");
    };
    for (size_t i = 0; i < n; ++i) {
        check(index->links(static_cast<uint32_t>(i), 0), index->M0_, 0);
        for (int l = 1; l <= index->levels_[i]; ++l) check(&index->upper_[i][(l - 1) * stride], p.M, l);
    }
    index->entry_ = entry;
    index->max_level_ = max_level;
    index->prepare_terms(0);
    index->n_locks_ = n + n / 2 + 1;
    index->node_locks_.reset(new std::mutex[index->n_locks_]);
    return index;
}

}  // namespace fastdpr

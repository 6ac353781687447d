#include "hnsw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <queue>
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
// single-threaded build has no one to exclude, and locking every link list it reads cost ~5% of its time.
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

Visited& thread_visited() {
    thread_local Visited v;
    return v;
}

using Cand = std::pair<float, uint32_t>;  // (similarity, node)
struct BestFirst {                        // priority_queue top = highest similarity
    bool operator()(const Cand& a, const Cand& b) const { return a.first < b.first; }
};
struct WorstFirst {  // priority_queue top = lowest similarity
    bool operator()(const Cand& a, const Cand& b) const { return a.first > b.first; }
};

uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Beam search on one level from `seeds`, returning up to `ef` nodes, best first. `sim(node)` scores a node;
// `read_links(node, buf)` copies its list (under the node's lock while building) and returns the count.
template <class Sim, class ReadLinks>
std::vector<Cand> beam_search(const std::vector<Cand>& seeds, size_t ef, size_t n, Sim&& sim, ReadLinks&& read_links,
                              std::vector<uint32_t>& buf) {
    Visited& visited = thread_visited();
    visited.prepare(n);
    std::priority_queue<Cand, std::vector<Cand>, BestFirst> frontier;
    std::priority_queue<Cand, std::vector<Cand>, WorstFirst> best;
    for (const Cand& s : seeds) {
        if (visited.test_and_set(s.second)) continue;
        frontier.push(s);
        best.push(s);
        if (best.size() > ef) best.pop();
    }
    while (!frontier.empty()) {
        const Cand c = frontier.top();
        if (best.size() >= ef && c.first < best.top().first) break;
        frontier.pop();
        // Keep only the unvisited neighbours first, so that the vector prefetch one step ahead goes to a row that
        // is scored next (late in a search most neighbours were seen already).
        const size_t cnt = read_links(c.second, buf);
        size_t fresh = 0;
        for (size_t j = 0; j < cnt; ++j)
            if (!visited.test_and_set(buf[j])) buf[fresh++] = buf[j];
        for (size_t j = 0; j < fresh; ++j) {
            const uint32_t nb = buf[j];
            const float s = sim(nb, j + 1 < fresh ? static_cast<int64_t>(buf[j + 1]) : -1);
            if (best.size() < ef || s > best.top().first) {
                frontier.emplace(s, nb);
                best.emplace(s, nb);
                if (best.size() > ef) best.pop();
            }
        }
    }
    std::vector<Cand> out(best.size());
    for (size_t i = out.size(); i-- > 0;) {
        out[i] = best.top();
        best.pop();
    }
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

HNSWIndex::HNSWIndex(size_t dim, const HNSWParams& params)
    : params_(params), store_(dim, params.storage), rng_state_(params.seed) {
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
    M0_ = 2 * params_.M;
    level_mult_ = 1.0 / std::log(static_cast<double>(params_.M));
    phi_ = params_.phi;
}

size_t HNSWIndex::size() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return store_.size();
}

int HNSWIndex::random_level() {
    const double u = (static_cast<double>(splitmix(rng_state_) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const int level = static_cast<int>(-std::log(u) * level_mult_);
    return std::min(level, kMaxLevel);
}

void HNSWIndex::prepare_weights(size_t from) {
    const size_t n = store_.size(), d = store_.dim();
    weight_.resize(n, 1.0f);
    extra_.resize(n, 0.0f);
    std::vector<float> row(d);
    const simd::Kernels& K = simd::kernels();
    for (size_t i = from; i < n; ++i) {
        store_.row(i, row.data());
        const double sq = K.dot(row.data(), row.data(), d);
        if (params_.graph == Graph::Cosine) {
            weight_[i] = sq > 0 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
        } else if (params_.graph == Graph::L2) {
            extra_[i] = static_cast<float>(std::sqrt(std::max(0.0, phi_ - sq)));  // clamp rounding at 0
        }
    }
}

float HNSWIndex::build_sim(const float* xa, uint32_t a, uint32_t b) const {
    const float ip = store_.dot(simd::kernels(), xa, b);
    return ip * weight_[a] * weight_[b] + extra_[a] * extra_[b];
}

// The HNSW neighbour heuristic with the build similarity: keep (at most m) candidates only when no already kept
// neighbour is more similar to it than the base node is (diversifies directions), then top up with the best of the
// rest to at least `floor` so that nodes keep their degree (important for inner product, where high-norm nodes would
// otherwise prune everything).
void HNSWIndex::select_neighbors(const float* xbase, uint32_t base, std::vector<Cand>& cands, size_t m,
                                 size_t floor) const {
    if (cands.size() <= m) return;
    std::sort(cands.begin(), cands.end(), [](const Cand& x, const Cand& y) { return x.first > y.first; });
    std::vector<Cand> kept, pruned;
    kept.reserve(m);
    std::vector<float> xc(store_.dim());
    for (const Cand& c : cands) {
        if (kept.size() >= m) break;
        const float* xcp = store_.row_f32(c.second, xc.data());
        bool good = true;
        for (const Cand& s : kept) {
            if (build_sim(xcp, c.second, s.second) > c.first) {
                good = false;
                break;
            }
        }
        (good ? kept : pruned).push_back(c);
    }
    for (size_t i = 0; kept.size() < floor && i < pruned.size(); ++i) kept.push_back(pruned[i]);
    cands.swap(kept);
}

void HNSWIndex::connect(uint32_t node, const float* xnode, int level, const std::vector<Cand>& nbrs) {
    const size_t cap = capacity(level);
    {
        NodeGuard g(node_locks_[node], shared_build_);
        uint32_t* l = links(node, level);
        l[0] = static_cast<uint32_t>(std::min(nbrs.size(), cap));
        for (size_t j = 0; j < l[0]; ++j) l[1 + j] = nbrs[j].second;
    }
    std::vector<float> xn(store_.dim());
    std::vector<Cand> cands;
    for (const Cand& nb : nbrs) {
        const uint32_t other = nb.second;
        NodeGuard g(node_locks_[other], shared_build_);
        uint32_t* l = links(other, level);
        const size_t cnt = l[0];
        bool present = false;
        for (size_t j = 0; j < cnt; ++j) present |= l[1 + j] == node;
        if (present) continue;
        if (cnt < cap) {
            l[1 + cnt] = node;
            l[0] = static_cast<uint32_t>(cnt + 1);
            continue;
        }
        // Full: re-select among the old links and the new node, by similarity to `other`. Topping up only to M
        // (the degree a node starts with), not to the 2M capacity, leaves room: a list topped up to capacity would
        // be full again at once and re-run this quadratic selection for every later link (most of the build time).
        const float* xo = store_.row_f32(other, xn.data());
        cands.clear();
        cands.emplace_back(nb.first, node);
        for (size_t j = 0; j < cnt; ++j) cands.emplace_back(build_sim(xo, other, l[1 + j]), l[1 + j]);
        select_neighbors(xo, other, cands, cap, std::min(cap, params_.M));
        l[0] = static_cast<uint32_t>(cands.size());
        for (size_t j = 0; j < cands.size(); ++j) l[1 + j] = cands[j].second;
    }
}

void HNSWIndex::insert(uint32_t node) {
    const size_t n = store_.size();
    const int level = levels_[node];
    std::vector<float> x(store_.dim());
    store_.row(node, x.data());
    std::unique_lock<std::mutex> entry_guard(entry_lock_);
    const int top = max_level_;
    const int64_t entry = entry_;
    if (entry < 0) {  // first node
        entry_ = node;
        max_level_ = level;
        return;
    }
    if (level <= top) entry_guard.unlock();  // a new top level keeps the lock until the entry point moves

    auto sim = [&](uint32_t b, int64_t next) {
        if (next >= 0) simd::prefetch(store_.row_ptr(static_cast<size_t>(next)), store_.bytes_per_vector());
        return build_sim(x.data(), node, b);
    };
    std::vector<uint32_t> buf(M0_ + 1);
    uint32_t cur = static_cast<uint32_t>(entry);
    float cur_sim = build_sim(x.data(), node, cur);
    for (int l = top; l > level; --l) {
        bool changed = true;
        while (changed) {
            changed = false;
            NodeGuard g(node_locks_[cur], shared_build_);
            const uint32_t* ls = links(cur, l);
            for (uint32_t j = 0; j < ls[0]; ++j) {
                const float s = build_sim(x.data(), node, ls[1 + j]);
                if (s > cur_sim) {
                    cur_sim = s;
                    cur = ls[1 + j];
                    changed = true;
                }
            }
        }
    }
    std::vector<Cand> seeds{{cur_sim, cur}};
    for (int l = std::min(level, top); l >= 0; --l) {
        auto read_links = [&](uint32_t c, std::vector<uint32_t>& out) -> size_t {
            NodeGuard g(node_locks_[c], shared_build_);
            const uint32_t* ls = links(c, l);
            const size_t cnt = ls[0];
            std::memcpy(out.data(), ls + 1, cnt * sizeof(uint32_t));
            return cnt;
        };
        std::vector<Cand> found = beam_search(seeds, params_.ef_construction, n, sim, read_links, buf);
        seeds = found;
        std::vector<Cand> nbrs;
        for (const Cand& c : found)
            if (c.second != node) nbrs.push_back(c);
        select_neighbors(x.data(), node, nbrs, params_.M, params_.M);
        connect(node, x.data(), l, nbrs);
    }
    if (level > top) {
        entry_ = node;
        max_level_ = level;
    }
}

void HNSWIndex::add(const float* x, size_t n, int n_threads) {
    const int threads = resolve_threads(n_threads);
    std::unique_lock<std::shared_mutex> lock(mutex_);
    if (n == 0) return;
    const size_t d = store_.dim();
    if (store_.size() + n > std::numeric_limits<uint32_t>::max() - 1)
        throw std::invalid_argument("HNSW holds at most 2^32 - 2 vectors");
    if (params_.graph == Graph::L2) {
        double max_sq = 0;
        size_t arg = 0;
        const simd::Kernels& K = simd::kernels();
        for (size_t i = 0; i < n; ++i) {
            const double sq = K.dot(x + i * d, x + i * d, d);
            if (sq > max_sq) max_sq = sq, arg = i;
        }
        if (phi_ <= 0 && store_.size() == 0) phi_ = max_sq;
        if (max_sq > phi_ * (1.0 + 1e-6))
            throw std::invalid_argument("mips=l2: vector " + std::to_string(arg) + " of this add has squared norm " +
                                        std::to_string(max_sq) + " above phi = " + std::to_string(phi_) +
                                        ", fixed by the first add; rebuild the index with phi set high enough "
                                        "or use the native inner-product graph");
    }
    const size_t n0 = store_.size();
    store_.append(x, n);
    prepare_weights(n0);
    levels_.resize(n0 + n);
    upper_.resize(n0 + n);
    links0_.resize((n0 + n) * (M0_ + 1), 0);
    for (size_t i = n0; i < n0 + n; ++i) {
        levels_[i] = static_cast<int8_t>(random_level());
        if (levels_[i] > 0) upper_[i].assign(static_cast<size_t>(levels_[i]) * (params_.M + 1), 0);
    }
    if (n_locks_ < n0 + n) {  // nobody holds a node lock while add() owns the index
        n_locks_ = n0 + n + (n0 + n) / 2;
        node_locks_.reset(new std::mutex[n_locks_]);
    }
    size_t start = n0;
    if (entry_ < 0) insert(static_cast<uint32_t>(start++));
    const long long end = static_cast<long long>(n0 + n);
    ParallelErrors errors;
    shared_build_ = threads > 1 && end - static_cast<long long>(start) > 1;
#pragma omp parallel for schedule(dynamic, 64) num_threads(threads) if (shared_build_)
    for (long long i = static_cast<long long>(start); i < end; ++i)
        errors.run([&] { insert(static_cast<uint32_t>(i)); });
    // A failed insert (out of memory) leaves nodes without links: they stay stored but unreachable, and the graph
    // that was there before is intact. Report it.
    errors.rethrow();
}

void HNSWIndex::search_one(const float* q, size_t k, size_t ef, size_t entry_points, float* scores,
                           int64_t* ids) const {
    const simd::Kernels& K = simd::kernels();
    const size_t n = store_.size();
    auto sim = [&](uint32_t b, int64_t next) {
        if (next >= 0) simd::prefetch(store_.row_ptr(static_cast<size_t>(next)), store_.bytes_per_vector());
        return store_.dot(K, q, b);
    };
    uint32_t cur = static_cast<uint32_t>(entry_);
    float cur_sim = store_.dot(K, q, cur);
    for (int l = max_level_; l > 1; --l) {
        bool changed = true;
        while (changed) {
            changed = false;
            const uint32_t* ls = links(cur, l);
            for (uint32_t j = 0; j < ls[0]; ++j) {
                const float s = store_.dot(K, q, ls[1 + j]);
                if (s > cur_sim) {
                    cur_sim = s;
                    cur = ls[1 + j];
                    changed = true;
                }
            }
        }
    }
    std::vector<uint32_t> buf(M0_ + 1);
    std::vector<Cand> seeds{{cur_sim, cur}};
    if (max_level_ >= 1) {  // a small beam on level 1 gives several well-spread entry points into level 0
        auto read1 = [&](uint32_t c, std::vector<uint32_t>& out) -> size_t {
            const uint32_t* ls = links(c, 1);
            std::memcpy(out.data(), ls + 1, ls[0] * sizeof(uint32_t));
            return ls[0];
        };
        seeds = beam_search(seeds, std::max<size_t>(1, entry_points), n, sim, read1, buf);
    }
    auto read0 = [&](uint32_t c, std::vector<uint32_t>& out) -> size_t {
        const uint32_t* ls = links(c, 0);
        std::memcpy(out.data(), ls + 1, ls[0] * sizeof(uint32_t));
        return ls[0];
    };
    std::vector<Cand> found = beam_search(seeds, ef, n, sim, read0, buf);
    TopK top(std::min(k, found.size()));
    for (const Cand& c : found) top.push(c.first, c.second);
    top.write(scores, ids, k);
}

void HNSWIndex::search(const float* q, size_t nq, size_t k, size_t ef, float* scores, int64_t* ids, int n_threads,
                       size_t entry_points) const {
    const int threads = resolve_threads(n_threads);
    if (ef > static_cast<size_t>(kMaxBeam) || entry_points > static_cast<size_t>(kMaxEntryPoints))
        throw std::invalid_argument("HNSW search: ef must be <= 2^30 and entry_points <= 2^20");
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (k == 0 || nq == 0) return;
    const size_t d = store_.dim();
    if (entry_ < 0) {
        for (size_t i = 0; i < nq * k; ++i) scores[i] = -std::numeric_limits<float>::infinity(), ids[i] = -1;
        return;
    }
    // a beam wider than the graph finds nothing more: k beyond the size only pads the output
    const size_t n = store_.size();
    ef = std::min(std::max(ef ? ef : params_.ef_search, std::min(k, n)), n);
    entry_points = std::min(entry_points ? entry_points : params_.entry_points, n);
    const long long total = static_cast<long long>(nq);
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads) if (threads > 1 && nq > 1)
    for (long long i = 0; i < total; ++i)
        errors.run([&] {
            search_one(q + static_cast<size_t>(i) * d, k, ef, entry_points, scores + static_cast<size_t>(i) * k,
                       ids + static_cast<size_t>(i) * k);
        });
    errors.rethrow();
}

double HNSWIndex::mean_degree() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    const size_t n = store_.size();
    if (n == 0) return 0;
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += links(static_cast<uint32_t>(i), 0)[0];
    return total / static_cast<double>(n);
}

size_t HNSWIndex::reachable() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    const size_t n = store_.size();
    if (entry_ < 0) return 0;
    std::vector<char> seen(n, 0);
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
    w.meta("dim", static_cast<int64_t>(store_.dim()));
    w.meta("count", static_cast<int64_t>(store_.size()));
    w.meta("storage", storage_name(store_.storage()));
    w.meta("M", static_cast<int64_t>(params_.M));
    w.meta("ef_construction", static_cast<int64_t>(params_.ef_construction));
    w.meta("ef_search", static_cast<int64_t>(params_.ef_search));
    w.meta("entry_points", static_cast<int64_t>(params_.entry_points));
    w.meta("graph", graph_name(params_.graph));
    w.meta_float("phi", phi_);
    w.meta("seed", static_cast<int64_t>(params_.seed & 0x7fffffffffffffffull));
    w.meta("rng_state", std::to_string(rng_state_));
    w.meta("entry", entry_);
    w.meta("max_level", static_cast<int64_t>(max_level_));
    store_.save(w, "vectors");
    w.add_vector("levels", levels_);
    w.add_vector("links0", links0_);
    std::vector<uint32_t> upper;
    for (const auto& u : upper_) upper.insert(upper.end(), u.begin(), u.end());
    w.add_vector("upper", upper);
}

std::unique_ptr<HNSWIndex> HNSWIndex::load(const io::Reader& r, bool mmap) {
    HNSWParams p;
    const size_t dim = static_cast<size_t>(r.meta_int("dim", 1, kMaxDim));
    const size_t n = static_cast<size_t>(r.meta_int("count", 0, std::numeric_limits<uint32_t>::max() - 1));
    p.M = static_cast<size_t>(r.meta_int("M", 2, 4096));
    p.ef_construction = static_cast<size_t>(r.meta_int("ef_construction", 1, kMaxBeam));
    p.ef_search = static_cast<size_t>(r.meta_int("ef_search", 1, kMaxBeam));
    p.entry_points = static_cast<size_t>(r.meta_int("entry_points", 1, kMaxEntryPoints));
    p.seed = static_cast<uint64_t>(r.meta_int("seed"));
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
    index->store_.load(r, "vectors", n, mmap);
    index->levels_ = r.copy<int8_t>("levels", n);
    const size_t stride0 = index->M0_ + 1, stride = p.M + 1;
    if (n > std::numeric_limits<size_t>::max() / stride0) r.fail("count too large");
    index->links0_ = r.copy<uint32_t>("links0", n * stride0);
    size_t upper_total = 0;
    int seen_max = -1;
    for (size_t i = 0; i < n; ++i) {
        const int lv = index->levels_[i];
        if (lv < 0 || lv > kMaxLevel) r.fail("node level out of range");
        seen_max = std::max(seen_max, lv);
        upper_total += static_cast<size_t>(lv) * stride;
    }
    if (seen_max != max_level || (entry >= 0 && index->levels_[static_cast<size_t>(entry)] != max_level))
        r.fail("entry point is not on the top level");
    const uint32_t* up = r.array<uint32_t>("upper", upper_total);
    index->upper_.resize(n);
    for (size_t i = 0, off = 0; i < n; ++i) {
        const size_t len = static_cast<size_t>(index->levels_[i]) * stride;
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
        check(&index->links0_[i * stride0], index->M0_, 0);
        for (int l = 1; l <= index->levels_[i]; ++l) check(&index->upper_[i][(l - 1) * stride], p.M, l);
    }
    index->entry_ = entry;
    index->max_level_ = max_level;
    index->prepare_weights(0);
    index->n_locks_ = n + n / 2 + 1;
    index->node_locks_.reset(new std::mutex[index->n_locks_]);
    return index;
}

}  // namespace fastdpr

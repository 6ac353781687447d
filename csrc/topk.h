// Bounded top-k for maximum inner product: a min-heap of (score, id) whose root is the weakest kept result, so a
// candidate is tested against one number (`threshold()`) before any heap work.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace fastdpr {

struct Scored {
    float score;
    int64_t id;
};

// Ties on score are broken by the smaller id, so results are deterministic whatever the visiting order
// (blocked, multi-threaded and serial searches return identical lists).
inline bool better(const Scored& a, const Scored& b) {
    return a.score > b.score || (a.score == b.score && a.id < b.id);
}
// The same order as a type: the standard algorithms inline a function object's call, where a function pointer
// stays an indirect call per comparison.
struct Better {
    bool operator()(const Scored& a, const Scored& b) const { return better(a, b); }
};
// `better` made a total order by ranking NaN last (NaNs among themselves by id): std::sort needs one, since a NaN
// that compares neither way with anything can send it past the ends of the range.
struct BetterTotal {
    bool operator()(const Scored& a, const Scored& b) const {
        const bool an = a.score != a.score, bn = b.score != b.score;
        if (an || bn) return an == bn ? a.id < b.id : bn;
        return better(a, b);
    }
};

// Heaps of results under `better`, in the standard order: no parent is better than its children, so the root is
// the weakest result kept. heap_push adds s to the heap h[0, n) of at most k (n grows until it is k; then s replaces
// the root if it is better).
//
// heap_replace_root puts s (better than the root) in the root's place and sifts it down: one pass from the root,
// where pop_heap + push_heap walk down to a leaf and back up.
inline void heap_replace_root(Scored* h, size_t n, const Scored& s) {
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && better(h[c], h[c + 1])) ++c;  // the weaker child
        if (!better(s, h[c])) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = s;
}

inline void heap_push(Scored* h, size_t& n, size_t k, const Scored& s) {
    if (n < k) {
        h[n++] = s;
        std::push_heap(h, h + n, Better{});
    } else if (k > 0 && better(s, h[0])) {
        heap_replace_root(h, n, s);
    }
}

class TopK {
public:
    explicit TopK(size_t k = 0) : k_(k) { heap_.reserve(std::min(k, kReserveMax)); }

    void reset(size_t k) {
        k_ = k;
        heap_.clear();
        heap_.reserve(std::min(k, kReserveMax));
    }

    size_t k() const { return k_; }
    size_t size() const { return heap_.size(); }
    bool full() const { return heap_.size() >= k_; }

    // Score a candidate must beat to enter (-inf until full).
    float threshold() const {
        return full() && k_ > 0 ? heap_.front().score : -std::numeric_limits<float>::infinity();
    }

    void push(float score, int64_t id) {
        if (k_ == 0) return;
        const Scored s{score, id};
        if (heap_.size() < k_) {
            heap_.push_back(s);
            std::push_heap(heap_.begin(), heap_.end(), Better{});
        } else if (better(s, heap_.front())) {
            replace_root(s);
        }
    }

    // Push a contiguous run of scores whose ids are id0, id0+1, ...
    void push_run(const float* scores, size_t n, int64_t id0) {
        float thr = threshold();
        for (size_t j = 0; j < n; ++j) {
            if (scores[j] >= thr) {
                push(scores[j], id0 + static_cast<int64_t>(j));
                thr = threshold();
            }
        }
    }

    void merge(const TopK& other) {
        for (const Scored& s : other.heap_) push(s.score, s.id);
    }

    // Best first. Leaves the heap empty.
    std::vector<Scored> take_sorted() {
        std::sort(heap_.begin(), heap_.end(), BetterTotal{});  // faster than sort_heap; the same order
        std::vector<Scored> out;
        out.swap(heap_);
        return out;
    }

    // Best first into rows of length `width` (>= size()): missing entries get id -1 and score -inf.
    void write(float* scores, int64_t* ids, size_t width) {
        std::vector<Scored> sorted = take_sorted();
        size_t i = 0;
        for (; i < sorted.size(); ++i) {
            scores[i] = sorted[i].score;
            ids[i] = sorted[i].id;
        }
        for (; i < width; ++i) {
            scores[i] = -std::numeric_limits<float>::infinity();
            ids[i] = -1;
        }
    }

private:
    void replace_root(const Scored& s) { heap_replace_root(heap_.data(), heap_.size(), s); }

    // a heap reserves room for at most this many up front and grows with what it is actually given, so a large k
    // costs memory only for results that exist
    static constexpr size_t kReserveMax = 4096;
    size_t k_;
    std::vector<Scored> heap_;
};

}  // namespace fastdpr

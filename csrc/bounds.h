// Size limits shared by the index types, and overflow-checked size arithmetic: every size that decides an
// allocation is checked against these before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace fastdpr {

constexpr int64_t kMaxDim = int64_t{1} << 20;     // vector dimension (what the file loaders accept)
constexpr int64_t kMaxRows = int64_t{1} << 40;    // vectors in one index
constexpr int64_t kMaxNlist = int64_t{1} << 28;   // IVF lists
constexpr int64_t kMaxBeam = int64_t{1} << 30;    // HNSW ef_construction / ef_search
constexpr int64_t kMaxEntryPoints = int64_t{1} << 20;

// a * b, or std::invalid_argument naming `what` when the product does not fit `limit`.
inline size_t checked_mul(size_t a, size_t b, const char* what,
                          size_t limit = static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    if (a != 0 && b > limit / a)
        throw std::invalid_argument(std::string(what) + ": " + std::to_string(a) + " x " + std::to_string(b) +
                                    " is too large");
    return a * b;
}

// lo <= v <= hi, or std::invalid_argument "<what> must be in [lo, hi], got v".
inline int64_t check_range(int64_t v, int64_t lo, int64_t hi, const char* what) {
    if (v < lo || v > hi)
        throw std::invalid_argument(std::string(what) + " must be in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "], got " + std::to_string(v));
    return v;
}

}  // namespace fastdpr

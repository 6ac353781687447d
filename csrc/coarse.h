// Coarse quantizers with many lists (65,536 and more), where one flat pass over all centroids per point is what
// costs: k-means of n points into nlist centroids is n x nlist x d multiply-adds per iteration, and filing n rows
// under their nearest centroid n x nlist x d once more (21M x 65,536 x 768: ~1 PFLOP).
//
// two_level_kmeans trains in two levels, `groups` top clusters and then each cluster's share of the centroids
// on its own points: n x (groups + nlist / groups) x d per iteration. CoarseGroups files rows through a second,
// coarser level over the centroids themselves: the `probe` nearest of G ~ 4 sqrt(nlist) group centres, then the
// nearest centroid among those groups' members (n x (G + probe x nlist / G) x d). The search does not use it: it
// ranks every centroid for a few queries at a time, which is affordable.
#pragma once

#include <cstdint>
#include <vector>

#include "kmeans.h"

namespace fastdpr {

// Children per group for k centroids in all: in proportion to counts (largest remainder, ties to the lower
// group), every non-empty group at least 1, none more than its count, empty groups 0. std::invalid_argument (with
// the numbers) when that is impossible: k below the non-empty groups or above the points.
std::vector<int64_t> split_children(const std::vector<int64_t>& counts, int64_t k);

// (p.k, d) centroids: k-means into `groups` clusters (p with k = groups), the n points filed under them (L2, or
// the largest inner product with p.spherical), p.k children split over the groups by split_children, then an
// independent k-means per group (seed p.seed + 1 + g, p's other settings). A group with as many points as
// children takes its points (normalised with p.spherical); one with more than 4 times the mean share of children is
// trained in two levels itself (coarse.cpp says why). groups in [1, p.k]; 1 is plain kmeans().
std::vector<float> two_level_kmeans(const float* x, int64_t n, int64_t d, const KMeansParams& p, int64_t groups);

// The centroids (nlist, d) grouped by k-means on the centroids themselves into clamp(round(4 sqrt(nlist)), 1,
// nlist) groups, kept even (balance, and groups above twice the mean size split by k-means; coarse.cpp says why
// and measures the count), with a fixed seed: the same centroids give the same groups, so an index files after a
// reload as before. Each centroid belongs to its nearest group centre in L2; groups left without members are
// dropped. Immutable after construction: assign() is const and thread-safe.
class CoarseGroups {
public:
    CoarseGroups(const float* centroids, int64_t nlist, int64_t d);

    int64_t nlist() const { return nlist_; }
    int64_t dim() const { return d_; }
    int64_t groups() const { return groups_; }  // non-empty groups
    int64_t group_size(int64_t g) const { return offsets_[g + 1] - offsets_[g]; }

    // Per row of x (n, d): the `probe` best group centres (nearest in L2, or largest inner product), then the
    // best centroid (the same measure; ties to the lowest index) among their members. probe >= groups() searches
    // every centroid and gives assign_nearest's labels. Multi-threaded; memory O(chunk x probe).
    void assign(const float* x, int64_t n, int64_t probe, bool max_inner_product, int64_t* labels) const;

private:
    int64_t nlist_, d_, groups_ = 0;
    int exponent_ = 0;             // both sides scaled by 2^-exponent_ (magnitude_exponent of the centroids)
    std::vector<float> centres_T_;  // group centres, packed (pack_columns)
    std::vector<float> centre_half_sq_;  // 0.5 ||g||^2 per group centre
    std::vector<int64_t> offsets_;  // group g's members: members_[offsets_[g], offsets_[g + 1])
    std::vector<int64_t> members_;  // centroid ids, ascending within a group
    std::vector<size_t> packed_at_;  // group g's members packed from members_T_[packed_at_[g]]
    std::vector<float> members_T_;
    std::vector<float> member_half_sq_;  // 0.5 ||c||^2 in members_ order
};

}  // namespace fastdpr

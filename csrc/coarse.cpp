#include "coarse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <queue>
#include <stdexcept>
#include <string>
#include <utility>

#include "bounds.h"
#include "parallel.h"
#include "topk.h"

namespace fastdpr {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Grouping the centroids is itself a k-means, of nlist points into G ~ kGroupsPerRoot sqrt(nlist) groups, 10
// iterations from random centres: a small part of filing a few million rows (greedy k-means++ seeding, quadratic in
// G, doubled its cost and filed no row better).
//
// A row costs the centres plus the members of the groups it probes, so the groups must be even: plain k-means of
// k-means centroids leaves one group near their mean holding most of them (a centroid between clusters is the
// mean of rows of several, and such centroids gather there). Measured on 16,384 centroids of 768 dimensions,
// two_level_kmeans on 262,144 calibrated vectors (fastdpr/index/synthetic.py, minilm-mean): the largest of 128
// groups held 2,758 centroids (on a plain Gaussian mixture 14,340), and a row was compared with 11,240 of the
// 16,384 on average. So the group k-means re-seeds groups under half the mean size (balance), a group still above
// kSplitFactor times the mean size is split by k-means into groups of about the mean size (kSplitDepth rounds at
// most), and every centroid then joins its nearest centre among them: on the same data, 8 of 128 groups probed,
// a row compared 1,410 centroids (11.6x fewer) and 0.996 of 10,000 rows found their exact nearest one.
//
// More, smaller groups and more of them probed find more nearest centroids for the same work. Times fewer
// centroids compared per row than flat, and the share of 10,000 rows filed exactly, calibrated vectors as above:
//     16,384 lists:  128 groups, 8 probed: 11.6x, 0.996;  256, 16: 14.5x, 0.999;  512, 16: 15.0x, 0.997
//     65,536 lists:  256 groups, 8 probed: 25.0x, 0.978;  512, 16: 25.6x, 0.993;  1,024, 16: 31.9x, 0.996
// (65,536 centroids from 524,288 vectors, 8 per list.) Hence 4 sqrt(nlist) groups, 16 of them probed
// (IVFPQ::kAssignProbeGroups).
constexpr int64_t kGroupsPerRoot = 4;
constexpr uint64_t kGroupSeed = 0x5eed;
constexpr int kGroupNiter = 10;
constexpr int64_t kGroupPointsPerCentre = 64;
constexpr double kGroupBalance = 0.5;
constexpr double kSplitFactor = 2.0;
constexpr int kSplitDepth = 3;

// Rows filed per pass, and pairs at most: the (row, group) pairs of one pass, O(chunk x probe), are all the memory
// that grows with the rows.
constexpr int64_t kChunk = 16384;
constexpr int64_t kMaxPairs = int64_t{1} << 20;
constexpr int64_t kRankRows = 32;    // rows per block when ranking group centres (assign_nearest's block)
constexpr int64_t kTaskRows = 128;   // one task: up to this many rows of one group's bucket against its members
constexpr int64_t kColTile = 1024;   // members scored per product (a multiple of the packed tile, 32)

// The p best of v_g = s[g] - bias[g] (largest; ties to the lower g; NaN last) into score/id, best first. Kept
// sorted: past the first p a candidate is one comparison with the p-th, and few get in (a partial sort of every
// row's scores cost more than ranking the centres).
void top_groups(const float* s, const float* bias, int64_t G, int64_t p, float* score, int64_t* id) {
    int64_t kept = 0;
    for (int64_t g = 0; g < G; ++g) {
        float v = s[g] - bias[g];
        if (!(v == v)) v = -std::numeric_limits<float>::infinity();
        if (kept == p && !(v > score[p - 1])) continue;  // not better than the p-th (an equal one has a lower g)
        int64_t at = kept < p ? kept++ : p - 1;
        for (; at > 0 && v > score[at - 1]; --at) score[at] = score[at - 1], id[at] = id[at - 1];
        score[at] = v;
        id[at] = g;
    }
}

}  // namespace

std::vector<int64_t> split_children(const std::vector<int64_t>& counts, int64_t k) {
    const int64_t G = static_cast<int64_t>(counts.size());
    int64_t total = 0, nonempty = 0;
    for (int64_t g = 0; g < G; ++g) {
        if (counts[g] < 0) throw std::invalid_argument("split_children: group " + str(g) + " has a negative count");
        total += counts[g];
        nonempty += counts[g] > 0;
    }
    if (k < nonempty)
        throw std::invalid_argument("two-level k-means: " + str(k) + " centroids cannot give each of the " +
                                    str(nonempty) + " non-empty groups one");
    if (k > total)
        throw std::invalid_argument("two-level k-means: need at least k=" + str(k) + " training points, got " +
                                    str(total));
    std::vector<int64_t> out(static_cast<size_t>(G), 0);
    std::vector<double> quota(static_cast<size_t>(G), 0.0);
    int64_t sum = 0;
    for (int64_t g = 0; g < G; ++g) {
        if (counts[g] == 0) continue;
        quota[g] = static_cast<double>(k) * static_cast<double>(counts[g]) / static_cast<double>(total);
        // floor(quota) <= counts[g] since k <= total; only the floor of 1 can take a group above its quota
        out[g] = std::min(counts[g], std::max<int64_t>(1, static_cast<int64_t>(std::floor(quota[g]))));
        sum += out[g];
    }
    // The floors leave fewer than G to place, and the floors of 1 take at most `nonempty` too many: both loops
    // below run O(G) times.
    using Key = std::pair<double, int64_t>;  // (remainder, -g): the largest first, the lower group on ties
    if (sum < k) {
        std::priority_queue<Key> q;
        for (int64_t g = 0; g < G; ++g)
            if (counts[g] > out[g]) q.push({quota[g] - static_cast<double>(out[g]), -g});
        for (; sum < k; ++sum) {
            const int64_t g = -q.top().second;
            q.pop();
            if (++out[g] < counts[g]) q.push({quota[g] - static_cast<double>(out[g]), -g});
        }
    } else if (sum > k) {
        std::priority_queue<Key> q;  // (excess over the quota, g): the most over-served first, the higher group
        for (int64_t g = 0; g < G; ++g)
            if (out[g] > 1) q.push({static_cast<double>(out[g]) - quota[g], g});
        for (; sum > k; --sum) {
            const int64_t g = q.top().second;
            q.pop();
            if (--out[g] > 1) q.push({static_cast<double>(out[g]) - quota[g], g});
        }
    }
    return out;
}

namespace {

// A top cluster can take many times its share of the points: where the data has no structure at the scale of the
// groups, k-means leaves one large cluster near their mean (random clustered data, 524,288 x 768 into 128 groups:
// one group of 5,436 of 16,384 children, the median 54). Its own k-means would cost its share squared of the flat
// one (and greedy k-means++ seeding, quadratic in k, more), so a group of more than kOversized times the mean share
// of children is trained in two levels itself, in as many groups as it has shares, kMaxDepth levels deep at most.
constexpr int64_t kOversized = 4;
constexpr int kMaxDepth = 3;

std::vector<float> two_level(const float* x, int64_t n, int64_t d, const KMeansParams& p, int64_t groups,
                             int depth) {
    if (groups == 1) return kmeans(x, n, d, p).centroids;
    if (n < p.k)
        throw std::invalid_argument("k-means: need at least k=" + str(p.k) + " training points, got " + str(n));
    KMeansParams top_params = p;
    top_params.k = groups;
    const std::vector<float> top = kmeans(x, n, d, top_params).centroids;
    std::vector<int64_t> label(static_cast<size_t>(n));
    assign_nearest(x, n, top.data(), groups, d, p.spherical, label.data(), nullptr);
    std::vector<int64_t> counts(static_cast<size_t>(groups), 0);
    for (const int64_t l : label) ++counts[l];
    const std::vector<int64_t> children = split_children(counts, p.k);

    std::vector<int64_t> start(static_cast<size_t>(groups) + 1, 0), order(static_cast<size_t>(n));
    for (int64_t g = 0; g < groups; ++g) start[g + 1] = start[g] + counts[g];
    {
        std::vector<int64_t> at(start.begin(), start.end() - 1);
        for (int64_t i = 0; i < n; ++i) order[at[label[i]]++] = i;
    }
    std::vector<float> out(checked_mul(static_cast<size_t>(p.k), static_cast<size_t>(d), "two-level k-means"));
    std::vector<float> points;
    int64_t placed = 0;
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t kg = children[g], ng = counts[g];
        if (kg == 0) continue;
        points.resize(static_cast<size_t>(ng) * d);
        for (int64_t i = 0; i < ng; ++i)
            std::memcpy(&points[i * d], x + order[start[g] + i] * d, sizeof(float) * d);
        float* dst = &out[placed * d];
        if (kg == ng) {  // k-means of ng points into ng clusters would end with the points
            std::copy(points.begin(), points.end(), dst);
            if (p.spherical)
                for (int64_t j = 0; j < kg; ++j) {
                    double s = 0;
                    for (int64_t t = 0; t < d; ++t) s += static_cast<double>(dst[j * d + t]) * dst[j * d + t];
                    const double inv = s > 0 ? 1.0 / std::sqrt(s) : 1.0;
                    for (int64_t t = 0; t < d; ++t) dst[j * d + t] = static_cast<float>(dst[j * d + t] * inv);
                }
        } else {
            KMeansParams gp = p;
            gp.k = kg;
            gp.seed = p.seed + 1 + static_cast<uint64_t>(g);
            const int64_t share = (p.k + groups - 1) / groups;
            const int64_t sub = depth < kMaxDepth && kg > kOversized * share ? (kg + share - 1) / share : 1;
            const std::vector<float> c = two_level(points.data(), ng, d, gp, sub, depth + 1);
            std::copy(c.begin(), c.end(), dst);
        }
        placed += kg;
    }
    return out;
}

}  // namespace

std::vector<float> two_level_kmeans(const float* x, int64_t n, int64_t d, const KMeansParams& p, int64_t groups) {
    if (p.k <= 0) throw std::invalid_argument("k-means: k must be positive, got " + str(p.k));
    if (groups < 1 || groups > p.k)
        throw std::invalid_argument("two-level k-means: groups must be in [1, k=" + str(p.k) + "], got " +
                                    str(groups));
    return two_level(x, n, d, p, groups, 0);
}

CoarseGroups::CoarseGroups(const float* centroids, int64_t nlist, int64_t d) : nlist_(nlist), d_(d) {
    check_range(nlist, 1, kMaxNlist, "coarse groups: nlist");
    check_range(d, 1, kMaxDim, "coarse groups: dim");
    const size_t nd = checked_mul(static_cast<size_t>(nlist), static_cast<size_t>(d), "coarse groups");
    // the scaling assign_nearest applies, so that rows and centroids meet in the same range
    exponent_ = magnitude_exponent(centroids, nlist * d);
    std::vector<float> c(centroids, centroids + nd);
    if (exponent_ != 0)
        for (float& v : c) v = std::ldexp(v, -exponent_);

    const int64_t g0 = std::clamp<int64_t>(
        std::llround(static_cast<double>(kGroupsPerRoot) * std::sqrt(static_cast<double>(nlist))), 1, nlist);
    KMeansParams kp;
    kp.k = g0;
    kp.niter = kGroupNiter;
    kp.seed = kGroupSeed;
    kp.max_points_per_centroid = kGroupPointsPerCentre;
    kp.balance = kGroupBalance;
    kp.kmeanspp = false;  // also for the splits below
    std::vector<float> centres = kmeans(c.data(), nlist, d, kp).centroids;
    int64_t ncentres = g0;
    std::vector<int64_t> label(static_cast<size_t>(nlist));
    assign_nearest(c.data(), nlist, centres.data(), ncentres, d, false, label.data(), nullptr);

    const double mean = static_cast<double>(nlist) / static_cast<double>(g0);
    std::vector<float> points, split;
    std::vector<int64_t> sub_label;
    for (int round = 0; round < kSplitDepth; ++round) {
        std::vector<int64_t> count(static_cast<size_t>(ncentres), 0);
        for (const int64_t l : label) ++count[l];
        if (static_cast<double>(*std::max_element(count.begin(), count.end())) <= kSplitFactor * mean) break;
        split.clear();
        int64_t nsplit = 0;
        std::vector<std::vector<int64_t>> members(static_cast<size_t>(ncentres));
        for (int64_t j = 0; j < nlist; ++j) members[label[j]].push_back(j);
        for (int64_t g = 0; g < ncentres; ++g) {
            const int64_t size = count[g];
            if (size == 0) continue;
            if (static_cast<double>(size) <= kSplitFactor * mean) {
                split.insert(split.end(), centres.begin() + g * d, centres.begin() + (g + 1) * d);
                for (const int64_t j : members[g]) label[j] = nsplit;
                ++nsplit;
                continue;
            }
            points.resize(static_cast<size_t>(size) * d);
            for (int64_t i = 0; i < size; ++i) std::memcpy(&points[i * d], &c[members[g][i] * d], sizeof(float) * d);
            KMeansParams sp = kp;
            sp.k = std::min(size, static_cast<int64_t>(std::ceil(static_cast<double>(size) / mean)));
            sp.seed = kGroupSeed + 1 + static_cast<uint64_t>(round * nlist + nsplit);
            const std::vector<float> sub = kmeans(points.data(), size, d, sp).centroids;
            sub_label.resize(static_cast<size_t>(size));
            assign_nearest(points.data(), size, sub.data(), sp.k, d, false, sub_label.data(), nullptr);
            split.insert(split.end(), sub.begin(), sub.end());
            for (int64_t i = 0; i < size; ++i) label[members[g][i]] = nsplit + sub_label[i];
            nsplit += sp.k;
        }
        centres.swap(split);
        ncentres = nsplit;
    }
    // each centroid's group: its nearest centre, which after a split need not be one of its own group's
    assign_nearest(c.data(), nlist, centres.data(), ncentres, d, false, label.data(), nullptr);

    // a group centre without members would take a probe and give nothing: such groups are dropped
    std::vector<int64_t> count(static_cast<size_t>(ncentres), 0), renumber(static_cast<size_t>(ncentres), -1);
    for (const int64_t l : label) ++count[l];
    std::vector<float> kept;
    for (int64_t g = 0; g < ncentres; ++g) {
        if (count[g] == 0) continue;
        renumber[g] = groups_++;
        kept.insert(kept.end(), centres.begin() + g * d, centres.begin() + (g + 1) * d);
        centre_half_sq_.push_back(0.5f * sqnorm(&centres[g * d], d));
    }
    centres_T_ = pack_columns(kept.data(), groups_, d);

    offsets_.assign(static_cast<size_t>(groups_) + 1, 0);
    for (int64_t j = 0; j < nlist; ++j) ++offsets_[renumber[label[j]] + 1];
    for (int64_t g = 0; g < groups_; ++g) offsets_[g + 1] += offsets_[g];
    members_.resize(static_cast<size_t>(nlist));
    {
        std::vector<int64_t> at(offsets_.begin(), offsets_.end() - 1);
        for (int64_t j = 0; j < nlist; ++j) members_[at[renumber[label[j]]]++] = j;  // ascending within a group
    }
    // A second copy of the centroids, each group's packed on its own (the index keeps its own for the search):
    // at 65,536 x 768 another 200 MB, next to a few GB of codes.
    packed_at_.assign(static_cast<size_t>(groups_) + 1, 0);
    for (int64_t g = 0; g < groups_; ++g) packed_at_[g + 1] = packed_at_[g] + packed_size(group_size(g), d);
    members_T_.assign(packed_at_[groups_], 0.f);
    member_half_sq_.resize(static_cast<size_t>(nlist));
    std::vector<float> rows;
    for (int64_t g = 0; g < groups_; ++g) {
        const int64_t o = offsets_[g], size = group_size(g);
        rows.resize(static_cast<size_t>(size) * d);
        for (int64_t i = 0; i < size; ++i) {
            const float* src = &c[members_[o + i] * d];
            std::memcpy(&rows[i * d], src, sizeof(float) * d);
            member_half_sq_[o + i] = 0.5f * sqnorm(src, d);
        }
        const std::vector<float> packed = pack_columns(rows.data(), size, d);
        std::copy(packed.begin(), packed.end(), members_T_.begin() + static_cast<int64_t>(packed_at_[g]));
    }
}

void CoarseGroups::assign(const float* x, int64_t n, int64_t probe, bool max_inner_product, int64_t* labels) const {
    if (probe < 1) throw std::invalid_argument("coarse groups: probe must be >= 1, got " + str(probe));
    if (n <= 0) return;
    const int64_t G = groups_, d = d_;
    const int64_t P = std::min(probe, G);
    const int exponent = exponent_;
    // L2: argmin ||x - c||^2 == argmax <x, c> - ||c||^2 / 2, for the group centres and the centroids alike
    const std::vector<float> zeros(max_inner_product ? static_cast<size_t>(std::max(G, nlist_)) : 0, 0.f);
    const float* centre_bias = max_inner_product ? zeros.data() : centre_half_sq_.data();
    const float* member_bias = max_inner_product ? zeros.data() : member_half_sq_.data();
    // row i of x, scaled as the centroids were, into buf
    const auto row_into = [&](int64_t i, float* buf) {
        const float* src = x + i * d;
        if (exponent == 0)
            std::memcpy(buf, src, sizeof(float) * d);
        else
            for (int64_t t = 0; t < d; ++t) buf[t] = std::ldexp(src[t], -exponent);
    };

    const int64_t chunk = std::min({kChunk, n, std::max<int64_t>(1, kMaxPairs / P)});
    std::vector<int64_t> sel(static_cast<size_t>(chunk * P));      // per row, its P groups
    std::vector<int64_t> pair_at(static_cast<size_t>(chunk * P));  // ... and where their results are
    std::vector<int64_t> pair_row(static_cast<size_t>(chunk * P));  // per pair, bucketed by group: the row
    std::vector<float> pair_score(static_cast<size_t>(chunk * P));
    std::vector<int64_t> pair_label(static_cast<size_t>(chunk * P));
    std::vector<int64_t> bucket(static_cast<size_t>(G) + 1);
    struct Task {
        int64_t group, begin, end;  // pairs [begin, end) of the group's bucket
    };
    std::vector<Task> tasks;

    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        const int64_t nc = std::min(chunk, n - c0);
        ParallelErrors errors;
        if (P == G) {  // every group
            for (int64_t r = 0; r < nc; ++r)
                for (int64_t i = 0; i < P; ++i) sel[r * P + i] = i;
        } else {
            const int64_t nblocks = (nc + kRankRows - 1) / kRankRows;
#pragma omp parallel for schedule(dynamic, 4) if (nblocks > 1 && worth_threads(nc * G * d))
            for (int64_t b = 0; b < nblocks; ++b) {
                errors.run([&] {
                    thread_local std::vector<float> xs, scores;
                    thread_local std::vector<float> kept_score;
                    thread_local std::vector<int64_t> kept_id;
                    const int64_t r0 = b * kRankRows, rows = std::min(kRankRows, nc - r0);
                    xs.resize(static_cast<size_t>(rows * d));
                    scores.resize(static_cast<size_t>(rows * G));
                    kept_score.resize(static_cast<size_t>(P));
                    kept_id.resize(static_cast<size_t>(P));
                    for (int64_t r = 0; r < rows; ++r) row_into(c0 + r0 + r, &xs[r * d]);
                    inner_products_T(xs.data(), rows, centres_T_.data(), G, d, scores.data());
                    for (int64_t r = 0; r < rows; ++r) {
                        top_groups(&scores[r * G], centre_bias, G, P, kept_score.data(), kept_id.data());
                        std::copy(kept_id.begin(), kept_id.end(), &sel[(r0 + r) * P]);
                    }
                });
            }
            errors.rethrow();
        }

        // the pairs bucketed by group, rows ascending inside a bucket
        std::fill(bucket.begin(), bucket.end(), 0);
        for (int64_t i = 0; i < nc * P; ++i) ++bucket[sel[i] + 1];
        for (int64_t g = 0; g < G; ++g) bucket[g + 1] += bucket[g];
        {
            std::vector<int64_t> at(bucket.begin(), bucket.end() - 1);
            for (int64_t r = 0; r < nc; ++r)
                for (int64_t i = 0; i < P; ++i) {
                    const int64_t pos = at[sel[r * P + i]]++;
                    pair_row[pos] = r;
                    pair_at[r * P + i] = pos;
                }
        }
        tasks.clear();
        int64_t work = 0;
        for (int64_t g = 0; g < G; ++g) {
            for (int64_t b = bucket[g]; b < bucket[g + 1]; b += kTaskRows)
                tasks.push_back({g, b, std::min(bucket[g + 1], b + kTaskRows)});
            work += (bucket[g + 1] - bucket[g]) * group_size(g);
        }

        // each task: its rows against the group's members, the best member per (row, group) pair
        const int64_t ntasks = static_cast<int64_t>(tasks.size());
#pragma omp parallel for schedule(dynamic, 1) if (ntasks > 1 && worth_threads(work * d))
        for (int64_t t = 0; t < ntasks; ++t) {
            errors.run([&] {
                thread_local std::vector<float> xs, scores;
                const Task task = tasks[t];
                const int64_t rows = task.end - task.begin, o = offsets_[task.group], size = group_size(task.group);
                const float* packed = members_T_.data() + packed_at_[task.group];
                xs.resize(static_cast<size_t>(rows * d));
                scores.resize(static_cast<size_t>(rows * std::min(kColTile, size)));
                for (int64_t r = 0; r < rows; ++r) row_into(c0 + pair_row[task.begin + r], &xs[r * d]);
                float* best = &pair_score[task.begin];
                int64_t* arg = &pair_label[task.begin];
                std::fill(best, best + rows, -std::numeric_limits<float>::infinity());
                std::fill(arg, arg + rows, members_[o]);
                for (int64_t j0 = 0; j0 < size; j0 += kColTile) {
                    const int64_t cols = std::min(kColTile, size - j0);
                    inner_products_T(xs.data(), rows, packed + j0 * d, cols, d, scores.data());
                    const float* bias = member_bias + o + j0;
                    for (int64_t r = 0; r < rows; ++r) {
                        const float* s = &scores[r * cols];
                        for (int64_t j = 0; j < cols; ++j) {
                            const float v = s[j] - bias[j];
                            if (v > best[r]) best[r] = v, arg[r] = members_[o + j0 + j];  // ties: the lower id
                        }
                    }
                }
            });
        }
        errors.rethrow();

        for (int64_t r = 0; r < nc; ++r) {
            Scored b{pair_score[pair_at[r * P]], pair_label[pair_at[r * P]]};
            for (int64_t i = 1; i < P; ++i) {
                const Scored s{pair_score[pair_at[r * P + i]], pair_label[pair_at[r * P + i]]};
                if (better(s, b)) b = s;
            }
            labels[c0 + r] = b.id;
        }
    }
}

}  // namespace fastdpr

#include "kmeans.h"

#include "bounds.h"
#include "parallel.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace fastdpr {
namespace {

// Packed panel layout (see pack_columns): tiles of kTile columns, each tile stored as (d, kTile) rows. A tile is
// one contiguous stream (d * 128 bytes) however many columns there are in all, so the kernel never walks a
// power-of-two stride (which maps every row to the same cache sets).
constexpr int64_t kTile = 32;

// Register-tiled micro-kernel (the GEMM idea, hand-written so the extension needs no BLAS): R rows of x against
// one packed tile; the R x 32 outputs live in R * NV vector registers of W floats (NV * W = 32). Each step over t
// loads NV slices of the tile and broadcasts R values of x. GCC vector types compile to zmm / ymm / xmm code in
// the AVX-512 / AVX2 / baseline clones below.
typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));

template <class V, int NV, int R>
inline __attribute__((always_inline)) void micro_tile(const float* x, int64_t ldx, int64_t d, const float* tile,
                                                      float* out, int64_t ldo, int64_t nc) {
    constexpr int W = sizeof(V) / sizeof(float);
    static_assert(NV * W == kTile, "a tile is kTile floats wide");
    V acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = V{};
    for (int64_t t = 0; t < d; ++t) {
        V y[NV];
        for (int v = 0; v < NV; ++v) std::memcpy(&y[v], tile + t * kTile + v * W, sizeof(V));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            const float xv = x[r * ldx + t];
            for (int v = 0; v < NV; ++v) acc[r][v] += xv * y[v];
        }
    }
    for (int r = 0; r < R; ++r) {
        if (nc == kTile) {
            std::memcpy(out + r * ldo, &acc[r][0], sizeof(float) * kTile);
        } else {  // the last, partial tile (its padding columns are zeros)
            alignas(64) float tmp[kTile];
            std::memcpy(tmp, &acc[r][0], sizeof(float) * kTile);
            std::memcpy(out + r * ldo, tmp, sizeof(float) * nc);
        }
    }
}

template <class V, int NV, int R>
inline __attribute__((always_inline)) void ip_T_body(const float* x, int64_t nx, const float* packed, int64_t ny,
                                                     int64_t d, float* out) {
    const int64_t ntiles = (ny + kTile - 1) / kTile;
    for (int64_t jt = 0; jt < ntiles; ++jt) {
        const float* tile = packed + jt * d * kTile;
        const int64_t j0 = jt * kTile, nc = std::min(kTile, ny - j0);
        int64_t i = 0;
        for (; i + R <= nx; i += R) micro_tile<V, NV, R>(x + i * d, d, d, tile, out + i * ny + j0, ny, nc);
        for (; i < nx; ++i) micro_tile<V, NV, 1>(x + i * d, d, d, tile, out + i * ny + j0, ny, nc);
    }
}

// Nearest packed column of each row: scores v_j = <x, y_j> - bias_j, argmax with ties to the lowest j.
// `scratch` holds nx * ny floats. The max is a vector reduction; the index is found by a second, predictable scan
// (a compare-and-branch argmax over 256 codewords would cost more than the products for small sub-vectors).
template <class V, int NV, int R>
inline __attribute__((always_inline)) void nearest_body(const float* x, int64_t nx, const float* yT,
                                                        const float* bias, int64_t ny, int64_t d, float* scratch,
                                                        int64_t* labels, float* best) {
    ip_T_body<V, NV, R>(x, nx, yT, ny, d, scratch);
    for (int64_t r = 0; r < nx; ++r) {
        float* row = scratch + r * ny;
        float bv = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : bv)
        for (int64_t j = 0; j < ny; ++j) {
            const float v = row[j] - bias[j];
            row[j] = v;
            bv = v > bv ? v : bv;
        }
        int64_t b = 0;
        while (b + 1 < ny && !(row[b] == bv)) ++b;
        labels[r] = b;
        best[r] = row[b];
    }
}

using IpTFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*);
using NearestFn = void (*)(const float*, int64_t, const float*, const float*, int64_t, int64_t, float*, int64_t*,
                           float*);

// Tile shapes per level: R * NV accumulators + NV tile slices + 1 broadcast must fit the register file
// (16 xmm, 16 ymm, 32 zmm).
#define FASTDPR_KMEANS_KERNELS(SUFFIX, ATTR, V, NV, R)                                                            \
    ATTR void ip_T_##SUFFIX(const float* x, int64_t nx, const float* yT, int64_t ny, int64_t d, float* out) {    \
        ip_T_body<V, NV, R>(x, nx, yT, ny, d, out);                                                              \
    }                                                                                                            \
    ATTR void nearest_##SUFFIX(const float* x, int64_t nx, const float* yT, const float* bias, int64_t ny,       \
                               int64_t d, float* scratch, int64_t* labels, float* best) {                        \
        nearest_body<V, NV, R>(x, nx, yT, bias, ny, d, scratch, labels, best);                                   \
    }

FASTDPR_KMEANS_KERNELS(default, , v4f, 8, 1)
#if defined(__x86_64__) && defined(__GNUC__)
FASTDPR_KMEANS_KERNELS(avx2, __attribute__((target("avx2,fma"))), v8f, 4, 2)
FASTDPR_KMEANS_KERNELS(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma,prefer-vector-width=512"))), v16f, 2,
                       8)
#endif

// The level follows simd::level() (the index kernels' one), so the registry's cap (cpu.h) switches these kernels too.
IpTFn ip_T_kernel() {
#if defined(__x86_64__) && defined(__GNUC__)
    switch (simd::level()) {
        case cpu::Level::Scalar: break;
        case cpu::Level::AVX2: return ip_T_avx2;
        default: return ip_T_avx512;
    }
#endif
    return ip_T_default;
}

NearestFn nearest_kernel() {
#if defined(__x86_64__) && defined(__GNUC__)
    switch (simd::level()) {
        case cpu::Level::Scalar: break;
        case cpu::Level::AVX2: return nearest_avx2;
        default: return nearest_avx512;
    }
#endif
    return nearest_default;
}

inline float sqdist(const float* a, const float* b, int64_t d) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t t = 0; t < d; ++t) {
        const float e = a[t] - b[t];
        s += e * e;
    }
    return s;
}

void check_positive(int64_t v, const char* what) {
    if (v <= 0) throw std::invalid_argument(std::string("k-means: ") + what + " must be positive, got " + std::to_string(v));
}

// exponent_of the n x d points, whose NaN or Inf anywhere is an error naming the point.
int training_exponent(const float* x, int64_t n, int64_t d) {
    float top = 0.f;
    for (int64_t i = 0; i < n; ++i) {
        float row_top = 0.f;
        bool finite = true;
        for (int64_t t = 0; t < d; ++t) {
            const float v = x[i * d + t];
            finite = finite && std::isfinite(v);
            row_top = std::max(row_top, std::fabs(v));
        }
        if (!finite)
            throw std::invalid_argument("k-means: training point " + std::to_string(i) + " contains NaN or Inf");
        top = std::max(top, row_top);
    }
    return exponent_of(top);
}

// Fewest points a cluster may keep with balance b: floor(b * n / k), computed as fastdpr/index/kmeans.py does.
int64_t small_cluster_floor(double balance, int64_t n, int64_t k) {
    return static_cast<int64_t>(balance * static_cast<double>(n) / static_cast<double>(k));
}

}  // namespace

int exponent_of(float top) {
    if (!(top > 0.f) || !std::isfinite(top) || (top >= 0x1p-30f && top <= 0x1p30f)) return 0;
    int e = 0;
    std::frexp(top, &e);  // top = f 2^e, f in [0.5, 1)
    return e;
}

int magnitude_exponent(const float* v, int64_t n) {
    float top = 0.f;
    for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(v[i])) top = std::max(top, std::fabs(v[i]));
    return exponent_of(top);
}

size_t packed_size(int64_t n, int64_t d) {
    return static_cast<size_t>((n + kTile - 1) / kTile) * kTile * static_cast<size_t>(d);
}

std::vector<float> pack_columns(const float* y, int64_t n, int64_t d) {
    std::vector<float> p(packed_size(n, d), 0.f);
    for (int64_t j = 0; j < n; ++j) {
        float* tile = p.data() + (j / kTile) * d * kTile + (j % kTile);
        const float* row = y + j * d;
        for (int64_t t = 0; t < d; ++t) tile[t * kTile] = row[t];
    }
    return p;
}

std::vector<float> unpack_columns(const float* packed, int64_t n, int64_t d) {
    std::vector<float> y(static_cast<size_t>(n) * d);
    for (int64_t j = 0; j < n; ++j) {
        const float* tile = packed + (j / kTile) * d * kTile + (j % kTile);
        float* row = y.data() + j * d;
        for (int64_t t = 0; t < d; ++t) row[t] = tile[t * kTile];
    }
    return y;
}

void inner_products_T(const float* x, int64_t nx, const float* yT, int64_t ny, int64_t d, float* out) {
    ip_T_kernel()(x, nx, yT, ny, d, out);
}

void inner_products(const float* x, int64_t nx, const float* y, int64_t ny, int64_t d, float* out) {
    const std::vector<float> yT = pack_columns(y, ny, d);
    constexpr int64_t kRows = 32;
    const int64_t nblocks = (nx + kRows - 1) / kRows;
    const IpTFn ip_T_impl = ip_T_kernel();
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_threads(nx * ny * d))
    for (int64_t b = 0; b < nblocks; ++b) {
        errors.run([&] {
            const int64_t i0 = b * kRows, rows = std::min(kRows, nx - i0);
            ip_T_impl(x + i0 * d, rows, yT.data(), ny, d, out + i0 * ny);
        });
    }
    errors.rethrow();
}

void assign_nearest(const float* x, int64_t n, const float* centroids, int64_t k, int64_t d, bool max_inner_product,
                    int64_t* labels, float* dist) {
    if (n <= 0) return;
    // Centroids (and so, in every use here, the points) far outside float32's comfortable range would overflow the
    // products or lose them below the normal range: both sides are scaled by the same power of two, which changes
    // no ranking, and the distances scaled back (see kmeans()).
    const int exponent = magnitude_exponent(centroids, k * d);
    std::vector<float> scaled_centroids;
    if (exponent != 0) {
        scaled_centroids.assign(centroids, centroids + static_cast<size_t>(k) * d);
        for (float& v : scaled_centroids) v = std::ldexp(v, -exponent);
        centroids = scaled_centroids.data();
    }
    const std::vector<float> cT = pack_columns(centroids, k, d);
    // L2: argmin ||x - c||^2 == argmax <x, c> - ||c||^2 / 2
    std::vector<float> bias(k, 0.f);
    if (!max_inner_product)
        for (int64_t j = 0; j < k; ++j) bias[j] = 0.5f * sqnorm(centroids + j * d, d);
    constexpr int64_t kRows = 32;
    const int64_t nblocks = (n + kRows - 1) / kRows;
    const NearestFn nearest_impl = nearest_kernel();
    const bool par = nblocks > 1 && worth_threads(n * k * d);
    // per-thread scratch, allocated here on the calling thread (an allocation failure is an ordinary exception)
    const size_t n_scratch = par ? static_cast<size_t>(std::max(1, resolve_threads(0))) : 1;
    std::vector<std::vector<float>> scratch(n_scratch, std::vector<float>(static_cast<size_t>(kRows) * k));
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 4) num_threads(static_cast<int>(n_scratch)) if (par)
    for (int64_t b = 0; b < nblocks; ++b) {
        errors.run([&] {
            float best[kRows];
            const int64_t i0 = b * kRows, rows = std::min(kRows, n - i0);
            const float* xb = x + i0 * d;
            if (exponent != 0) {
                thread_local std::vector<float> xs;
                xs.resize(static_cast<size_t>(rows) * d);
                for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::ldexp(xb[i], -exponent);
                xb = xs.data();
            }
            nearest_impl(xb, rows, cT.data(), bias.data(), k, d, scratch[static_cast<size_t>(thread_index())].data(),
                         labels + i0, best);
            if (dist)
                for (int64_t r = 0; r < rows; ++r) {
                    const float v = max_inner_product ? best[r] : std::max(0.f, sqnorm(xb + r * d, d) - 2.f * best[r]);
                    dist[i0 + r] = exponent != 0 ? std::ldexp(v, 2 * exponent) : v;
                }
        });
    }
    errors.rethrow();
}

KMeansResult kmeans(const float* x_in, int64_t n, int64_t d, const KMeansParams& p) {
    check_positive(p.k, "k");
    check_positive(d, "dimension");
    check_positive(p.niter, "niter");
    check_positive(p.max_points_per_centroid, "max_points_per_centroid");
    if (!(p.balance >= 0 && p.balance < 1))  // also refuses NaN
        throw std::invalid_argument("k-means: balance must be in [0, 1), got " + std::to_string(p.balance));
    const int64_t k = p.k;
    if (n < k)
        throw std::invalid_argument("k-means: need at least k=" + std::to_string(k) + " training points, got " +
                                    std::to_string(n));
    checked_mul(static_cast<size_t>(n), static_cast<size_t>(d), "k-means: training points x dimension");
    // Every distance below is a float32 sum of d squares: at |x| ~ 1e19 they overflow to inf (and the k-means++
    // potential with them), at ~1e-20 they vanish below float32's normal range, and all points look alike. The
    // points are brought to a largest magnitude in [0.5, 1) by a power of two, exact in both directions, when they
    // lie outside a range where no such thing can happen; centroids are scaled back at the end.
    const int exponent = training_exponent(x_in, n, d);
    std::mt19937_64 rng(p.seed);
    KMeansResult res;

    // Seeded subsample (partial Fisher-Yates), kept in the original order for locality. (k <= n, so the cap
    // below is computed without overflow.)
    std::vector<float> sub;
    const float* x = x_in;
    int64_t nt = n;
    if (p.max_points_per_centroid <= (n - 1) / k) {  // n > k * max_points_per_centroid
        nt = k * p.max_points_per_centroid;
        std::vector<int64_t> perm(n);
        std::iota(perm.begin(), perm.end(), int64_t{0});
        for (int64_t i = 0; i < nt; ++i) {
            std::uniform_int_distribution<int64_t> u(i, n - 1);
            std::swap(perm[i], perm[u(rng)]);
        }
        std::sort(perm.begin(), perm.begin() + nt);
        sub.resize(static_cast<size_t>(nt) * d);
        for (int64_t i = 0; i < nt; ++i) std::memcpy(&sub[i * d], x_in + perm[i] * d, sizeof(float) * d);
        x = sub.data();
    }
    res.n_train = nt;
    if (exponent != 0) {  // scaled in the subsample's copy, or in one of the whole input
        if (sub.empty()) sub.assign(x_in, x_in + static_cast<size_t>(n) * d);
        for (float& v : sub) v = std::ldexp(v, -exponent);
        x = sub.data();
    }

    std::vector<float>& c = res.centroids;
    c.assign(static_cast<size_t>(k) * d, 0.f);
    if (p.kmeanspp) {
        // Greedy k-means++ (each step draws 2 + ln k candidates by D^2 weighting and keeps the one that lowers the
        // potential most; plain k-means++ often seeds two centroids in one cluster and Lloyd cannot undo that).
        // Seeding runs on a subsample of S points: its cost is O(k * trials * S * d).
        const int64_t S = std::min(nt, std::max<int64_t>(4 * k, 2048));
        const int trials = 2 + static_cast<int>(std::log(static_cast<double>(k)));
        std::vector<int64_t> pick(nt);
        std::iota(pick.begin(), pick.end(), int64_t{0});
        for (int64_t i = 0; i < S; ++i) {
            std::uniform_int_distribution<int64_t> u(i, nt - 1);
            std::swap(pick[i], pick[u(rng)]);
        }
        std::vector<float> d2(S), cand_d2(S), best_d2(S);
        std::uniform_int_distribution<int64_t> first(0, S - 1);
        const int64_t chosen = pick[first(rng)];
        std::memcpy(&c[0], x + chosen * d, sizeof(float) * d);
        const bool par = S * d >= (int64_t{1} << 18);  // small seeding steps are not worth waking threads for
        ParallelErrors errors;
#pragma omp parallel for schedule(static) if (par)
        for (int64_t i = 0; i < S; ++i) errors.run([&] { d2[i] = sqdist(x + pick[i] * d, &c[0], d); });
        errors.rethrow();
        for (int64_t j = 1; j < k; ++j) {
            double total = 0;
            for (int64_t i = 0; i < S; ++i) total += d2[i];
            int64_t best_at = -1;
            double best_pot = std::numeric_limits<double>::infinity();
            for (int t = 0; t < trials; ++t) {
                int64_t at = -1;
                if (total > 0) {
                    std::uniform_real_distribution<double> u(0.0, total);
                    const double r = u(rng);
                    double cum = 0;
                    for (int64_t i = 0; i < S; ++i) {
                        cum += d2[i];
                        if (cum >= r && d2[i] > 0) {
                            at = i;
                            break;
                        }
                    }
                }
                if (at < 0) {  // every remaining point coincides with a centroid: any point will do
                    std::uniform_int_distribution<int64_t> u(0, S - 1);
                    at = u(rng);
                }
                const float* cand = x + pick[at] * d;
                double pot = 0;
#pragma omp parallel for schedule(static) reduction(+ : pot) if (par)
                for (int64_t i = 0; i < S; ++i) {
                    errors.run([&] {
                        cand_d2[i] = std::min(d2[i], sqdist(x + pick[i] * d, cand, d));
                        pot += cand_d2[i];
                    });
                }
                errors.rethrow();
                if (pot < best_pot || best_at < 0) {  // (the first trial is kept whatever its potential)
                    best_pot = pot;
                    best_at = at;
                    best_d2.swap(cand_d2);
                }
            }
            std::memcpy(&c[j * d], x + pick[best_at] * d, sizeof(float) * d);
            d2.swap(best_d2);
        }
    } else {
        std::vector<int64_t> perm(nt);
        std::iota(perm.begin(), perm.end(), int64_t{0});
        for (int64_t i = 0; i < k; ++i) {
            std::uniform_int_distribution<int64_t> u(i, nt - 1);
            std::swap(perm[i], perm[u(rng)]);
            std::memcpy(&c[i * d], x + perm[i] * d, sizeof(float) * d);
        }
    }

    auto normalise_rows = [&]() {
        for (int64_t j = 0; j < k; ++j) {
            const float nrm = std::sqrt(sqnorm(&c[j * d], d));
            if (nrm > 0)
                for (int64_t t = 0; t < d; ++t) c[j * d + t] /= nrm;
        }
    };
    if (p.spherical) normalise_rows();

    std::vector<int64_t> labels(nt);
    std::vector<float> dist(nt);
    std::vector<double> sums(static_cast<size_t>(k) * d);
    std::vector<int64_t> counts(k);
    for (int it = 0; it < p.niter; ++it) {
        assign_nearest(x, nt, c.data(), k, d, p.spherical, labels.data(), dist.data());
        double obj = 0;
        for (int64_t i = 0; i < nt; ++i) obj += dist[i];
        res.objective.push_back(obj / static_cast<double>(nt));

        std::fill(sums.begin(), sums.end(), 0.0);
        std::fill(counts.begin(), counts.end(), 0);
        // Each thread owns a range of centroids and scans all labels: the sums are the same whatever the thread
        // count, so training is reproducible from the seed alone.
        ParallelErrors errors;
#pragma omp parallel if (worth_threads(nt * d * 4))
        errors.run([&] {
            int nth = 1, th = 0;
#ifdef FASTDPR_OPENMP
            nth = omp_get_num_threads();
            th = omp_get_thread_num();
#endif
            const int64_t k0 = k * th / nth, k1 = k * (th + 1) / nth;
            for (int64_t i = 0; i < nt; ++i) {
                const int64_t l = labels[i];
                if (l < k0 || l >= k1) continue;
                double* s = &sums[l * d];
                const float* xi = x + i * d;
                for (int64_t t = 0; t < d; ++t) s[t] += xi[t];
                ++counts[l];
            }
        });
        errors.rethrow();
        for (int64_t j = 0; j < k; ++j) {
            if (counts[j] == 0) continue;
            const double inv = 1.0 / static_cast<double>(counts[j]);
            for (int64_t t = 0; t < d; ++t) c[j * d + t] = static_cast<float>(sums[j * d + t] * inv);
        }
        // Empty clusters (and, with balance, clusters under the floor, except after the last update, whose
        // centroids are the result): split the currently largest cluster in two by symmetric perturbation of its
        // centroid; the small cluster's points go to their next-nearest centroids at the next assignment.
        const int64_t floor = it + 1 < p.niter ? std::max<int64_t>(1, small_cluster_floor(p.balance, nt, k)) : 1;
        for (int64_t j = 0; j < k; ++j) {
            if (counts[j] >= floor) continue;
            const int64_t big = std::max_element(counts.begin(), counts.end()) - counts.begin();
            if (counts[big] < 2 * floor) break;  // nothing left to split (fewer distinct points than clusters)
            constexpr float eps = 1.0f / 1024.0f;
            float* cj = &c[j * d];
            float* cb = &c[big * d];
            for (int64_t t = 0; t < d; ++t) {
                const float s = (t % 2 == 0) ? eps : -eps;
                cj[t] = cb[t] * (1 + s);
                cb[t] = cb[t] * (1 - s);
            }
            counts[j] = counts[big] / 2;
            counts[big] -= counts[j];
            ++res.empty_splits;
        }
        if (p.spherical) normalise_rows();
    }
    if (exponent != 0 && p.spherical) {  // unit centroids at any scale; the objective is a mean <x, c>
        for (double& o : res.objective) o = std::ldexp(o, exponent);
    } else if (exponent != 0) {
        for (float& v : c) v = std::ldexp(v, exponent);
        for (double& o : res.objective) o = std::ldexp(o, 2 * exponent);
    }
    return res;
}

}  // namespace fastdpr

// k-means for IVF coarse centroids and PQ codebooks, plus the dense "many rows against a panel" inner-product
// kernel both of them (and IVF-PQ search) spend their time in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastdpr {

// ||v||^2 as assign_nearest computes its L2 bias (0.5 ||c||^2): code that must give assign_nearest's labels to the
// bit (CoarseGroups with every group probed) uses this one.
inline float sqnorm(const float* v, int64_t d) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t t = 0; t < d; ++t) s += v[t] * v[t];
    return s;
}

// Waking a thread team costs far more than a small loop when the cores are busy (spinning barriers): run small
// steps serially. 2^22 multiply-adds is about a millisecond of one core.
inline bool worth_threads(int64_t work) { return work >= (int64_t{1} << 22); }

// out[i * ny + j] = <x_i, y_j> for x (nx, d) and y (ny, d), both row-major. Multi-threaded over rows of x.
void inner_products(const float* x, int64_t nx, const float* y, int64_t ny, int64_t d, float* out);

// The same product against y packed by pack_columns (the layout the kernel streams). Single-threaded; used inside
// already-parallel loops (a few queries against all centroids, one sub-vector against a codebook).
void inner_products_T(const float* x, int64_t nx, const float* packed, int64_t ny, int64_t d, float* out);

// y (n, d) rearranged for the kernel: tiles of 32 rows of y, each tile stored transposed as (d, 32), the last
// tile zero-padded. packed_size(n, d) floats.
std::vector<float> pack_columns(const float* y, int64_t n, int64_t d);
size_t packed_size(int64_t n, int64_t d);
// The (n, d) rows back from pack_columns' layout.
std::vector<float> unpack_columns(const float* packed, int64_t n, int64_t d);

// Nearest centroid of every row of x. L2: argmin ||x - c||^2 (ties -> lowest index); with max_inner_product:
// argmax <x, c>. dist (nullable) receives ||x - c||^2, or <x, c> for max_inner_product. Multi-threaded.
void assign_nearest(const float* x, int64_t n, const float* centroids, int64_t k, int64_t d, bool max_inner_product,
                    int64_t* labels, float* dist);

// The power of two 2^e that brings the largest finite |v| of v[0, n) into [0.5, 1) by v * 2^-e, or e = 0 when that
// magnitude lies in [2^-30, 2^30] already: there d (<= 2^20) squared differences or products of two such vectors
// stay far inside float32's normal range, where outside it they overflow (|v| ~ 1e19) or fall below it (~ 1e-20).
// Scaling both sides of a comparison by one power of two is exact and changes no ranking.
int magnitude_exponent(const float* v, int64_t n);
int exponent_of(float top);  // the same for one known magnitude

struct KMeansParams {
    int64_t k = 256;
    int niter = 20;
    uint64_t seed = 1234;
    // Spherical k-means (for inner-product data): centroids are kept at unit norm and points go to the centroid of
    // largest inner product.
    bool spherical = false;
    // Training sets larger than k * max_points_per_centroid are subsampled (seeded) to that size: more points
    // barely move the centroids and cost time linearly.
    int64_t max_points_per_centroid = 256;
    // Greedy k-means++ seeding (on a subsample of max(4 k, 2048) points); otherwise k distinct random points.
    bool kmeanspp = true;
    // Balanced clusters: after each update but the last, a cluster holding fewer than balance x (mean cluster size)
    // points is re-seeded by splitting the largest one (0: only empty clusters are). For inner-product search
    // over lists probed in order of <q, c>, lists of even size rank their members more evenly (measured in
    // fastdpr/index/ivfpq.py's docstring).
    double balance = 0;
};

struct KMeansResult {
    std::vector<float> centroids;  // (k, d)
    std::vector<double> objective;  // per iteration: mean squared distance (L2) or mean inner product (spherical)
    int64_t n_train = 0;            // points actually used after subsampling
    int64_t empty_splits = 0;       // empty (or, with balance, undersized) clusters re-seeded by splitting
};

// Throws std::invalid_argument (with the numbers in the message) when n < k or a size is not positive.
KMeansResult kmeans(const float* x, int64_t n, int64_t d, const KMeansParams& params);

}  // namespace fastdpr

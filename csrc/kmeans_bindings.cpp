// Python bindings of k-means and the panel inner-product kernel (IVF centroids, PQ codebooks), and of the coarse
// quantizers for many lists (csrc/coarse.h; for tests and measurements: IVFPQ uses them past thresholds too large
// for a test).
#include <algorithm>

#include "bind.h"
#include "coarse.h"
#include "kmeans.h"
#include "bounds.h"

namespace fastdpr::bind {

void bind_kmeans(py::module_& m) {
    m.def(
        "kmeans",
        [](const FloatArray& x, py::handle k_arg, py::handle niter, py::handle seed, bool spherical,
           py::handle max_points_per_centroid, bool kmeanspp, double balance) {
            if (x.ndim() != 2) throw std::invalid_argument("kmeans: x must be a 2-D array");
            const int64_t n = x.shape(0), d = x.shape(1);
            KMeansParams p;
            p.k = arg_int(k_arg, "k", 1);
            p.niter = static_cast<int>(arg_int(niter, "niter", 1, 1 << 20));
            p.seed = static_cast<uint64_t>(arg_int(seed, "seed"));
            p.spherical = spherical;
            p.max_points_per_centroid = arg_int(max_points_per_centroid, "max_points_per_centroid", 1, 1 << 30);
            p.kmeanspp = kmeanspp;
            p.balance = balance;
            if (p.k > n)  // before the (k, d) result is allocated
                throw std::invalid_argument("k-means: need at least k=" + std::to_string(p.k) +
                                            " training points, got " + std::to_string(n));
            KMeansResult r;
            {
                py::gil_scoped_release release;
                r = kmeans(x.data(), n, d, p);
            }
            py::array_t<float> c({static_cast<py::ssize_t>(p.k), static_cast<py::ssize_t>(d)});
            std::copy(r.centroids.begin(), r.centroids.end(), c.mutable_data());
            py::dict info;
            info["objective"] = r.objective;
            info["n_train"] = r.n_train;
            info["empty_splits"] = r.empty_splits;
            return py::make_tuple(c, info);
        },
        py::arg("x"), py::arg("k"), py::arg("niter") = 20, py::arg("seed") = 1234, py::arg("spherical") = false,
        py::arg("max_points_per_centroid") = 256, py::arg("kmeanspp") = true, py::arg("balance") = 0.0,
        "k-means (Lloyd, k-means++ seeding, empty-cluster splitting; balance: clusters under balance x the mean "
        "size are split off the largest too): (centroids (k, d), info dict)");
    m.def(
        "two_level_kmeans",
        [](const FloatArray& x, py::handle k_arg, py::handle groups, py::handle niter, py::handle seed, bool spherical,
           py::handle max_points_per_centroid, double balance) {
            if (x.ndim() != 2) throw std::invalid_argument("two_level_kmeans: x must be a 2-D array");
            const int64_t n = x.shape(0), d = x.shape(1);
            KMeansParams p;
            p.k = arg_int(k_arg, "k", 1);
            const int64_t g = arg_int(groups, "groups", std::numeric_limits<int64_t>::min());
            p.niter = static_cast<int>(arg_int(niter, "niter", 1, 1 << 20));
            p.seed = static_cast<uint64_t>(arg_int(seed, "seed"));
            p.spherical = spherical;
            p.max_points_per_centroid = arg_int(max_points_per_centroid, "max_points_per_centroid", 1, 1 << 30);
            p.balance = balance;
            if (p.k > n)  // before the (k, d) result is allocated
                throw std::invalid_argument("k-means: need at least k=" + std::to_string(p.k) +
                                            " training points, got " + std::to_string(n));
            std::vector<float> c;
            {
                py::gil_scoped_release release;
                c = two_level_kmeans(x.data(), n, d, p, g);
            }
            py::array_t<float> out({static_cast<py::ssize_t>(p.k), static_cast<py::ssize_t>(d)});
            std::copy(c.begin(), c.end(), out.mutable_data());
            return out;
        },
        py::arg("x"), py::arg("k"), py::arg("groups"), py::arg("niter") = 20, py::arg("seed") = 1234,
        py::arg("spherical") = false, py::arg("max_points_per_centroid") = 256, py::arg("balance") = 0.0,
        "k-means in two levels (csrc/coarse.h): centroids (k, d)");
    m.def(
        "coarse_split",
        [](const Int64Array& counts, py::handle k) {
            std::vector<int64_t> c(counts.data(), counts.data() + counts.size());
            return split_children(c, arg_int(k, "k", 0));
        },
        py::arg("counts"), py::arg("k"), "children per group for k centroids (two_level_kmeans' split)");
    m.def(
        "assign_nearest",
        [](const FloatArray& centroids, const FloatArray& x, bool max_inner_product) {
            if (centroids.ndim() != 2 || centroids.shape(0) < 1)
                throw std::invalid_argument("assign_nearest: centroids must be a non-empty 2-D array");
            const int64_t k = centroids.shape(0), d = centroids.shape(1);
            auto [n, xp] = rows_of(x, static_cast<size_t>(d), "assign_nearest rows");
            py::array_t<int64_t> labels(static_cast<py::ssize_t>(n));
            int64_t* lp = labels.mutable_data();
            {
                py::gil_scoped_release release;
                assign_nearest(xp, static_cast<int64_t>(n), centroids.data(), k, d, max_inner_product, lp, nullptr);
            }
            return labels;
        },
        py::arg("centroids"), py::arg("x"), py::arg("max_inner_product") = false,
        "each row's nearest centroid against all of them (L2, or the largest inner product)");
    m.def(
        "coarse_assign",
        [](const FloatArray& centroids, const FloatArray& x, py::handle probe, bool max_inner_product) {
            if (centroids.ndim() != 2 || centroids.shape(0) < 1)
                throw std::invalid_argument("coarse_assign: centroids must be a non-empty 2-D array");
            const int64_t nlist = centroids.shape(0), d = centroids.shape(1);
            auto [n, xp] = rows_of(x, static_cast<size_t>(d), "coarse_assign rows");
            const int64_t pr = arg_int(probe, "probe", 1);
            py::array_t<int64_t> labels(static_cast<py::ssize_t>(n));
            int64_t* lp = labels.mutable_data();
            int64_t groups = 0;
            {
                py::gil_scoped_release release;
                const CoarseGroups cg(centroids.data(), nlist, d);
                cg.assign(xp, static_cast<int64_t>(n), pr, max_inner_product, lp);
                groups = cg.groups();
            }
            return py::make_tuple(labels, groups);
        },
        py::arg("centroids"), py::arg("x"), py::arg("probe"), py::arg("max_inner_product") = false,
        "(labels, groups): each row's centroid through CoarseGroups (csrc/coarse.h) probing `probe` groups");
    m.def(
        "inner_products",
        [](const FloatArray& x, const FloatArray& y) {
            if (x.ndim() != 2 || y.ndim() != 2 || x.shape(1) != y.shape(1))
                throw std::invalid_argument("inner_products: x (n, d) and y (m, d) must share d");
            checked_mul(static_cast<size_t>(x.shape(0)), static_cast<size_t>(y.shape(0)), "inner_products",
                        static_cast<size_t>(PY_SSIZE_T_MAX / sizeof(float)));
            py::array_t<float> out({x.shape(0), y.shape(0)});
            float* o = out.mutable_data();
            {
                py::gil_scoped_release release;
                inner_products(x.data(), x.shape(0), y.data(), y.shape(0), x.shape(1), o);
            }
            return out;
        },
        py::arg("x"), py::arg("y"), "x @ y.T with the k-means / IVF panel kernel");
}

}  // namespace fastdpr::bind

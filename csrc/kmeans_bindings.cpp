// Python bindings of k-means and the panel inner-product kernel (IVF centroids, PQ codebooks).
#include <algorithm>

#include "bind.h"
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

// The only pybind11 translation unit: numpy in, numpy out, shapes checked here, GIL released around work.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "flat.h"
#include "hnsw.h"
#include "io.h"
#include "ivfpq.h"
#include "kmeans.h"
#include "simd.h"

namespace py = pybind11;
using namespace fastdpr;

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using U16Array = py::array_t<uint16_t, py::array::c_style | py::array::forcecast>;

// (n, d) float32 rows with the expected d; 1-D arrays are one row.
std::pair<size_t, const float*> rows_of(const FloatArray& a, size_t dim, const char* what) {
    if (a.ndim() == 1) {
        if (static_cast<size_t>(a.shape(0)) != dim)
            throw std::invalid_argument(std::string(what) + ": dimension " + std::to_string(a.shape(0)) +
                                        " != index dimension " + std::to_string(dim));
        return {1, a.data()};
    }
    if (a.ndim() != 2) throw std::invalid_argument(std::string(what) + " must be a 2-D array");
    if (static_cast<size_t>(a.shape(1)) != dim)
        throw std::invalid_argument(std::string(what) + ": dimension " + std::to_string(a.shape(1)) +
                                    " != index dimension " + std::to_string(dim));
    return {static_cast<size_t>(a.shape(0)), a.data()};
}

void check_k(int64_t k) {
    if (k < 1) throw std::invalid_argument("k must be >= 1, got " + std::to_string(k));
}

simd::Level parse_level(const std::string& name) {
    if (name == "scalar") return simd::Level::Scalar;
    if (name == "avx2") return simd::Level::AVX2;
    if (name == "avx512") return simd::Level::AVX512;
    throw std::invalid_argument("unknown SIMD level '" + name + "' (scalar, avx2, avx512)");
}

const simd::Kernels& kernels_for(const std::string& level) {
    return level.empty() ? simd::kernels() : simd::kernels_at(parse_level(level));
}

// A numpy view of a file section that keeps the file mapping alive.
py::array section_view(const io::Reader& r, const std::string& name) {
    const io::Section s = r.section(name);
    auto holder = new std::shared_ptr<io::Mapping>(r.mapping());
    py::capsule owner(holder, [](void* p) { delete static_cast<std::shared_ptr<io::Mapping>*>(p); });
    py::array view(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(s.length)}, {1}, s.data, owner);
    view.attr("setflags")(py::arg("write") = false);  // the mapping is PROT_READ
    return view;
}

template <class Index>
py::tuple search_into(const Index& index, const FloatArray& q, int64_t k, const std::function<void(const float*, size_t, float*, int64_t*)>& run) {
    check_k(k);
    auto [nq, qp] = rows_of(q, index.dim(), "queries");
    py::array_t<float> scores({static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)});
    py::array_t<int64_t> ids({static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)});
    float* sp = scores.mutable_data();
    int64_t* ip = ids.mutable_data();
    {
        py::gil_scoped_release release;
        run(qp, nq, sp, ip);
    }
    return py::make_tuple(scores, ids);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "fastdpr compiled core: maximum-inner-product indexes";
#ifdef FASTDPR_OPENMP
    m.attr("has_openmp") = true;
#else
    m.attr("has_openmp") = false;
#endif

    // ---- flat / hnsw / common begin ----
    static py::exception<io::FormatError> format_error(m, "FormatError", PyExc_ValueError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const io::FormatError& e) {
            PyErr_SetString(format_error.ptr(), e.what());
        }
    });

    // -- SIMD ---------------------------------------------------------------------------------------------------
    m.def("simd_level", []() { return std::string(simd::level_name()); }, "The SIMD level in use.");
    m.def("simd_detect", []() { return std::string(simd::level_name(simd::detect())); },
          "The widest SIMD level this CPU supports.");
    m.def("simd_supported", [](const std::string& level) { return simd::supported(parse_level(level)); });
    m.def("simd_force", [](const std::string& level) { simd::force_level(parse_level(level)); },
          "Use this SIMD level process-wide (tests, benchmarks).");
    m.def(
        "simd_dot",
        [](const FloatArray& a, const FloatArray& b, const std::string& level) {
            if (a.size() != b.size()) throw std::invalid_argument("simd_dot: lengths differ");
            return kernels_for(level).dot(a.data(), b.data(), static_cast<size_t>(a.size()));
        },
        py::arg("a"), py::arg("b"), py::arg("level") = "");
    m.def(
        "simd_dot_f16",
        [](const FloatArray& a, const U16Array& b, const std::string& level) {
            if (a.size() != b.size()) throw std::invalid_argument("simd_dot_f16: lengths differ");
            return kernels_for(level).dot_f16(a.data(), b.data(), static_cast<size_t>(a.size()));
        },
        py::arg("a"), py::arg("b_half_bits"), py::arg("level") = "");
    m.def(
        "simd_l2sq",
        [](const FloatArray& a, const FloatArray& b, const std::string& level) {
            if (a.size() != b.size()) throw std::invalid_argument("simd_l2sq: lengths differ");
            return kernels_for(level).l2sq(a.data(), b.data(), static_cast<size_t>(a.size()));
        },
        py::arg("a"), py::arg("b"), py::arg("level") = "");
    m.def(
        "simd_dot4x4",
        [](const FloatArray& q, const FloatArray& x, const std::string& level) {
            if (q.ndim() != 2 || x.ndim() != 2 || q.shape(0) != 4 || x.shape(0) != 4 || q.shape(1) != x.shape(1))
                throw std::invalid_argument("simd_dot4x4: needs two (4, d) arrays");
            const size_t d = static_cast<size_t>(q.shape(1));
            py::array_t<float> out({4, 4});
            kernels_for(level).dot4x4(q.data(), d, x.data(), d, d, out.mutable_data(), 4);
            return out;
        },
        py::arg("q"), py::arg("x"), py::arg("level") = "");
    m.def(
        "to_half",
        [](const FloatArray& a, const std::string& level) {
            py::array_t<uint16_t> out(a.request().shape);
            kernels_for(level).to_half(a.data(), out.mutable_data(), static_cast<size_t>(a.size()));
            return out;
        },
        py::arg("a"), py::arg("level") = "", "fp32 -> IEEE half bit patterns (uint16).");
    m.def(
        "from_half",
        [](const U16Array& a, const std::string& level) {
            py::array_t<float> out(a.request().shape);
            kernels_for(level).from_half(a.data(), out.mutable_data(), static_cast<size_t>(a.size()));
            return out;
        },
        py::arg("a"), py::arg("level") = "");

    // -- file format ------------------------------------------------------------------------------------------
    m.def("crc32", [](py::buffer b) {
        py::buffer_info info = b.request();
        return io::crc32(info.ptr, static_cast<size_t>(info.size * info.itemsize));
    });
    m.def("peek_type", &io::peek_type);
    py::class_<io::Writer>(m, "FileWriter")
        .def(py::init<std::string, std::string>(), py::arg("path"), py::arg("type"))
        .def("add",
             [](io::Writer& w, const std::string& name, py::array_t<uint8_t, py::array::c_style> data) {
                 w.add(name, data.data(), static_cast<size_t>(data.size()));
             })
        .def("meta", [](io::Writer& w, const std::string& k, const std::string& v) { w.meta(k, v); })
        .def("commit", [](io::Writer& w) {
            py::gil_scoped_release release;
            w.commit();
        });
    py::class_<io::Reader, std::shared_ptr<io::Reader>>(m, "FileReader")
        .def(py::init([](const std::string& path, bool verify) {
                 py::gil_scoped_release release;
                 return std::make_shared<io::Reader>(path, verify);
             }),
             py::arg("path"), py::arg("verify") = true)
        .def_property_readonly("type", &io::Reader::type)
        .def_property_readonly("path", &io::Reader::path)
        .def("has", &io::Reader::has)
        .def("names", &io::Reader::names)
        .def("section", &section_view)
        .def("has_meta", &io::Reader::has_meta)
        .def("meta", [](const io::Reader& r, const std::string& k) { return r.meta(k); });

    // -- Flat ---------------------------------------------------------------------------------------------------
    py::class_<FlatIndex>(m, "FlatIndex")
        .def(py::init([](size_t dim, const std::string& storage) {
                 if (dim == 0) throw std::invalid_argument("dimension must be >= 1");
                 return std::make_unique<FlatIndex>(dim, parse_storage(storage));
             }),
             py::arg("dim"), py::arg("storage") = "fp32")
        .def_property_readonly("dim", &FlatIndex::dim)
        .def_property_readonly("storage", [](const FlatIndex& f) { return std::string(storage_name(f.storage())); })
        .def("__len__", &FlatIndex::size)
        .def("add",
             [](FlatIndex& f, const FloatArray& x) {
                 auto [n, p] = rows_of(x, f.dim(), "vectors");
                 py::gil_scoped_release release;
                 f.add(p, n);
             })
        .def(
            "search",
            [](const FlatIndex& f, const FloatArray& q, int64_t k, int threads) {
                return search_into(f, q, k, [&](const float* qp, size_t nq, float* sp, int64_t* ip) {
                    f.search(qp, nq, static_cast<size_t>(k), sp, ip, threads);
                });
            },
            py::arg("queries"), py::arg("k"), py::arg("threads") = 0)
        .def("save", [](const FlatIndex& f, io::Writer& w) { f.save(w); })
        .def_static(
            "load", [](const io::Reader& r, bool mmap) { return FlatIndex::load(r, mmap); }, py::arg("reader"),
            py::arg("mmap") = false);

    // -- HNSW -------------------------------------------------------------------------------------------------
    py::class_<HNSWIndex>(m, "HNSWIndex")
        .def(py::init([](size_t dim, size_t M, size_t efc, size_t ef, const std::string& graph,
                         const std::string& storage, double phi, size_t entry_points, uint64_t seed) {
                 if (dim == 0) throw std::invalid_argument("dimension must be >= 1");
                 if (!std::isfinite(phi) || phi < 0) throw std::invalid_argument("phi must be a finite number >= 0");
                 HNSWParams p;
                 p.M = M;
                 p.ef_construction = efc;
                 p.ef_search = ef;
                 p.graph = parse_graph(graph);
                 p.storage = parse_storage(storage);
                 p.phi = phi;
                 p.entry_points = entry_points;
                 p.seed = seed;
                 return std::make_unique<HNSWIndex>(dim, p);
             }),
             py::arg("dim"), py::arg("M") = 32, py::arg("ef_construction") = 200, py::arg("ef_search") = 128,
             py::arg("graph") = "ip", py::arg("storage") = "fp32", py::arg("phi") = 0.0, py::arg("entry_points") = 1,
             py::arg("seed") = 12345)
        .def_property_readonly("dim", &HNSWIndex::dim)
        .def_property_readonly("phi", &HNSWIndex::phi)
        .def_property_readonly("max_level", &HNSWIndex::max_level)
        .def_property_readonly("M", [](const HNSWIndex& h) { return h.params().M; })
        .def_property_readonly("ef_construction", [](const HNSWIndex& h) { return h.params().ef_construction; })
        .def_property_readonly("ef_search", [](const HNSWIndex& h) { return h.params().ef_search; })
        .def_property_readonly("entry_points", [](const HNSWIndex& h) { return h.params().entry_points; })
        .def_property_readonly("graph", [](const HNSWIndex& h) { return std::string(graph_name(h.params().graph)); })
        .def_property_readonly("storage",
                               [](const HNSWIndex& h) { return std::string(storage_name(h.params().storage)); })
        .def("__len__", &HNSWIndex::size)
        .def(
            "add",
            [](HNSWIndex& h, const FloatArray& x, int threads) {
                auto [n, p] = rows_of(x, h.dim(), "vectors");
                py::gil_scoped_release release;
                h.add(p, n, threads);
            },
            py::arg("vectors"), py::arg("threads") = 0)
        .def(
            "search",
            [](const HNSWIndex& h, const FloatArray& q, int64_t k, int64_t ef, int threads, int64_t entry_points) {
                if (ef < 0 || entry_points < 0) throw std::invalid_argument("ef and entry_points must be >= 0");
                return search_into(h, q, k, [&](const float* qp, size_t nq, float* sp, int64_t* ip) {
                    h.search(qp, nq, static_cast<size_t>(k), static_cast<size_t>(ef), sp, ip, threads,
                             static_cast<size_t>(entry_points));
                });
            },
            py::arg("queries"), py::arg("k"), py::arg("ef") = 0, py::arg("threads") = 0, py::arg("entry_points") = 0)
        .def("mean_degree", &HNSWIndex::mean_degree)
        .def("reachable", &HNSWIndex::reachable)
        .def("save", [](const HNSWIndex& h, io::Writer& w) { h.save(w); })
        .def_static(
            "load",
            [](const io::Reader& r, bool mmap) {
                py::gil_scoped_release release;
                return HNSWIndex::load(r, mmap);
            },
            py::arg("reader"), py::arg("mmap") = false);
    // ---- flat / hnsw / common end ----

    // ---- IVF-PQ begin ----
    {
        auto storage_of = [](const std::string& s) {
            if (s == "none") return VectorStorage::None;
            if (s == "fp16") return VectorStorage::F16;
            if (s == "fp32") return VectorStorage::F32;
            throw std::invalid_argument("ivfpq: store must be 'none', 'fp16' or 'fp32', got '" + s + "'");
        };
        auto storage_label = [](VectorStorage s) -> std::string {
            return s == VectorStorage::F16 ? "fp16" : s == VectorStorage::F32 ? "fp32" : "none";
        };
        auto ivf_rows = [](const FloatArray& a, const IVFPQ& s, const char* what) {
            return rows_of(a, static_cast<size_t>(s.dim()), what);
        };

        py::class_<IVFPQ>(m, "IVFPQ", "IVF with residual product quantization for inner product (see ivfpq.h)")
            .def(py::init([storage_of](int64_t dim, int64_t nlist, int64_t msub, int nbits, const std::string& store,
                                       bool assign_by_ip) {
                     return std::make_unique<IVFPQ>(dim, nlist, msub, nbits, storage_of(store), assign_by_ip);
                 }),
                 py::arg("dim"), py::arg("nlist"), py::arg("m"), py::arg("nbits") = 8, py::arg("store") = "none",
                 py::arg("assign_by_ip") = false)
            .def_property_readonly("dim", &IVFPQ::dim)
            .def_property_readonly("nlist", &IVFPQ::nlist)
            .def_property_readonly("m", &IVFPQ::m)
            .def_property_readonly("dsub", &IVFPQ::dsub)
            .def_property_readonly("nbits", &IVFPQ::nbits)
            .def_property_readonly("is_trained", &IVFPQ::is_trained)
            .def_property_readonly("assign_by_ip", &IVFPQ::assign_by_ip)
            .def_property_readonly("store", [storage_label](const IVFPQ& s) { return storage_label(s.storage()); })
            .def_property_readonly("vectors_mapped", &IVFPQ::vectors_mapped)
            .def("__len__", &IVFPQ::size)
            .def("memory_bytes", &IVFPQ::memory_bytes)
            .def(
                "train",
                [ivf_rows](IVFPQ& s, const FloatArray& x, int niter, int pq_niter, uint64_t seed,
                           int64_t max_points_per_centroid, int64_t pq_max_points_per_centroid, bool spherical) {
                    auto [n, xp] = ivf_rows(x, s, "training vectors");
                    IVFPQTrainParams p;
                    p.niter = niter;
                    p.pq_niter = pq_niter;
                    p.seed = seed;
                    p.max_points_per_centroid = max_points_per_centroid;
                    p.pq_max_points_per_centroid = pq_max_points_per_centroid;
                    p.spherical = spherical;
                    py::gil_scoped_release release;
                    s.train(xp, static_cast<int64_t>(n), p);
                },
                py::arg("x"), py::arg("niter") = 20, py::arg("pq_niter") = 20, py::arg("seed") = 1234,
                py::arg("max_points_per_centroid") = 64, py::arg("pq_max_points_per_centroid") = 256,
                py::arg("spherical") = false)
            .def(
                "set_trained",
                [](IVFPQ& s, const FloatArray& centroids, const FloatArray& codebooks) {
                    if (centroids.size() != s.nlist() * s.dim() ||
                        codebooks.size() != s.m() * IVFPQ::kKsub * s.dsub())
                        throw std::invalid_argument("ivfpq: centroids must be (nlist, dim), codebooks (m, 256, dim/m)");
                    s.set_trained(centroids.data(), codebooks.data());
                },
                py::arg("centroids"), py::arg("codebooks"))
            .def(
                "add",
                [ivf_rows](IVFPQ& s, const FloatArray& x) {
                    auto [n, xp] = ivf_rows(x, s, "vectors");
                    py::gil_scoped_release release;
                    s.add(xp, static_cast<int64_t>(n));
                },
                py::arg("x"))
            .def(
                "encode",
                [ivf_rows](const IVFPQ& s, const FloatArray& x) {
                    auto [n, xp] = ivf_rows(x, s, "vectors");
                    const auto rows = static_cast<py::ssize_t>(n);
                    py::array_t<int64_t> lists(rows);
                    py::array_t<uint8_t> codes({rows, static_cast<py::ssize_t>(s.m())});
                    int64_t* lp = lists.mutable_data();
                    uint8_t* cp = codes.mutable_data();
                    {
                        py::gil_scoped_release release;
                        s.encode(xp, static_cast<int64_t>(n), lp, cp);
                    }
                    return py::make_tuple(lists, codes);
                },
                py::arg("x"), "(list of each row, its m codes) without adding anything")
            .def(
                "search",
                [](const IVFPQ& s, const FloatArray& q, int64_t k, int64_t nprobe, int64_t rerank, int threads) {
                    return search_into(s, q, k, [&](const float* qp, size_t nq, float* sp, int64_t* ip) {
                        s.search(qp, static_cast<int64_t>(nq), k, nprobe, rerank, sp, ip, threads);
                    });
                },
                py::arg("queries"), py::arg("k"), py::arg("nprobe") = 16, py::arg("rerank") = 0,
                py::arg("threads") = 0)
            .def("centroids",
                 [](const IVFPQ& s) {
                     py::array_t<float> a({static_cast<py::ssize_t>(s.nlist()), static_cast<py::ssize_t>(s.dim())});
                     if (s.is_trained()) std::copy(s.centroids().begin(), s.centroids().end(), a.mutable_data());
                     return a;
                 })
            .def("codebooks",
                 [](const IVFPQ& s) {
                     py::array_t<float> a({static_cast<py::ssize_t>(s.m()), static_cast<py::ssize_t>(IVFPQ::kKsub),
                                           static_cast<py::ssize_t>(s.dsub())});
                     if (s.is_trained()) std::copy(s.codebooks().begin(), s.codebooks().end(), a.mutable_data());
                     return a;
                 })
            .def(
                "list_codes",
                [](const IVFPQ& s, int64_t l) {
                    if (l < 0 || l >= s.nlist()) throw py::index_error("ivfpq: list index out of range");
                    const auto& c = s.list_codes(l);
                    py::array_t<uint8_t> a({static_cast<py::ssize_t>(s.list_size(l)), static_cast<py::ssize_t>(s.m())});
                    std::copy(c.begin(), c.end(), a.mutable_data());
                    return a;
                },
                py::arg("list"))
            .def(
                "list_positions",
                [](const IVFPQ& s, int64_t l) {
                    if (l < 0 || l >= s.nlist()) throw py::index_error("ivfpq: list index out of range");
                    const auto& p = s.list_positions(l);
                    py::array_t<int64_t> a(static_cast<py::ssize_t>(s.list_size(l)));
                    std::copy(p.begin(), p.end(), a.mutable_data());
                    return a;
                },
                py::arg("list"))
            .def("vectors",
                 [](const IVFPQ& s) -> py::object {
                     if (s.storage() == VectorStorage::None) return py::none();
                     const auto n = static_cast<py::ssize_t>(s.size()), d = static_cast<py::ssize_t>(s.dim());
                     const size_t bytes = static_cast<size_t>(n) * s.vector_bytes();
                     if (s.storage() == VectorStorage::F32) {
                         py::array_t<float> a({n, d});
                         if (n) std::memcpy(a.mutable_data(), s.vectors(), bytes);
                         return std::move(a);
                     }
                     py::array_t<uint16_t> a({n, d});  // IEEE half bits: .view(np.float16) in Python
                     if (n) std::memcpy(a.mutable_data(), s.vectors(), bytes);
                     return std::move(a);
                 })
            .def("save", [](const IVFPQ& s, io::Writer& w) { s.save(w); }, py::arg("writer"))
            .def_static(
                "load", [](const io::Reader& r, bool mmap) { return IVFPQ::load(r, mmap); }, py::arg("reader"),
                py::arg("mmap") = false);

        m.def(
            "kmeans",
            [](const FloatArray& x, int64_t k, int niter, uint64_t seed, bool spherical,
               int64_t max_points_per_centroid, bool kmeanspp) {
                if (x.ndim() != 2) throw std::invalid_argument("kmeans: x must be a 2-D array");
                const int64_t n = x.shape(0), d = x.shape(1);
                KMeansParams p;
                p.k = k;
                p.niter = niter;
                p.seed = seed;
                p.spherical = spherical;
                p.max_points_per_centroid = max_points_per_centroid;
                p.kmeanspp = kmeanspp;
                KMeansResult r;
                {
                    py::gil_scoped_release release;
                    r = kmeans(x.data(), n, d, p);
                }
                py::array_t<float> c({static_cast<py::ssize_t>(k), static_cast<py::ssize_t>(d)});
                std::copy(r.centroids.begin(), r.centroids.end(), c.mutable_data());
                py::dict info;
                info["objective"] = r.objective;
                info["n_train"] = r.n_train;
                info["empty_splits"] = r.empty_splits;
                return py::make_tuple(c, info);
            },
            py::arg("x"), py::arg("k"), py::arg("niter") = 20, py::arg("seed") = 1234, py::arg("spherical") = false,
            py::arg("max_points_per_centroid") = 256, py::arg("kmeanspp") = true,
            "k-means (Lloyd, k-means++ seeding, empty-cluster splitting): (centroids (k, d), info dict)");
        m.def(
            "inner_products",
            [](const FloatArray& x, const FloatArray& y) {
                if (x.ndim() != 2 || y.ndim() != 2 || x.shape(1) != y.shape(1))
                    throw std::invalid_argument("inner_products: x (n, d) and y (m, d) must share d");
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
    // ---- IVF-PQ end ----
}

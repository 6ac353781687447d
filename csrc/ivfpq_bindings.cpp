// Python bindings of IVF-PQ.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "bind.h"
#include "ivfpq.h"
#include "sq4.h"
#include "bounds.h"
#include "pq4.h"

namespace fastdpr::bind {

void bind_ivfpq_stages(py::module_& m);  // ivfpq_stage_bindings.cpp

namespace {

VectorStorage storage_of(const std::string& s) {
    if (s == "none") return VectorStorage::None;
    if (s == "fp16") return VectorStorage::F16;
    if (s == "fp32") return VectorStorage::F32;
    throw std::invalid_argument("ivfpq: store must be 'none', 'fp16' or 'fp32', got '" + s + "'");
}

std::string storage_label(VectorStorage s) {
    return s == VectorStorage::F16 ? "fp16" : s == VectorStorage::F32 ? "fp32" : "none";
}

int64_t list_index(const IVFPQ& s, py::handle l) {
    const int64_t v = arg_int(l, "list", std::numeric_limits<int64_t>::min());
    if (v < 0 || v >= s.nlist()) throw py::index_error("ivfpq: list index out of range");
    return v;
}

}  // namespace

void bind_ivfpq(py::module_& m) {
    py::class_<IVFPQ>(m, "IVFPQ", "IVF with residual product quantization for inner product (see ivfpq.h)")
        .def(py::init([](py::handle dim, py::handle nlist, py::handle msub, py::handle nbits, const std::string& store,
                         bool assign_by_ip) {
                 return std::make_unique<IVFPQ>(arg_int(dim, "dim", 1, kMaxDim), arg_int(nlist, "nlist", 1, kMaxNlist),
                                                arg_int(msub, "m", 1, kMaxDim),
                                                static_cast<int>(arg_int(nbits, "nbits", 1, 64)), storage_of(store),
                                                assign_by_ip);
             }),
             py::arg("dim"), py::arg("nlist"), py::arg("m"), py::arg("nbits") = 8, py::arg("store") = "none",
             py::arg("assign_by_ip") = false)
        .def_property_readonly("dim", &IVFPQ::dim)
        .def_property_readonly("nlist", &IVFPQ::nlist)
        .def_property_readonly("m", &IVFPQ::m)
        .def_property_readonly("dsub", &IVFPQ::dsub)
        .def_property_readonly("nbits", &IVFPQ::nbits)
        .def_property("aniso_eta", &IVFPQ::aniso_eta, &IVFPQ::set_aniso_eta,
                      "4-bit codes: weight of the error parallel to a vector when its codes are chosen (1: none)")
        .def_property_readonly("is_trained", &IVFPQ::is_trained)
        .def_property_readonly("assign_by_ip", &IVFPQ::assign_by_ip)
        .def_property_readonly("store", [](const IVFPQ& s) { return storage_label(s.storage()); })
        .def_property_readonly("vectors_mapped", &IVFPQ::vectors_mapped)
        .def_property("sq", &IVFPQ::sq_bits, &IVFPQ::set_sq,
                      "4: every vector also kept as a 4-bit row for a first re-rank (csrc/sq4.h); 0: none")
        .def("sq_rows",
             [](const IVFPQ& s) -> py::object {
                 if (!s.sq_bits() || !s.sq_rows()) return py::none();
                 const size_t rb = sq4::row_bytes(s.dim());
                 py::array_t<uint8_t> a({static_cast<py::ssize_t>(s.size()), static_cast<py::ssize_t>(rb)});
                 if (s.size()) std::memcpy(a.mutable_data(), s.sq_rows(), static_cast<size_t>(s.size()) * rb);
                 return std::move(a);
             }, "(n, ceil(dim / 2)) 4-bit rows, or None")
        .def("sq_ranges",
             [](const IVFPQ& s) -> py::object {
                 if (s.sq_lo().empty()) return py::none();
                 return py::make_tuple(py::array_t<float>(s.sq_lo().size(), s.sq_lo().data()),
                                       py::array_t<float>(s.sq_step().size(), s.sq_step().data()));
             }, "(lo, step) of the 4-bit rows, or None before they are known")
        .def("__len__", &IVFPQ::size)
        .def("memory_bytes", &IVFPQ::memory_bytes)
        .def(
            "train",
            [](IVFPQ& s, const FloatArray& x, py::handle niter, py::handle pq_niter, py::handle seed,
               py::handle max_points_per_centroid, py::handle pq_max_points_per_centroid, bool spherical,
               double balance, py::handle groups) {
                auto [n, xp] = rows_of(x, static_cast<size_t>(s.dim()), "training vectors");
                IVFPQTrainParams p;
                p.niter = static_cast<int>(arg_int(niter, "niter", 1, 1 << 20));
                p.pq_niter = static_cast<int>(arg_int(pq_niter, "pq_niter", 1, 1 << 20));
                p.seed = static_cast<uint64_t>(arg_int(seed, "seed"));
                p.max_points_per_centroid = arg_int(max_points_per_centroid, "max_points_per_centroid", 1, 1 << 30);
                p.pq_max_points_per_centroid =
                    arg_int(pq_max_points_per_centroid, "pq_max_points_per_centroid", 1, 1 << 30);
                p.spherical = spherical;
                p.balance = balance;
                p.groups = arg_int(groups, "groups", 0);  // <= nlist: train() says so, naming nlist
                py::gil_scoped_release release;
                s.train(xp, static_cast<int64_t>(n), p);
            },
            py::arg("x"), py::arg("niter") = 20, py::arg("pq_niter") = 20, py::arg("seed") = 1234,
            py::arg("max_points_per_centroid") = 64, py::arg("pq_max_points_per_centroid") = 256,
            py::arg("spherical") = false, py::arg("balance") = 0.0, py::arg("groups") = 0,
            "groups > 0: the coarse centroids by two-level k-means with that many top-level groups (csrc/coarse.h)")
        .def(
            "set_trained",
            [](IVFPQ& s, const FloatArray& centroids, const FloatArray& codebooks) {
                if (centroids.size() != s.nlist() * s.dim() || codebooks.size() != s.m() * s.ksub() * s.dsub())
                    throw std::invalid_argument("ivfpq: centroids must be (nlist, dim), codebooks (m, " +
                                                std::to_string(s.ksub()) + ", dim/m)");
                s.set_trained(centroids.data(), codebooks.data());
            },
            py::arg("centroids"), py::arg("codebooks"))
        .def(
            "add",
            [](IVFPQ& s, py::handle x) {
                InputRows rows(x, static_cast<size_t>(s.dim()), "vectors");
                py::gil_scoped_release release;
                rows.for_blocks([&](const float* p, size_t n) { s.add(p, static_cast<int64_t>(n)); });
            },
            py::arg("x"))
        .def(
            "reserve", [](IVFPQ& s, py::handle n) { s.reserve(arg_int(n, "n", 0)); }, py::arg("n"),
            "room for the rows of n vectors in all, so that adding up to n never moves them")
        .def(
            "encode",
            [](const IVFPQ& s, const FloatArray& x) {
                auto [n, xp] = rows_of(x, static_cast<size_t>(s.dim()), "vectors");
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
            [](const IVFPQ& s, py::handle q, py::handle k, py::handle nprobe, py::handle rerank,
               py::handle threads, double spread, py::handle exact) {
                const int64_t np_ = arg_int(nprobe, "nprobe", 1);
                const int64_t rr = arg_int(rerank, "rerank", 0);
                const int nt = arg_threads(threads);
                const int64_t ex = arg_int(exact, "exact", 0);
                return search_into(static_cast<size_t>(s.dim()), s.size(), q, k,
                                   [&](const float* qp, size_t nq, int64_t kk, float* sp, int64_t* ip) {
                                       s.search(qp, static_cast<int64_t>(nq), kk, np_, rr, sp, ip, nt,
                                                static_cast<float>(spread), ex);
                                   });
            },
            py::arg("queries"), py::arg("k"), py::arg("nprobe") = 16, py::arg("rerank") = 0, py::arg("threads") = 0,
            py::arg("spread") = 0.0, py::arg("exact") = 0)
        .def("centroids",
             [](const IVFPQ& s) {
                 py::array_t<float> a({static_cast<py::ssize_t>(s.nlist()), static_cast<py::ssize_t>(s.dim())});
                 if (s.is_trained()) {
                     const std::vector<float> c = s.centroids();
                     std::copy(c.begin(), c.end(), a.mutable_data());
                 }
                 return a;
             })
        .def("codebooks",
             [](const IVFPQ& s) {
                 py::array_t<float> a({static_cast<py::ssize_t>(s.m()), static_cast<py::ssize_t>(s.ksub()),
                                       static_cast<py::ssize_t>(s.dsub())});
                 if (s.is_trained()) std::copy(s.codebooks().begin(), s.codebooks().end(), a.mutable_data());
                 return a;
             })
        .def(
            "list_codes",
            [](const IVFPQ& s, py::handle list) {
                const int64_t l = list_index(s, list);
                const uint8_t* c = s.list_codes(l);
                py::array_t<uint8_t> a({static_cast<py::ssize_t>(s.list_size(l)), static_cast<py::ssize_t>(s.m())});
                if (s.nbits() == 4)
                    pq4::unpack(c, s.list_size(l), s.m(), a.mutable_data());
                else
                    std::copy(c, c + s.list_code_bytes(l), a.mutable_data());
                return a;
            },
            py::arg("list"))
        .def(
            "list_positions",
            [](const IVFPQ& s, py::handle list) {
                const int64_t l = list_index(s, list);
                const auto& p = s.list_positions(l);
                py::array_t<int64_t> a(static_cast<py::ssize_t>(s.list_size(l)));
                std::copy(p.begin(), p.end(), a.mutable_data());
                return a;
            },
            py::arg("list"))
        .def(
            "list_residual_sq", [](const IVFPQ& s, py::handle list) { return s.list_residual_sq(list_index(s, list)); },
            py::arg("list"), "sum of ||x - c||^2 over the list's members")
        .def(
            "list_spread", [](const IVFPQ& s, py::handle list) { return s.list_spread(list_index(s, list)); },
            py::arg("list"), "s_l of the spread-aware probe order (csrc/ivfpq.h)")
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
    bind_ivfpq_stages(m);
}

}  // namespace fastdpr::bind

// Python bindings of the HNSW graph index.
#include <cmath>
#include <memory>
#include <string>

#include "bind.h"
#include "hnsw.h"
#include "bounds.h"

namespace fastdpr::bind {

void bind_hnsw(py::module_& m) {
    py::class_<HNSWIndex>(m, "HNSWIndex")
        .def(py::init([](py::handle dim, py::handle M, py::handle efc, py::handle ef, const std::string& graph,
                         const std::string& storage, double phi, py::handle entry_points, py::handle seed,
                         py::handle floor) {
                 if (!std::isfinite(phi) || phi < 0) throw std::invalid_argument("phi must be a finite number >= 0");
                 HNSWParams p;
                 p.M = static_cast<size_t>(arg_int(M, "M", 2, 4096));
                 p.ef_construction = static_cast<size_t>(arg_int(efc, "ef_construction", 1, kMaxBeam));
                 p.ef_search = static_cast<size_t>(arg_int(ef, "ef_search", 1, kMaxBeam));
                 p.graph = parse_graph(graph);
                 p.storage = parse_storage(storage);
                 p.phi = phi;
                 p.entry_points = static_cast<size_t>(arg_int(entry_points, "entry_points", 1, kMaxEntryPoints));
                 p.seed = static_cast<uint64_t>(arg_int(seed, "seed"));
                 p.floor = arg_int(floor, "floor", -1, static_cast<int64_t>(p.M));
                 return std::make_unique<HNSWIndex>(static_cast<size_t>(arg_int(dim, "dim", 1, kMaxDim)), p);
             }),
             py::arg("dim"), py::arg("M") = 32, py::arg("ef_construction") = 200, py::arg("ef_search") = 128,
             py::arg("graph") = "ip", py::arg("storage") = "fp32", py::arg("phi") = 0.0, py::arg("entry_points") = 1,
             py::arg("seed") = 12345, py::arg("floor") = -1)
        .def_property_readonly("dim", &HNSWIndex::dim)
        .def_property_readonly("phi", &HNSWIndex::phi)
        .def_property_readonly("max_level", &HNSWIndex::max_level)
        .def_property_readonly("M", [](const HNSWIndex& h) { return h.params().M; })
        .def_property_readonly("ef_construction", [](const HNSWIndex& h) { return h.params().ef_construction; })
        .def_property_readonly("ef_search", [](const HNSWIndex& h) { return h.params().ef_search; })
        .def_property_readonly("entry_points", [](const HNSWIndex& h) { return h.params().entry_points; })
        .def_property_readonly("floor", [](const HNSWIndex& h) { return h.params().floor; })
        .def_property_readonly("graph", [](const HNSWIndex& h) { return std::string(graph_name(h.params().graph)); })
        .def_property_readonly("storage",
                               [](const HNSWIndex& h) { return std::string(storage_name(h.params().storage)); })
        .def("__len__", &HNSWIndex::size)
        .def(
            "add",
            [](HNSWIndex& h, py::handle x, py::handle threads) {
                const int nt = arg_threads(threads);
                InputRows rows(x, h.dim(), "vectors");
                // the L2 reduction fixes phi from the first add: half rows then go in as one add, as float32
                // rows do, so both fix the same phi
                const bool whole = h.params().graph == Graph::L2 && h.phi() <= 0;
                py::gil_scoped_release release;
                rows.for_blocks([&](const float* p, size_t n) { h.add(p, n, nt); }, whole);
            },
            py::arg("vectors"), py::arg("threads") = 0)
        .def(
            "search",
            [](const HNSWIndex& h, py::handle q, py::handle k, py::handle ef, py::handle threads,
               py::handle entry_points) {
                const size_t ef_ = static_cast<size_t>(arg_int(ef, "ef", 0, kMaxBeam));
                const size_t entry = static_cast<size_t>(arg_int(entry_points, "entry_points", 0, kMaxEntryPoints));
                const int nt = arg_threads(threads);
                const int64_t size = static_cast<int64_t>(h.size());
                return search_into(h.dim(), size, q, k,
                                   [&](const float* qp, size_t nq, int64_t kk, float* sp, int64_t* ip) {
                                       h.search(qp, nq, static_cast<size_t>(kk), ef_, sp, ip, nt, entry);
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
}

}  // namespace fastdpr::bind

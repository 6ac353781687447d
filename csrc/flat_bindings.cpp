// Python bindings of the exact (flat) index.
#include <memory>
#include <string>

#include "bind.h"
#include "flat.h"
#include "bounds.h"

namespace fastdpr::bind {

void bind_flat(py::module_& m) {
    py::class_<FlatIndex>(m, "FlatIndex")
        .def(py::init([](py::handle dim, const std::string& storage) {
                 return std::make_unique<FlatIndex>(static_cast<size_t>(arg_int(dim, "dim", 1, kMaxDim)),
                                                    parse_storage(storage));
             }),
             py::arg("dim"), py::arg("storage") = "fp32")
        .def_property_readonly("dim", &FlatIndex::dim)
        .def_property_readonly("storage", [](const FlatIndex& f) { return std::string(storage_name(f.storage())); })
        .def("__len__", &FlatIndex::size)
        .def("add",
             [](FlatIndex& f, py::handle x) {
                 InputRows rows(x, f.dim(), "vectors");
                 py::gil_scoped_release release;
                 rows.for_blocks([&](const float* p, size_t n) { f.add(p, n); });
             },
             py::arg("vectors"), "Append float32 or float16 rows (n, dim).")
        .def(
            "search",
            [](const FlatIndex& f, py::handle q, py::handle k, py::handle threads) {
                const int nt = arg_threads(threads);
                const int64_t size = static_cast<int64_t>(f.size());
                return search_into(f.dim(), size, q, k,
                                   [&](const float* qp, size_t nq, int64_t kk, float* sp, int64_t* ip) {
                                       f.search(qp, nq, static_cast<size_t>(kk), sp, ip, nt);
                                   });
            },
            py::arg("queries"), py::arg("k"), py::arg("threads") = 0)
        .def("save", [](const FlatIndex& f, io::Writer& w) { f.save(w); })
        .def_static(
            "load", [](const io::Reader& r, bool mmap) { return FlatIndex::load(r, mmap); }, py::arg("reader"),
            py::arg("mmap") = false);
}

}  // namespace fastdpr::bind

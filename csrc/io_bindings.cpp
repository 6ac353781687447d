// Python bindings of the index file format: the checksummed writer and the validating, memory-mapping reader.
#include <memory>
#include <string>

#include "bind.h"
#include "io.h"

namespace fastdpr::bind {
namespace {

// A numpy view of a file section that keeps the file mapping alive.
py::array section_view(const io::Reader& r, const std::string& name) {
    const io::Section s = r.section(name);
    auto holder = new std::shared_ptr<io::Mapping>(r.mapping());
    py::capsule owner(holder, [](void* p) { delete static_cast<std::shared_ptr<io::Mapping>*>(p); });
    py::array view(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(s.length)}, {1}, s.data, owner);
    view.attr("setflags")(py::arg("write") = false);  // the mapping is PROT_READ
    return view;
}

}  // namespace

void bind_io(py::module_& m) {
    py::register_exception<io::FormatError>(m, "FormatError", PyExc_ValueError);
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
}

}  // namespace fastdpr::bind

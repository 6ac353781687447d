// The checked integer and level arguments the binding units use (bind.h), in the code all the modules share.
#include <string>

#include "bind.h"
#include "parallel.h"
#include "simd.h"

namespace fastdpr::bind {

int64_t arg_int(py::handle value, const char* name, int64_t lo, int64_t hi) {
    PyObject* o = value.ptr();
    const std::string type_name = py::str(py::type::handle_of(value).attr("__name__"));
    // bool is an int in Python, but a flag passed where a count belongs is a mistake, not the count 1
    if (PyBool_Check(o) || type_name == "bool" || type_name == "bool_" || !PyIndex_Check(o))
        throw py::type_error(std::string(name) + " must be an integer, got " + type_name + " (" +
                             std::string(py::repr(value)) + ")");
    py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(o));
    if (!index) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow != 0 || v < lo || v > hi) {
        std::string range = hi == kInt64Max && overflow == 0
                                ? ">= " + std::to_string(lo)
                                : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        throw py::value_error(std::string(name) + " must be " + range + ", got " + std::string(py::str(index)));
    }
    return v;
}

int arg_threads(py::handle value) {
    const int64_t requested = arg_int(value, "threads", std::numeric_limits<int64_t>::min());
    resolve_threads(requested);  // the range check, with its message
    return static_cast<int>(requested);
}

cpu::Level index_level(const std::string& name, const std::string& fn) {
    return name.empty() ? simd::level() : cpu::require(cpu::parse_level(name, fn), fn);
}

}  // namespace fastdpr::bind

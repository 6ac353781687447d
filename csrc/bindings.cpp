// The only pybind11 translation unit: numpy in, numpy out, shapes checked here, GIL released around work.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
    m.doc() = "fastdpr compiled core: maximum-inner-product indexes";
#ifdef FASTDPR_OPENMP
    m.attr("has_openmp") = true;
#else
    m.attr("has_openmp") = false;
#endif

    // ---- flat / hnsw / common begin ----
    // ---- flat / hnsw / common end ----

    // ---- IVF-PQ begin ----
    // ---- IVF-PQ end ----
}

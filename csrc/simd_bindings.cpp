// Python bindings of the SIMD kernels (tests and benchmarks compare the levels with each other).
#include <string>

#include "bind.h"
#include "simd.h"

namespace fastdpr::bind {
namespace {

simd::Level parse_level(const std::string& name) {
    if (name == "scalar") return simd::Level::Scalar;
    if (name == "avx2") return simd::Level::AVX2;
    if (name == "avx512") return simd::Level::AVX512;
    throw std::invalid_argument("unknown SIMD level '" + name + "' (scalar, avx2, avx512)");
}

const simd::Kernels& kernels_for(const std::string& level) {
    return level.empty() ? simd::kernels() : simd::kernels_at(parse_level(level));
}

}  // namespace

void bind_simd(py::module_& m) {
    m.def("simd_level", []() { return std::string(simd::level_name()); }, "The SIMD level in use.");
    m.def("simd_detect", []() { return std::string(simd::level_name(simd::detect())); },
          "The widest SIMD level the CPU-feature registry enables (this CPU, within FASTDPR_SIMD).");
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
}

}  // namespace fastdpr::bind

// Python bindings of the SIMD kernels (tests and benchmarks compare the levels with each other), and the cap of the
// index core's kernels (cpu.h's set_cap) for the tests that run whole indexes at each level.
#include <string>

#include "bind.h"
#include "simd.h"

namespace fastdpr::bind {
namespace {

const simd::Kernels& kernels_for(const std::string& level, const std::string& fn) {
    return level.empty() ? simd::kernels() : simd::kernels_at(index_level(level, fn));
}

}  // namespace

void bind_simd(py::module_& m) {
    m.def("simd_level", []() { return std::string(cpu::level_name(simd::kernels().level)); },
          "The CPU level of the distance kernels' table in use (scalar, avx2 or avx512; csrc/simd.h).");
    m.def(
        "set_cpu_cap",
        [](const std::string& level) {
            return std::string(cpu::level_name(cpu::set_cap(cpu::parse_level(level, "set_cpu_cap"), "set_cpu_cap")));
        },
        py::arg("level"),
        "Caps the CPU level of this module's kernels (the index core's) at `level`, process-wide, in place of "
        "FASTDPR_SIMD's cap; returns the widest level enabled before, to put back. Refused for a level this CPU "
        "lacks. For tests and benchmarks: calls already running keep their level (csrc/cpu.h).");
    m.def(
        "simd_dot",
        [](const FloatArray& a, const FloatArray& b, const std::string& level) {
            if (a.size() != b.size()) throw std::invalid_argument("simd_dot: lengths differ");
            return kernels_for(level, "simd_dot").dot(a.data(), b.data(), static_cast<size_t>(a.size()));
        },
        py::arg("a"), py::arg("b"), py::arg("level") = "");
    m.def(
        "simd_dot_f16",
        [](const FloatArray& a, const U16Array& b, const std::string& level) {
            if (a.size() != b.size()) throw std::invalid_argument("simd_dot_f16: lengths differ");
            return kernels_for(level, "simd_dot_f16").dot_f16(a.data(), b.data(), static_cast<size_t>(a.size()));
        },
        py::arg("a"), py::arg("b_half_bits"), py::arg("level") = "");
    m.def(
        "simd_l2sq",
        [](const FloatArray& a, const FloatArray& b, const std::string& level) {
            if (a.size() != b.size()) throw std::invalid_argument("simd_l2sq: lengths differ");
            return kernels_for(level, "simd_l2sq").l2sq(a.data(), b.data(), static_cast<size_t>(a.size()));
        },
        py::arg("a"), py::arg("b"), py::arg("level") = "");
    m.def(
        "simd_dot4x4",
        [](const FloatArray& q, const FloatArray& x, const std::string& level) {
            if (q.ndim() != 2 || x.ndim() != 2 || q.shape(0) != 4 || x.shape(0) != 4 || q.shape(1) != x.shape(1))
                throw std::invalid_argument("simd_dot4x4: needs two (4, d) arrays");
            const size_t d = static_cast<size_t>(q.shape(1));
            py::array_t<float> out({4, 4});
            kernels_for(level, "simd_dot4x4").dot4x4(q.data(), d, x.data(), d, d, out.mutable_data(), 4);
            return out;
        },
        py::arg("q"), py::arg("x"), py::arg("level") = "");
    m.def(
        "to_half",
        [](const FloatArray& a, const std::string& level) {
            py::array_t<uint16_t> out(a.request().shape);
            kernels_for(level, "to_half").to_half(a.data(), out.mutable_data(), static_cast<size_t>(a.size()));
            return out;
        },
        py::arg("a"), py::arg("level") = "", "fp32 -> IEEE half bit patterns (uint16).");
    m.def(
        "from_half",
        [](const U16Array& a, const std::string& level) {
            py::array_t<float> out(a.request().shape);
            kernels_for(level, "from_half").from_half(a.data(), out.mutable_data(), static_cast<size_t>(a.size()));
            return out;
        },
        py::arg("a"), py::arg("level") = "");
}

}  // namespace fastdpr::bind

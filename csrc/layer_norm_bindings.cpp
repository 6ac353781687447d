// Python bindings of the few-rows layer norm. bf16 crosses as uint16 views of the bits (as in
// attention_bindings.cpp), without copies; `out` is written in place and may be `x` itself.
#include <string>
#include <vector>

#include "bind.h"
#include "layer_norm.h"

namespace fastdpr::bind {

namespace {

// A writable C-contiguous (rows, width) float32 or uint16 (bf16 bits) array, as (f32, bf16) pointers.
std::pair<float*, uint16_t*> rows_array(py::array& a, const char* what, bool writable) {
    if (a.ndim() != 2 || !(a.flags() & py::array::c_style))
        throw std::invalid_argument(std::string("layer_norm: ") + what + " must be a C-contiguous 2-D array");
    if (writable && !a.writeable()) throw std::invalid_argument(std::string("layer_norm: ") + what + " is read-only");
    if (a.dtype().is(py::dtype::of<float>())) return {static_cast<float*>(a.mutable_data()), nullptr};
    if (a.dtype().is(py::dtype::of<uint16_t>())) return {nullptr, static_cast<uint16_t*>(a.mutable_data())};
    throw std::invalid_argument(std::string("layer_norm: ") + what + " must be float32 or uint16 (bf16 bits)");
}

}  // namespace

void bind_layer_norm(py::module_& m) {
    m.def(
        "layer_norm_paths",
        [] { return enabled_names(layer_norm::kLevels); },
        "The CPU levels (cpu.h) of the layer norm kernels this CPU runs (avx512, scalar), fastest first.");
    m.def(
        "layer_norm",
        [](py::array x, const FloatArray& gamma, const FloatArray& beta, double eps, py::array out,
           const std::string& path_name) {
            // x is only read; a read-only input is fine
            const auto [x32, x16] = rows_array(x, "x", false);
            const auto [o32, o16] = rows_array(out, "out", true);
            const int64_t rows = x.shape(0), width = x.shape(1);
            if (out.shape(0) != rows || out.shape(1) != width)
                throw std::invalid_argument("layer_norm: out must have x's shape (" + std::to_string(rows) + ", " +
                                            std::to_string(width) + ")");
            if (gamma.ndim() != 1 || gamma.shape(0) != width || beta.ndim() != 1 || beta.shape(0) != width)
                throw std::invalid_argument("layer_norm: gamma and beta must have " + std::to_string(width) +
                                            " values");
            if (!(eps >= 0.0)) throw std::invalid_argument("layer_norm: eps must be >= 0");
            const cpu::Level level = cpu::choose(path_name, layer_norm::kLevels, "layer_norm");
            const float *g = gamma.data(), *b = beta.data();
            py::gil_scoped_release release;
            layer_norm::layer_norm(x32, x16, rows, width, g, b, static_cast<float>(eps), o32, o16, level);
        },
        py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("eps"), py::arg("out").noconvert(),
        py::arg("path") = "",
        "Layer norm of the rows of x (float32 or bf16 bits as uint16) into out (either type; may be x): "
        "(x - mean) / sqrt(var + eps) * gamma + beta, statistics in fp32, at the CPU level `path` ('' the fastest; "
        "csrc/layer_norm.h).");
}

}  // namespace fastdpr::bind

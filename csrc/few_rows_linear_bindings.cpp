// Python bindings of the few-rows linear layers, bf16 and fp32. bf16 crosses as uint16 views of the bits (as in
// attention_bindings.cpp), without copies; `out` is written in place.
#include <string>

#include "bind.h"
#include "few_rows_linear.h"

namespace fastdpr::bind {

namespace {

using U32Array = py::array_t<uint32_t, py::array::c_style>;
using U16In = py::array_t<uint16_t, py::array::c_style>;
using F32In = py::array_t<float, py::array::c_style>;

// The checks both layers share: x (m, k) against the packed weight's `values` and out_features; bias (n floats)
// or None. Returns the bias pointer (nullptr for None); `keep` holds the converted array.
const float* check_common(const std::string& fn, const py::array& x, int64_t values, int64_t n, int64_t per_value,
                          py::object bias, FloatArray& keep) {
    if (x.ndim() != 2) throw std::invalid_argument(fn + ": x must be 2-D (rows, in)");
    const int64_t m = x.shape(0), k = x.shape(1);
    if (values * per_value != n * k || n % linear::kPanel != 0 || k % per_value != 0)
        throw std::invalid_argument(fn + ": packed weight of " + std::to_string(values) + " values does not fit x (" +
                                    std::to_string(m) + ", " + std::to_string(k) + ") and out_features " +
                                    std::to_string(n));
    if (bias.is_none()) return nullptr;
    keep = py::cast<FloatArray>(bias);
    if (keep.ndim() != 1 || keep.shape(0) != n)
        throw std::invalid_argument(fn + ": bias must have out_features values");
    return keep.data();
}

void check_out(const std::string& fn, const py::array& out, int64_t m, int64_t n) {
    if (out.ndim() != 2 || out.shape(0) != m || out.shape(1) != n || !out.writeable() ||
        !(out.flags() & py::array::c_style))
        throw std::invalid_argument(fn + ": out must be a writable C-contiguous (rows, out_features) array");
}

linear::Activation activation_named(const std::string& name) {
    if (name.empty()) return linear::Activation::None;
    if (name == "gelu") return linear::Activation::Gelu;
    if (name == "gelu_tanh") return linear::Activation::GeluTanh;
    if (name == "relu") return linear::Activation::Relu;
    throw std::invalid_argument("linear: unknown activation '" + name + "' (gelu, gelu_tanh, relu or '')");
}

template <class Array>
int64_t packed_values(const std::string& fn, const Array& packed) {
    if (packed.ndim() != 1)
        throw std::invalid_argument(fn + ": the packed weight must be 1-D (from " + fn + "_pack)");
    return packed.shape(0);
}

template <class T>
const T* residual_of(const std::string& fn, py::object residual, int64_t m, int64_t n,
                     py::array_t<T, py::array::c_style>& keep) {
    if (residual.is_none()) return nullptr;
    keep = py::cast<py::array_t<T, py::array::c_style>>(residual);
    if (keep.ndim() != 2 || keep.shape(0) != m || keep.shape(1) != n)
        throw std::invalid_argument(fn + ": residual must be (rows, out_features)");
    return keep.data();
}

}  // namespace

void bind_linear(py::module_& m) {
    m.def(
        "linear_bf16_paths", [] { return enabled_names(linear::kBf16Levels); },
        "The CPU levels (cpu.h) of the few-rows bf16 linear kernels this CPU runs (avx512_bf16, scalar), fastest "
        "first.");
    m.def(
        "linear_f32_paths", [] { return enabled_names(linear::kF32Levels); },
        "The CPU levels (cpu.h) of the few-rows fp32 linear kernels this CPU runs (avx512, scalar), fastest first.");
    m.def(
        "linear_bf16_pack",
        [](const U16In& w) {
            if (w.ndim() != 2) throw std::invalid_argument("linear_bf16_pack: weight must be 2-D (out, in)");
            const int64_t n = w.shape(0), k = w.shape(1);
            U32Array packed({n * k / 2});
            linear::pack_weight(w.data(), n, k, packed.mutable_data());
            return packed;
        },
        py::arg("weight"),
        "A (out, in) bf16 weight (uint16 bits) laid out for linear_bf16: out a multiple of 32, in even.");
    m.def(
        "linear_f32_pack",
        [](const FloatArray& w) {
            if (w.ndim() != 2) throw std::invalid_argument("linear_f32_pack: weight must be 2-D (out, in)");
            const int64_t n = w.shape(0), k = w.shape(1);
            FloatArray packed({n * k});
            linear::pack_weight_f32(w.data(), n, k, packed.mutable_data());
            return packed;
        },
        py::arg("weight"), "A (out, in) float32 weight laid out for linear_f32: out a multiple of 32.");
    m.def(
        "linear_bf16",
        [](const U16In& x, const U32Array& packed, py::handle out_features, py::object bias,
           const std::string& activation, py::object residual, py::array out, const std::string& path_name,
           py::handle threads_arg) {
            const std::string fn = "linear_bf16";
            const int threads = arg_threads(threads_arg);
            const int64_t n = arg_int(out_features, "out_features", 1);
            FloatArray bias_arr;
            const float* b = check_common(fn, x, packed_values(fn, packed), n, 2, bias, bias_arr);
            const int64_t rows = x.shape(0), k = x.shape(1);
            U16In res_arr;
            const uint16_t* res = residual_of<uint16_t>(fn, residual, rows, n, res_arr);
            check_out(fn, out, rows, n);
            uint16_t* out16 = nullptr;
            float* out32 = nullptr;
            if (out.dtype().is(py::dtype::of<uint16_t>())) out16 = static_cast<uint16_t*>(out.mutable_data());
            else if (out.dtype().is(py::dtype::of<float>())) out32 = static_cast<float*>(out.mutable_data());
            else throw std::invalid_argument("linear_bf16: out must be uint16 (bf16 bits) or float32");
            const cpu::Level level = cpu::choose(path_name, linear::kBf16Levels, fn);
            const linear::Activation act = activation_named(activation);
            const uint16_t* xs = x.data();
            const uint32_t* pw = packed.data();
            py::gil_scoped_release release;
            linear::linear_bf16(xs, rows, k, pw, n, b, act, res, out16, out32, level, threads);
        },
        py::arg("x"), py::arg("packed"), py::arg("out_features"), py::arg("bias") = py::none(),
        py::arg("activation") = "", py::arg("residual") = py::none(), py::arg("out").noconvert(),
        py::arg("path") = "", py::arg("threads") = 1,
        "activation(x Wᵀ + bias) + residual for few rows of bf16 (see csrc/few_rows_linear.h; activation '', "
        "'gelu', 'gelu_tanh' or 'relu'), written to `out`: bf16 bits (uint16, rounded once) or float32; `path`: the "
        "CPU level ('' the fastest); `threads` split the output columns (0: all cores).");
    m.def(
        "linear_f32",
        [](const F32In& x, const F32In& packed, py::handle out_features, py::object bias,
           const std::string& activation, py::object residual, py::array out, const std::string& path_name,
           py::handle threads_arg) {
            const std::string fn = "linear_f32";
            const int threads = arg_threads(threads_arg);
            const int64_t n = arg_int(out_features, "out_features", 1);
            FloatArray bias_arr;
            const float* b = check_common(fn, x, packed_values(fn, packed), n, 1, bias, bias_arr);
            const int64_t rows = x.shape(0), k = x.shape(1);
            F32In res_arr;
            const float* res = residual_of<float>(fn, residual, rows, n, res_arr);
            check_out(fn, out, rows, n);
            if (!out.dtype().is(py::dtype::of<float>()))
                throw std::invalid_argument("linear_f32: out must be float32");
            const cpu::Level level = cpu::choose(path_name, linear::kF32Levels, fn);
            const linear::Activation act = activation_named(activation);
            const float *xs = x.data(), *pw = packed.data();
            float* o = static_cast<float*>(out.mutable_data());
            py::gil_scoped_release release;
            linear::linear_f32(xs, rows, k, pw, n, b, act, res, o, level, threads);
        },
        py::arg("x"), py::arg("packed"), py::arg("out_features"), py::arg("bias") = py::none(),
        py::arg("activation") = "", py::arg("residual") = py::none(), py::arg("out").noconvert(),
        py::arg("path") = "", py::arg("threads") = 1,
        "activation(x Wᵀ + bias) + residual for few rows of float32 (see csrc/few_rows_linear.h; activation '', "
        "'gelu', 'gelu_tanh' or 'relu'), written to the float32 array `out`; `path`: the CPU level ('' the fastest); "
        "`threads` split the output columns (0: all cores).");
}

}  // namespace fastdpr::bind

// Python bindings of the few-rows bf16 linear layer. bf16 crosses as uint16 views of the bits (as in
// attention_bindings.cpp), without copies; `out` is written in place.
#include <string>

#include "bind.h"
#include "linear_bf16.h"

namespace fastdpr::bind {

namespace {

using U32Array = py::array_t<uint32_t, py::array::c_style>;
using U16In = py::array_t<uint16_t, py::array::c_style>;

linear::Path path_named(const std::string& name) {
    for (linear::Path p : {linear::Path::AVX512BF16, linear::Path::Scalar})
        if (name == linear::path_name(p)) return p;
    if (name.empty())
        return linear::supported(linear::Path::AVX512BF16) ? linear::Path::AVX512BF16 : linear::Path::Scalar;
    throw std::invalid_argument("linear_bf16: unknown path '" + name + "' (avx512bf16, scalar, or '' for the "
                                "fastest)");
}

linear::Activation activation_named(const std::string& name) {
    if (name.empty()) return linear::Activation::None;
    if (name == "gelu") return linear::Activation::Gelu;
    if (name == "gelu_tanh") return linear::Activation::GeluTanh;
    if (name == "relu") return linear::Activation::Relu;
    throw std::invalid_argument("linear_bf16: unknown activation '" + name + "' (gelu, gelu_tanh, relu or '')");
}

}  // namespace

void bind_linear(py::module_& m) {
    m.def(
        "linear_bf16_paths",
        [] {
            std::vector<std::string> names;
            for (linear::Path p : {linear::Path::AVX512BF16, linear::Path::Scalar})
                if (linear::supported(p)) names.emplace_back(linear::path_name(p));
            return names;
        },
        "The few-rows bf16 linear implementations this CPU runs (avx512bf16, scalar), fastest first.");
    m.def(
        "linear_bf16_pack",
        [](const U16In& w) {
            if (w.ndim() != 2) throw std::invalid_argument("linear_bf16_pack: weight must be 2-D (out, in)");
            const int64_t n = w.shape(0), k = w.shape(1);
            U32Array packed({n * k / 2});
            const uint16_t* src = w.data();
            uint32_t* dst = packed.mutable_data();
            linear::pack_weight(src, n, k, dst);
            return packed;
        },
        py::arg("weight"),
        "A (out, in) bf16 weight (uint16 bits) laid out for linear_bf16: out a multiple of 32, in even.");
    m.def(
        "linear_bf16",
        [](const U16In& x, const U32Array& packed, py::handle out_features, py::object bias,
           const std::string& activation, py::object residual, py::array out, const std::string& path_name) {
            const int64_t n = arg_int(out_features, "out_features", 1);
            if (x.ndim() != 2) throw std::invalid_argument("linear_bf16: x must be 2-D (rows, in)");
            const int64_t m = x.shape(0), k = x.shape(1);
            if (packed.ndim() != 1 || packed.shape(0) * 2 != n * k || n % linear::kPanel != 0 || k % 2 != 0)
                throw std::invalid_argument("linear_bf16: packed weight of " + std::to_string(packed.size()) +
                                            " pairs does not fit x (" + std::to_string(m) + ", " +
                                            std::to_string(k) + ") and out_features " + std::to_string(n));
            const float* b = nullptr;
            FloatArray bias_arr;
            if (!bias.is_none()) {
                bias_arr = py::cast<FloatArray>(bias);
                if (bias_arr.ndim() != 1 || bias_arr.shape(0) != n)
                    throw std::invalid_argument("linear_bf16: bias must have out_features values");
                b = bias_arr.data();
            }
            const uint16_t* res = nullptr;
            U16In res_arr;
            if (!residual.is_none()) {
                res_arr = py::cast<U16In>(residual);
                if (res_arr.ndim() != 2 || res_arr.shape(0) != m || res_arr.shape(1) != n)
                    throw std::invalid_argument("linear_bf16: residual must be (rows, out_features)");
                res = res_arr.data();
            }
            if (out.ndim() != 2 || out.shape(0) != m || out.shape(1) != n || !out.writeable() ||
                !(out.flags() & py::array::c_style))
                throw std::invalid_argument("linear_bf16: out must be a writable C-contiguous (rows, out_features) "
                                            "array");
            uint16_t* out16 = nullptr;
            float* out32 = nullptr;
            if (out.dtype().is(py::dtype::of<uint16_t>())) out16 = static_cast<uint16_t*>(out.mutable_data());
            else if (out.dtype().is(py::dtype::of<float>())) out32 = static_cast<float*>(out.mutable_data());
            else throw std::invalid_argument("linear_bf16: out must be uint16 (bf16 bits) or float32");
            const linear::Path path = path_named(path_name);
            const linear::Activation act = activation_named(activation);
            const uint16_t* xs = x.data();
            const uint32_t* pw = packed.data();
            py::gil_scoped_release release;
            linear::linear_bf16(xs, m, k, pw, n, b, act, res, out16, out32, path);
        },
        py::arg("x"), py::arg("packed"), py::arg("out_features"), py::arg("bias") = py::none(),
        py::arg("activation") = "", py::arg("residual") = py::none(), py::arg("out").noconvert(),
        py::arg("path") = "",
        "activation(x Wᵀ + bias) + residual for few rows of bf16 (see csrc/linear_bf16.h; activation '', 'gelu', "
        "'gelu_tanh' or 'relu'), written to `out`: bf16 bits (uint16, rounded once) or float32.");
}

}  // namespace fastdpr::bind

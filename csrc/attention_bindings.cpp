// Python bindings of the attention kernels. bf16 has no numpy dtype: bf16 tensors cross as uint16 views of their
// bits (torch: `t.view(torch.int16).numpy().view(numpy.uint16)`), fp32 ones as float32 arrays, without copies;
// `out` is written in place.
#include <string>
#include <vector>

#include "attention.h"
#include "bind.h"

namespace fastdpr::bind {

namespace {

// qkv (T, 3·heads·head_dim), out (T, heads·head_dim) writable, groups (n, 2); returns head_dim.
template <class Array>
int64_t check_shapes(const std::string& fn, const Array& qkv, const Array& out, const Int64Array& groups,
                     int64_t heads) {
    if (qkv.ndim() != 2 || out.ndim() != 2) throw std::invalid_argument(fn + ": qkv and out must be 2-D");
    if (groups.ndim() != 2 || groups.shape(1) != 2)
        throw std::invalid_argument(fn + ": groups must be (n, 2) (count, length) pairs");
    const int64_t T = qkv.shape(0), width = qkv.shape(1);
    if (width % (3 * heads) != 0)
        throw std::invalid_argument(fn + ": qkv width " + std::to_string(width) + " is not 3 x heads x head_dim");
    const int64_t head_dim = width / (3 * heads);
    if (out.shape(0) != T || out.shape(1) != heads * head_dim)
        throw std::invalid_argument(fn + ": out must be (" + std::to_string(T) + ", " +
                                    std::to_string(heads * head_dim) + ")");
    if (!out.writeable()) throw std::invalid_argument(fn + ": out is read-only");
    return head_dim;
}

}  // namespace

void bind_attention(py::module_& m) {
    using Bits = py::array_t<uint16_t, py::array::c_style>;
    using F32 = py::array_t<float, py::array::c_style>;
    m.def(
        "attention_paths",
        [](const std::string& dtype) {
            std::vector<attention::Path> order;
            if (dtype == "bf16") order = {attention::Path::AMX, attention::Path::AVX512BF16, attention::Path::Scalar};
            else if (dtype == "f32") order = {attention::Path::AVX512, attention::Path::Scalar};
            else throw std::invalid_argument("attention_paths: dtype must be 'bf16' or 'f32', got '" + dtype + "'");
            std::vector<std::string> names;
            for (auto path : order)
                if (attention::supported(path)) names.emplace_back(attention::path_name(path));
            return names;
        },
        py::arg("dtype") = "bf16",
        "The attention implementations this CPU runs for dtype 'bf16' (amx, avx512bf16, scalar) or 'f32' (avx512, "
        "scalar), fastest first.");
    m.def(
        "attention_bf16",
        [](const Bits& qkv, Bits& out, const Int64Array& groups, py::handle heads_arg, const std::string& path_name,
           py::handle threads_arg) {
            const int64_t heads = arg_int(heads_arg, "heads", 1);
            const int threads = arg_threads(threads_arg);
            const int64_t head_dim = check_shapes("attention_bf16", qkv, out, groups, heads);
            attention::Path path = attention::best_path(head_dim);
            if (path_name == "scalar") path = attention::Path::Scalar;
            else if (path_name == "avx512bf16") path = attention::Path::AVX512BF16;
            else if (path_name == "amx") path = attention::Path::AMX;
            else if (!path_name.empty())
                throw std::invalid_argument("attention_bf16: unknown path '" + path_name +
                                            "' (amx, avx512bf16, scalar, or '' for the fastest)");
            const uint16_t* q = qkv.data();
            uint16_t* o = out.mutable_data();
            const int64_t* g = groups.data();
            const int64_t ng = groups.shape(0), T = qkv.shape(0);
            py::gil_scoped_release release;
            attention::attention_bf16(q, T, heads, head_dim, g, ng, o, path, threads);
        },
        py::arg("qkv"), py::arg("out").noconvert(), py::arg("groups"), py::arg("heads"),
        py::arg("path") = "", py::arg("threads") = 1,
        "Exact softmax attention over packed sequences, bf16 bits in and out (see csrc/attention.h).");
    m.def(
        "attention_f32",
        [](const F32& qkv, F32& out, const Int64Array& groups, py::handle heads_arg, const std::string& path_name,
           py::handle threads_arg) {
            const int64_t heads = arg_int(heads_arg, "heads", 1);
            const int threads = arg_threads(threads_arg);
            const int64_t head_dim = check_shapes("attention_f32", qkv, out, groups, heads);
            attention::Path path = attention::best_path_f32();
            if (path_name == "scalar") path = attention::Path::Scalar;
            else if (path_name == "avx512") path = attention::Path::AVX512;
            else if (!path_name.empty())
                throw std::invalid_argument("attention_f32: unknown path '" + path_name +
                                            "' (avx512, scalar, or '' for the fastest)");
            const float* q = qkv.data();
            float* o = out.mutable_data();
            const int64_t* g = groups.data();
            const int64_t ng = groups.shape(0), T = qkv.shape(0);
            py::gil_scoped_release release;
            attention::attention_f32(q, T, heads, head_dim, g, ng, o, path, threads);
        },
        py::arg("qkv"), py::arg("out").noconvert(), py::arg("groups"), py::arg("heads"),
        py::arg("path") = "", py::arg("threads") = 1,
        "Exact softmax attention over packed sequences, float32 in and out (see csrc/attention.h).");
}

}  // namespace fastdpr::bind

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
    if (heads > width / 3)  // (3 x heads could overflow below)
        throw std::invalid_argument(fn + ": " + std::to_string(heads) + " heads do not fit a qkv width of " +
                                    std::to_string(width));
    if (width % (3 * heads) != 0)
        throw std::invalid_argument(fn + ": qkv width " + std::to_string(width) + " is not 3 x heads x head_dim");
    const int64_t head_dim = width / (3 * heads);
    if (out.shape(0) != T || out.shape(1) != heads * head_dim)
        throw std::invalid_argument(fn + ": out must be (" + std::to_string(T) + ", " +
                                    std::to_string(heads * head_dim) + ")");
    if (!out.writeable()) throw std::invalid_argument(fn + ": out is read-only");
    return head_dim;
}

// One kernel's binding: shapes checked, the level named ('' = `best` for the head dimension; cpu::choose refuses
// names that are no level, no level of `levels`, or not enabled here), the GIL released while it runs. T: uint16_t
// (bf16 bits) or float.
template <class T, size_t N, class Best, class Kernel>
void def_attention(py::module_& m, const std::string& fn, const cpu::Level (&levels)[N], Best best, Kernel kernel,
                   const char* doc) {
    using Array = py::array_t<T, py::array::c_style>;
    m.def(
        fn.c_str(),
        [fn, &levels, best, kernel](const Array& qkv, Array& out, const Int64Array& groups, py::handle heads_arg,
                                    const std::string& level_name, py::handle threads_arg) {
            const int64_t heads = arg_int(heads_arg, "heads", 1);
            const int threads = arg_threads(threads_arg);
            const int64_t head_dim = check_shapes(fn, qkv, out, groups, heads);
            const cpu::Level level = level_name.empty() ? best(head_dim) : cpu::choose(level_name, levels, fn);
            const T* q = qkv.data();
            T* o = out.mutable_data();
            const int64_t* g = groups.data();
            const int64_t ng = groups.shape(0), T_rows = qkv.shape(0);
            py::gil_scoped_release release;
            kernel(q, T_rows, heads, head_dim, g, ng, o, level, threads);
        },
        py::arg("qkv"), py::arg("out").noconvert(), py::arg("groups"), py::arg("heads"), py::arg("path") = "",
        py::arg("threads") = 1, doc);
}

}  // namespace

void bind_attention(py::module_& m) {
    m.def(
        "attention_paths",
        [](const std::string& dtype) {
            if (dtype == "bf16") return enabled_names(attention::kBf16Levels);
            if (dtype == "f32") return enabled_names(attention::kF32Levels);
            throw std::invalid_argument("attention_paths: dtype must be 'bf16' or 'f32', got '" + dtype + "'");
        },
        py::arg("dtype") = "bf16",
        "The CPU levels (cpu.h) of the attention kernels this CPU runs for dtype 'bf16' (amx, avx512_bf16, scalar) "
        "or 'f32' (avx512, scalar), fastest first.");
    def_attention<uint16_t>(
        m, "attention_bf16", attention::kBf16Levels, [](int64_t head_dim) { return attention::best_bf16(head_dim); },
        attention::attention_bf16,
        "Exact softmax attention over packed sequences, bf16 bits in and out, at the CPU level `path` ('' the "
        "fastest; see csrc/attention.h).");
    def_attention<float>(
        m, "attention_f32", attention::kF32Levels, [](int64_t) { return cpu::best(attention::kF32Levels); },
        attention::attention_f32,
        "Exact softmax attention over packed sequences, float32 in and out, at the CPU level `path` ('' the "
        "fastest; see csrc/attention.h).");
}

}  // namespace fastdpr::bind

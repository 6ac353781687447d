// What the binding units share. Three pybind11 modules are made of them: `fastdpr._C` (the index core, one unit per
// index type beside its code; bindings.cpp defines it), `fastdpr.models._kernels_C` (the model kernels;
// kernels_module.cpp) and `fastdpr._cpu` (the CPU-feature registry alone, for Python that must not load either;
// cpu_module.cpp). arg_int/arg_threads (bind_args.cpp) and bind_cpu (cpu_bindings.cpp) are linked into all three.
//
// Every integer argument crosses the boundary as a Python object and is converted by arg_int(): Python ints and
// numpy integer scalars are accepted; bools, floats, negatives where a count is expected and values that do not
// fit are a clear ValueError/TypeError naming the argument, never a silent wrap-around or pybind11's generic
// "incompatible function arguments".
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cpu.h"

namespace fastdpr::bind {

namespace py = pybind11;

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using U16Array = py::array_t<uint16_t, py::array::c_style | py::array::forcecast>;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The one checked integer conversion: `value` must be an integer (int or numpy integer, not bool) in [lo, hi].
int64_t arg_int(py::handle value, const char* name, int64_t lo = 0, int64_t hi = kInt64Max);
// A thread count: 0 (all cores) up to max_threads() (parallel.h).
int arg_threads(py::handle value);

// (n, d) float32 rows with the expected d; 1-D arrays are one row.
std::pair<size_t, const float*> rows_of(const FloatArray& a, size_t dim, const char* what);

// Vectors or queries handed to add/search: a numpy array of float32 or float16 (IEEE half), (n, d) or one (d,)
// row. Any other dtype or object is a TypeError naming it, so a float64 array is never narrowed silently here.
// Half rows are widened in C++, a block at a time, so a large fp16 array never needs an fp32 copy in Python or
// here; float32 rows are used in place (copied only when not C-contiguous).
class InputRows {
public:
    InputRows(py::handle obj, size_t dim, const char* what);
    size_t rows() const { return n_; }
    bool half() const { return half_; }
    // Calls fn(rows, count) on consecutive blocks of float32 rows: the array itself in one call when it is
    // float32, blocks of at most kHalfBlockFloats values when it is half (one block of every row when `whole`).
    // Touches no Python object: call it with the GIL released.
    void for_blocks(const std::function<void(const float*, size_t)>& fn, bool whole = false) const;
    // Every row as float32 (widened once when half): for queries, which are small.
    const float* all();

    static constexpr size_t kHalfBlockFloats = size_t{1} << 22;  // 16 MiB of float32 at a time

private:
    py::array array_;
    size_t n_ = 0, dim_ = 0;
    bool half_ = false;
    std::vector<float> widened_;
};

// k beyond the index size only pads the result (the searches size their work by what exists); a padded result
// above this many bytes is refused instead of allocated (fastdpr/index/base.py has the same rule).
constexpr int64_t kMaxPaddedResultBytes = int64_t{1} << 30;

// The (nq, k) result of a search over `size` vectors: nq x k must fit, and k > size must not pad beyond
// kMaxPaddedResultBytes. ValueError otherwise.
void check_result_size(int64_t nq, int64_t k, int64_t size);

// Checks k and the queries (float32 or float16: InputRows), allocates the (nq, k) score and id arrays (after
// check_result_size), releases the GIL and lets `run` fill them.
py::tuple search_into(size_t dim, int64_t size, py::handle q, py::handle k,
                      const std::function<void(const float*, size_t, int64_t, float*, int64_t*)>& run);

// every module: cpu_features(), cpu_levels(), cpu_level(): the registry (cpu.h) as this module sees it
void bind_cpu(py::module_& m);

// The names of a kernel table's levels (cpu.h) that are enabled here, widest first: what the *_paths() functions
// of the model kernels answer.
template <size_t N>
std::vector<std::string> enabled_names(const cpu::Level (&levels)[N]) {
    std::vector<std::string> names;
    for (cpu::Level level : levels)
        if (cpu::enabled(level)) names.emplace_back(cpu::level_name(level));
    return names;
}

// The level argument of an index kernel's binding (fastdpr._C: simd, pq4, sq4): '' is the active level
// (simd::level()), any other name goes through cpu::parse_level and must be enabled here (cpu::require); `fn`
// names the function in the errors.
cpu::Level index_level(const std::string& name, const std::string& fn);

// fastdpr._C
void bind_simd(py::module_& m);
void bind_io(py::module_& m);
void bind_flat(py::module_& m);
void bind_hnsw(py::module_& m);
void bind_ivfpq(py::module_& m);
void bind_kmeans(py::module_& m);
void bind_pq4(py::module_& m);

// fastdpr.models._kernels_C
void bind_attention(py::module_& m);
void bind_linear(py::module_& m);
void bind_layer_norm(py::module_& m);
void bind_dropout(py::module_& m);

}  // namespace fastdpr::bind

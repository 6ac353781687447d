// The pybind11 module `fastdpr._C`, the index core: the index-side argument checks (bind.h) and the module
// definition, which calls one binding unit per part of the core (simd_bindings.cpp, io_bindings.cpp,
// flat_bindings.cpp, hnsw_bindings.cpp, ivfpq_bindings.cpp, kmeans_bindings.cpp, pq4_bindings.cpp) and the
// CPU-feature registry's (cpu_bindings.cpp). The model kernels are another module (kernels_module.cpp).
// Numpy in, numpy out, shapes and integers checked at this boundary,
// the GIL released around work, C++ exceptions turned into Python ones (std::invalid_argument -> ValueError,
// std::bad_alloc -> MemoryError, io::FormatError -> fastdpr._C.FormatError, a ValueError).
#include "bind.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

#include "parallel.h"
#include "simd.h"

namespace fastdpr::bind {

std::pair<size_t, const float*> rows_of(const FloatArray& a, size_t dim, const char* what) {
    if (a.ndim() == 1) {
        if (static_cast<size_t>(a.shape(0)) != dim)
            throw std::invalid_argument(std::string(what) + ": dimension " + std::to_string(a.shape(0)) +
                                        " != index dimension " + std::to_string(dim));
        return {1, a.data()};
    }
    if (a.ndim() != 2) throw std::invalid_argument(std::string(what) + " must be a 2-D array");
    if (static_cast<size_t>(a.shape(1)) != dim)
        throw std::invalid_argument(std::string(what) + ": dimension " + std::to_string(a.shape(1)) +
                                    " != index dimension " + std::to_string(dim));
    return {static_cast<size_t>(a.shape(0)), a.data()};
}

InputRows::InputRows(py::handle obj, size_t dim, const char* what) : dim_(dim) {
    if (!py::isinstance<py::array>(obj))
        throw py::type_error(std::string(what) + " must be a numpy array of float32 or float16, got " +
                             std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
    auto a = py::reinterpret_borrow<py::array>(obj);
    const py::dtype dt = a.dtype();
    // native byte order only: a big-endian float32 has the same kind and size but other bytes
    const auto& api = py::detail::npy_api::get();
    const bool f32 = api.PyArray_EquivTypes_(dt.ptr(), py::dtype::of<float>().ptr());
    const bool f16 = api.PyArray_EquivTypes_(dt.ptr(), py::dtype("float16").ptr());
    if (!f32 && !f16)
        throw py::type_error(std::string(what) + " must be float32 or float16, got dtype " +
                             std::string(py::str(static_cast<py::handle>(dt))));
    half_ = f16;
    // the same dtype, C-contiguous and aligned (a copy only when the caller's array is not)
    array_ = py::array::ensure(a, py::array::c_style | py::detail::npy_api::NPY_ARRAY_ALIGNED_);
    if (!array_) throw py::error_already_set();
    const auto shape_error = [&](py::ssize_t got) {
        return std::invalid_argument(std::string(what) + ": dimension " + std::to_string(got) +
                                     " != index dimension " + std::to_string(dim));
    };
    if (array_.ndim() == 1) {
        if (static_cast<size_t>(array_.shape(0)) != dim) throw shape_error(array_.shape(0));
        n_ = 1;
    } else if (array_.ndim() == 2) {
        if (static_cast<size_t>(array_.shape(1)) != dim) throw shape_error(array_.shape(1));
        n_ = static_cast<size_t>(array_.shape(0));
    } else {
        throw std::invalid_argument(std::string(what) + " must be a 2-D array");
    }
}

void InputRows::for_blocks(const std::function<void(const float*, size_t)>& fn, bool whole) const {
    if (n_ == 0) return;
    if (!half_) {
        fn(static_cast<const float*>(array_.data()), n_);
        return;
    }
    const auto* src = static_cast<const uint16_t*>(array_.data());
    const size_t block = whole ? n_ : std::max<size_t>(1, kHalfBlockFloats / dim_);
    std::vector<float> buf(std::min(block, n_) * dim_);
    for (size_t start = 0; start < n_; start += block) {
        const size_t count = std::min(block, n_ - start);
        simd::from_half(src + start * dim_, buf.data(), count * dim_);
        fn(buf.data(), count);
    }
}

const float* InputRows::all() {
    if (!half_) return static_cast<const float*>(array_.data());
    if (widened_.empty() && n_ > 0) {
        widened_.resize(n_ * dim_);
        simd::from_half(static_cast<const uint16_t*>(array_.data()), widened_.data(), n_ * dim_);
    }
    return widened_.data();
}

void check_result_size(int64_t nq, int64_t k, int64_t size) {
    constexpr int64_t kBytesPerResult = sizeof(float) + sizeof(int64_t);
    constexpr int64_t kMaxElements = PY_SSIZE_T_MAX / kBytesPerResult;
    if (nq > 0 && k > kMaxElements / nq)
        throw py::value_error("k=" + std::to_string(k) + " for " + std::to_string(nq) +
                              " queries: the (queries, k) result does not fit in memory");
    if (k > size && nq * k * kBytesPerResult > kMaxPaddedResultBytes)
        throw py::value_error("k=" + std::to_string(k) + " is larger than the index (" + std::to_string(size) +
                              " vectors), and padding " + std::to_string(nq) + " result rows to that width takes " +
                              std::to_string(nq * k * kBytesPerResult >> 20) + " MiB; ask for k <= " +
                              std::to_string(size));
}

py::tuple search_into(size_t dim, int64_t size, py::handle q, py::handle k_arg,
                      const std::function<void(const float*, size_t, int64_t, float*, int64_t*)>& run) {
    const int64_t k = arg_int(k_arg, "k", 1);
    InputRows queries(q, dim, "queries");
    const size_t nq = queries.rows();
    check_result_size(static_cast<int64_t>(nq), k, size);  // before numpy is asked for the arrays
    py::array_t<float> scores({static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)});
    py::array_t<int64_t> ids({static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)});
    float* sp = scores.mutable_data();
    int64_t* ip = ids.mutable_data();
    {
        py::gil_scoped_release release;
        run(queries.all(), nq, k, sp, ip);
    }
    return py::make_tuple(scores, ids);
}

}  // namespace fastdpr::bind

PYBIND11_MODULE(_C, m) {
    namespace bind = fastdpr::bind;
    m.doc() = "fastdpr compiled core: maximum-inner-product indexes";
#ifdef FASTDPR_OPENMP
    m.attr("has_openmp") = true;
#else
    m.attr("has_openmp") = false;
#endif
    m.def("max_threads", &fastdpr::max_threads, "The largest thread count any threads= argument accepts.");
    m.def(
        "parallel_check",
        [](pybind11::handle n_tasks, pybind11::handle fail_at, pybind11::handle threads) {
            // Runs the same catch-on-worker / rethrow-on-caller mechanism the index loops use, failing at task
            // `fail_at` (-1: never); returns the number of tasks that ran (tests).
            const int64_t n = bind::arg_int(n_tasks, "n_tasks", 0, int64_t{1} << 24);
            const int64_t at = bind::arg_int(fail_at, "fail_at", -1);
            const int nt = fastdpr::resolve_threads(bind::arg_threads(threads));
            std::atomic<int64_t> ran{0};
            fastdpr::ParallelErrors errors;
            {
                pybind11::gil_scoped_release release;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
                for (int64_t i = 0; i < n; ++i)
                    errors.run([&] {
                        if (i == at) throw std::runtime_error("task " + std::to_string(i) + " failed");
                        ran.fetch_add(1, std::memory_order_relaxed);
                    });
            }
            errors.rethrow();
            return ran.load();
        },
        pybind11::arg("n_tasks"), pybind11::arg("fail_at") = -1, pybind11::arg("threads") = 0);

    bind::bind_simd(m);
    bind::bind_io(m);
    bind::bind_flat(m);
    bind::bind_hnsw(m);
    bind::bind_ivfpq(m);
    bind::bind_kmeans(m);
    bind::bind_pq4(m);
    bind::bind_cpu(m);
}

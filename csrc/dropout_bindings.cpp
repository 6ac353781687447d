// Python binding of the seeded dropout (dropout.h): applied in place to a C-contiguous float32 array.
#include <string>
#include <vector>

#include "bind.h"
#include "dropout.h"

namespace fastdpr::bind {

void bind_dropout(py::module_& m) {
    m.def(
        "dropout_paths",
        [] { return enabled_names(dropout::kLevels); },
        "The CPU levels (cpu.h) of the seeded dropout kernels this CPU runs (avx512, scalar), fastest first.");
    m.def(
        "dropout_",
        [](py::array x, double keep_prob, py::handle seed, double scale, const std::string& path_name_) {
            if (!(x.flags() & py::array::c_style) || !x.dtype().is(py::dtype::of<float>()))
                throw std::invalid_argument("dropout_: x must be a C-contiguous float32 array");
            if (!x.writeable()) throw std::invalid_argument("dropout_: x is read-only");
            if (!(keep_prob >= 0.0 && keep_prob <= 1.0))
                throw std::invalid_argument("dropout_: keep_prob must be in [0, 1], got " + std::to_string(keep_prob));
            // any 64-bit pattern: the torch side draws it as a signed int64
            const auto s = static_cast<uint64_t>(arg_int(seed, "seed", std::numeric_limits<int64_t>::min()));
            const cpu::Level level = cpu::choose(path_name_, dropout::kLevels, "dropout_");
            float* data = static_cast<float*>(x.mutable_data());
            const int64_t n = x.size();
            py::gil_scoped_release release;
            dropout::apply(data, n, keep_prob, s, static_cast<float>(scale), level);
        },
        py::arg("x"), py::arg("keep_prob"), py::arg("seed"), py::arg("scale"), py::arg("path") = "",
        "x[i] = x[i] * scale where element i is kept (probability keep_prob), else 0; the mask is a function of "
        "(seed, i) only (csrc/dropout.h).");
}

}  // namespace fastdpr::bind

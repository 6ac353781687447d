// cpu_features(): the CPU-feature registry (cpu.h) as a dict, bound into every module so that each can be asked
// what its own copy of the registry decided (they read the same CPU and the same FASTDPR_SIMD).
#include "bind.h"
#include "cpu.h"

namespace fastdpr::bind {

void bind_cpu(py::module_& m) {
    m.def(
        "cpu_features",
        [](bool detected) {
            py::dict out;
            for (int i = 0; i < cpu::kLevels; ++i) {
                const auto level = static_cast<cpu::Level>(i);
                out[cpu::level_name(level)] = detected ? cpu::detected(level) : cpu::enabled(level);
            }
            out["cap"] = cpu::cap();
            out["cap_valid"] = cpu::cap_valid();
            return out;
        },
        py::arg("detected") = false,
        "{level: whether kernels may use it} for avx2, avx512 (F+BW+VL), avx512_vnni, avx512_bf16 and amx, with "
        "the FASTDPR_SIMD cap ('cap', '' when unset; 'cap_valid': whether it names a level). detected=True: what "
        "the CPU and OS offer, ignoring the cap.");
}

}  // namespace fastdpr::bind

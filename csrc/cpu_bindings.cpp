// The CPU-feature registry (cpu.h) as each module sees it, bound into every module so that each can be asked what
// its own copy of the registry decided (they read the same CPU and the same FASTDPR_SIMD).
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
        "{level: whether kernels may use it} for every CPU level (scalar, avx2, avx512 (F+BW+VL), avx512_vnni, "
        "avx512_bf16, amx), with the FASTDPR_SIMD cap ('cap', '' when unset; 'cap_valid': whether it names a "
        "level). detected=True: what the CPU and OS offer, ignoring the cap.");
    m.def(
        "cpu_levels",
        [] {
            std::vector<std::string> names;
            for (int i = 0; i < cpu::kLevels; ++i) names.emplace_back(cpu::level_name(static_cast<cpu::Level>(i)));
            return names;
        },
        "The names of the CPU levels (csrc/cpu.h), each implying the ones before it.");
    m.def(
        "cpu_level", [] { return std::string(cpu::level_name(cpu::widest())); },
        "The widest CPU level this module's kernels may use (this CPU, within the cap).");
}

}  // namespace fastdpr::bind

// The one place that knows what this CPU can run, and the one vocabulary of CPU levels: every kernel table (the
// index's distance kernels, pq4's and sq4's scans, k-means, attention, the few-rows linear layer, layer norm,
// dropout) is keyed by cpu::Level, every binding that takes a level name parses it with parse_level(), and one cap
// applies to all of them.
//
// The levels, each implying the ones before it in this list (a CPU that has a later one has the earlier ones in
// every design that ships it, and the kernels of a later level use the earlier instructions freely):
//   scalar        portable C++; every CPU
//   avx2          AVX2 + FMA + F16C (the index kernels convert fp16 rows with F16C)
//   avx512        AVX-512 F + BW + VL (the byte/word and 256-bit masked forms come with F on every CPU that
//                 matters, and the kernels use them; F alone is never enough here)
//   avx512_vnni   AVX512-VNNI (int8 dot products)
//   avx512_bf16   AVX512-BF16 (vdpbf16ps)
//   amx           AMX-TILE + AMX-BF16, with the OS's permission to use the tile state (Linux: arch_prctl)
// Detection is cpuid plus xgetbv (the OS must save the registers' state), once per process; AMX's permission is
// requested from the OS the first time anyone asks about amx.
//
// The cap: kernels use no level above it. FASTDPR_SIMD=scalar|avx2|avx512|avx512_vnni|avx512_bf16|amx sets it at
// start-up (benchmarks, debugging); an unknown value caps nothing (cap_valid() says so). set_cap() moves it later
// (the tests that run whole indexes at each level).
#pragma once

#include <cstddef>
#include <string>

namespace fastdpr::cpu {

enum class Level : int { Scalar = 0, AVX2 = 1, AVX512 = 2, AVX512_VNNI = 3, AVX512_BF16 = 4, AMX = 5 };
constexpr int kLevels = 6;

const char* level_name(Level level);
// "scalar, avx2, avx512, avx512_vnni, avx512_bf16, amx": what an unknown name is told
std::string level_names();
// The one parser from name to level. Throws std::invalid_argument naming `what` (the argument or function) and
// listing the valid names when `name` is none of them.
Level parse_level(const std::string& name, const std::string& what);

// What the CPU and OS offer, whatever the cap (scalar: always).
bool detected(Level level);
// What the kernels may use: detected and within the cap (scalar: always).
bool enabled(Level level);
// `level` itself when enabled; otherwise std::invalid_argument naming `what` and saying why (the CPU lacks it, or
// the cap excludes it).
Level require(Level level, const std::string& what);
// The widest enabled level, no wider than `ceiling` (a kernel table's widest entry). Reads the cap once: a kernel
// table is chosen once per call with it, never per element.
Level widest(Level ceiling = Level::AMX);

// A kernel table's levels: the levels it has a kernel for, widest first, ending with Scalar (e.g. attention's bf16
// table {AMX, AVX512_BF16, Scalar}). The table's modules keep them as arrays; these take (levels, n).
//   best:    the first one enabled;
//   require: `level` when it is one of them and enabled, else std::invalid_argument naming `what`;
//   choose:  the one `name` names through parse_level, required ("" for best).
Level best(const Level* levels, size_t n);
Level require(Level level, const Level* levels, size_t n, const std::string& what);
Level choose(const std::string& name, const Level* levels, size_t n, const std::string& what);
template <size_t N>
Level best(const Level (&levels)[N]) {
    return best(levels, N);
}
template <size_t N>
Level require(Level level, const Level (&levels)[N], const std::string& what) {
    return require(level, levels, N, what);
}
template <size_t N>
Level choose(const std::string& name, const Level (&levels)[N], const std::string& what) {
    return choose(name, levels, N, what);
}

// The cap as FASTDPR_SIMD set it ("" when unset), and whether it names a level.
const std::string& cap();
bool cap_valid();
// Moves the cap to `level`, replacing FASTDPR_SIMD's; returns widest() as it was, so that a caller can put it
// back. Throws std::invalid_argument naming `what` when the CPU lacks `level`. The cap is process-wide, as
// FASTDPR_SIMD is: the kernels run on OpenMP's worker threads, which a per-thread setting would not reach. It is
// an atomic, read once per kernel call: a call already running keeps the level it started with, calls started
// afterwards use the new cap. Each compiled module links its own copy of this registry, so the cap moved through
// one module's binding (fastdpr._C) applies to that module's kernels only.
Level set_cap(Level level, const std::string& what);

}  // namespace fastdpr::cpu

// The one place that knows what this CPU can run: every kernel (the index's SIMD table, pq4's scan, attention,
// the few-rows linear layer, layer norm) asks here, so a level means the same thing everywhere and one cap
// applies to all of them.
//
// Named levels, each implying the ones before it in this list (a CPU that has a later one has the earlier ones in
// every design that ships it, and the kernels of a later level use the earlier instructions freely):
//   avx2          AVX2 + FMA + F16C (the index kernels convert fp16 rows with F16C)
//   avx512        AVX-512 F + BW + VL (the byte/word and 256-bit masked forms come with F on every CPU that
//                 matters, and the kernels use them; F alone is never enough here)
//   avx512_vnni   AVX512-VNNI (int8 dot products)
//   avx512_bf16   AVX512-BF16 (vdpbf16ps)
//   amx           AMX-TILE + AMX-BF16, with the OS's permission to use the tile state (Linux: arch_prctl)
// Detection is cpuid plus xgetbv (the OS must save the registers' state), once per process; AMX's permission is
// requested from the OS the first time anyone asks about amx.
//
// FASTDPR_SIMD=scalar|avx2|avx512|avx512_vnni|avx512_bf16|amx caps every level at the one named (benchmarks,
// debugging, tests of the narrower paths); an unknown value caps nothing (cap_valid() says so).
#pragma once

#include <string>

namespace fastdpr::cpu {

enum class Level : int { AVX2 = 0, AVX512 = 1, AVX512_VNNI = 2, AVX512_BF16 = 3, AMX = 4 };
constexpr int kLevels = 5;

const char* level_name(Level level);
// The level called `name`; false for unknown names ("scalar" is none of them).
bool parse_level(const std::string& name, Level& level);

// What the CPU and OS offer, whatever the cap.
bool detected(Level level);
// What the kernels may use: detected and within the cap.
bool enabled(Level level);
// The cap as FASTDPR_SIMD set it ("" when unset), and whether it names a level (or "scalar").
const std::string& cap();
bool cap_valid();

}  // namespace fastdpr::cpu

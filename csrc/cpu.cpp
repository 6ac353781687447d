// CPU-feature registry: cpuid and xgetbv once, the FASTDPR_SIMD cap at start-up, the level names (see cpu.h).
#include "cpu.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace fastdpr::cpu {
namespace {

constexpr const char* kNames[kLevels] = {"scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx"};

struct Registry {
    bool detected[kLevels] = {true};  // scalar: every CPU
    std::string cap;
    bool cap_valid = true;
    std::atomic<int> top{kLevels - 1};  // the cap: the widest level allowed

    Registry();  // detection and FASTDPR_SIMD, below
};

#if defined(__x86_64__) || defined(_M_X64)
bool bit(unsigned reg, int b) { return (reg >> b) & 1u; }

uint64_t xgetbv0() {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool amx_permitted() {
#if defined(__linux__)
    // Linux hands out the AMX tile data state only on request (once per process; torch's oneDNN asks too)
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
    return false;
#endif
}

void detect(bool out[kLevels]) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const bool fma = bit(c, 12), osxsave = bit(c, 27), avx = bit(c, 28), f16c = bit(c, 29);
    if (!osxsave || !avx) return;
    const uint64_t xcr0 = xgetbv0();
    const bool os_avx = (xcr0 & 0x6) == 0x6;           // SSE and AVX state
    const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;      // + opmask, upper ZMM, high ZMM
    const bool os_amx = (xcr0 & 0x60000) == 0x60000;   // tile config and tile data
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7) && a >= 1) {
        unsigned x = 0, y = 0, z = 0;
        __get_cpuid_count(7, 1, &a71, &x, &y, &z);
    }
    out[1] = os_avx && fma && f16c && bit(b7, 5);
    out[2] = out[1] && os_avx512 && bit(b7, 16) && bit(b7, 30) && bit(b7, 31);
    out[3] = out[2] && bit(c7, 11);
    out[4] = out[3] && bit(a71, 5);
    out[5] = out[4] && os_amx && bit(d7, 22) && bit(d7, 24);  // and the OS's permission: amx_ready()
}
#else
void detect(bool[kLevels]) {}
bool amx_permitted() { return false; }
#endif

// AMX needs a request to the OS as well, made only when a caller asks about AMX (the index kernels never do), once
bool amx_ready() {
    static const bool ready = amx_permitted();
    return ready;
}

int level_named(const std::string& name) {
    for (int i = 0; i < kLevels; ++i)
        if (name == kNames[i]) return i;
    return -1;
}

Registry::Registry() {
    detect(detected);
    if (const char* env = std::getenv("FASTDPR_SIMD")) {
        cap = env;
        const int named = level_named(cap);
        if (named >= 0) top = named;
        else if (!cap.empty()) cap_valid = false;
    }
}

Registry& registry() {
    static Registry r;
    return r;
}

Level widest_detected() {
    int best = 0;
    for (int i = 1; i < kLevels && detected(static_cast<Level>(i)); ++i) best = i;
    return static_cast<Level>(best);
}

}  // namespace

const char* level_name(Level level) { return kNames[static_cast<int>(level)]; }

std::string level_names() {
    std::string names;
    for (int i = 0; i < kLevels; ++i) names += std::string(i ? ", " : "") + kNames[i];
    return names;
}

Level parse_level(const std::string& name, const std::string& what) {
    const int named = level_named(name);
    if (named < 0)
        throw std::invalid_argument(what + ": unknown CPU level '" + name + "'; the levels are " + level_names());
    return static_cast<Level>(named);
}

bool detected(Level level) {
    return registry().detected[static_cast<int>(level)] && (level != Level::AMX || amx_ready());
}

bool enabled(Level level) {
    return static_cast<int>(level) <= registry().top.load(std::memory_order_relaxed) && detected(level);
}

Level require(Level level, const std::string& what) {
    if (enabled(level)) return level;
    const std::string name = level_name(level);
    if (!detected(level))
        throw std::invalid_argument(what + ": this CPU cannot run the " + name + " level (it runs up to " +
                                    level_name(widest_detected()) + ")");
    throw std::invalid_argument(what + ": the " + name + " level is above the cap, " + level_name(widest()) +
                                " (FASTDPR_SIMD, or cpu::set_cap)");
}

Level widest(Level ceiling) {
    const int top = std::min(registry().top.load(std::memory_order_relaxed), static_cast<int>(ceiling));
    int best = 0;
    for (int i = 1; i <= top && detected(static_cast<Level>(i)); ++i) best = i;
    return static_cast<Level>(best);
}

Level best(const Level* levels, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (enabled(levels[i])) return levels[i];
    return Level::Scalar;
}

Level require(Level level, const Level* levels, size_t n, const std::string& what) {
    std::string has;
    for (size_t i = 0; i < n; ++i) {
        if (levels[i] == level) return require(level, what);
        has += std::string(has.empty() ? "" : ", ") + level_name(levels[i]);
    }
    throw std::invalid_argument(what + ": no " + level_name(level) + " kernel; it has " + has);
}

Level choose(const std::string& name, const Level* levels, size_t n, const std::string& what) {
    return name.empty() ? best(levels, n) : require(parse_level(name, what), levels, n, what);
}

const std::string& cap() { return registry().cap; }
bool cap_valid() { return registry().cap_valid; }

Level set_cap(Level level, const std::string& what) {
    if (!detected(level))
        throw std::invalid_argument(what + ": this CPU cannot run the " + level_name(level) + " level (it runs up to " +
                                    level_name(widest_detected()) + ")");
    const Level before = widest();
    registry().top.store(static_cast<int>(level), std::memory_order_relaxed);
    return before;
}

}  // namespace fastdpr::cpu

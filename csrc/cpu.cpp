// CPU-feature registry: cpuid and xgetbv once, the FASTDPR_SIMD cap once (see cpu.h).
#include "cpu.h"

#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace fastdpr::cpu {
namespace {

constexpr const char* kNames[kLevels] = {"avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx"};

struct Registry {
    bool detected[kLevels] = {};
    bool enabled[kLevels] = {};
    std::string cap;
    bool cap_valid = true;
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
    out[0] = os_avx && fma && f16c && bit(b7, 5);
    out[1] = out[0] && os_avx512 && bit(b7, 16) && bit(b7, 30) && bit(b7, 31);
    out[2] = out[1] && bit(c7, 11);
    out[3] = out[2] && bit(a71, 5);
    out[4] = out[3] && os_amx && bit(d7, 22) && bit(d7, 24);  // and the OS's permission: amx_ready()
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

Registry make() {
    Registry r;
    detect(r.detected);
    int top = kLevels - 1;  // the highest level allowed
    if (const char* env = std::getenv("FASTDPR_SIMD")) {
        r.cap = env;
        Level level;
        if (r.cap == "scalar") top = -1;
        else if (parse_level(r.cap, level)) top = static_cast<int>(level);
        else if (!r.cap.empty()) r.cap_valid = false;
    }
    for (int i = 0; i < kLevels; ++i) r.enabled[i] = r.detected[i] && i <= top;
    return r;
}

const Registry& registry() {
    static const Registry r = make();
    return r;
}

}  // namespace

const char* level_name(Level level) { return kNames[static_cast<int>(level)]; }

bool parse_level(const std::string& name, Level& level) {
    for (int i = 0; i < kLevels; ++i)
        if (name == kNames[i]) {
            level = static_cast<Level>(i);
            return true;
        }
    return false;
}

bool detected(Level level) {
    return registry().detected[static_cast<int>(level)] && (level != Level::AMX || amx_ready());
}

bool enabled(Level level) {
    return registry().enabled[static_cast<int>(level)] && (level != Level::AMX || amx_ready());
}

const std::string& cap() { return registry().cap; }
bool cap_valid() { return registry().cap_valid; }

}  // namespace fastdpr::cpu

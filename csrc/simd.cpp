// SIMD kernels, one set per level, compiled with per-function target attributes and dispatched at run time.
// Hand-written because they are the product's edge: the index's speed is these loops (BLAS gives no fp16-storage
// dot, no fused 4x4 tile with the layout we need, and would force a dependency).
#include "simd.h"

#include "cpu.h"
#include "transpose.h"

// GCC 12 warns about its own _mm*_undefined_* helpers inside the AVX-512 intrinsics (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace fastdpr::simd {

// ---------------------------------------------------------------------------------------------------------------
// half <-> float, exact software versions (the scalar level and the tails of the wide ones)

uint16_t float_to_half(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {  // Inf or NaN
        const uint32_t mant = absx > 0x7f800000u ? (0x200u | ((absx >> 13) & 0x3ffu)) : 0u;
        return static_cast<uint16_t>(sign | 0x7c00u | mant);
    }
    if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
    if (absx < 0x38800000u) {                                                // below the smallest normal half
        if (absx < 0x33000000u) return static_cast<uint16_t>(sign);          // < 2^-25: rounds to 0
        const uint32_t e = absx >> 23;
        const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;  // 14..24 (subnormal half = m * 2^(e-150) / 2^-24)
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) ++h;
        return static_cast<uint16_t>(sign | h);
    }
    // normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even
    uint32_t h = ((absx - 0x38000000u) >> 13);
    const uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is the right answer
    return static_cast<uint16_t>(sign | h);
}

float half_to_float(uint16_t h) {
    const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            x = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

// ---------------------------------------------------------------------------------------------------------------
// scalar: four partial sums so the reference is not needlessly slow; the compiler may not reorder them

namespace scalar {

float dot(const float* a, const float* b, size_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; ++i) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

float dot_f16(const float* a, const uint16_t* b, size_t n) {
    float s0 = 0, s1 = 0;
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        s0 += a[i] * half_to_float(b[i]);
        s1 += a[i + 1] * half_to_float(b[i + 1]);
    }
    for (; i < n; ++i) s0 += a[i] * half_to_float(b[i]);
    return s0 + s1;
}

float l2sq(const float* a, const float* b, size_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float d0 = a[i] - b[i], d1 = a[i + 1] - b[i + 1], d2 = a[i + 2] - b[i + 2], d3 = a[i + 3] - b[i + 3];
        s0 += d0 * d0;
        s1 += d1 * d1;
        s2 += d2 * d2;
        s3 += d3 * d3;
    }
    for (; i < n; ++i) {
        const float d = a[i] - b[i];
        s0 += d * d;
    }
    return (s0 + s1) + (s2 + s3);
}

void dot_batch(const float* q, const float* base, size_t n, size_t d, float* out) {
    for (size_t j = 0; j < n; ++j) out[j] = dot(q, base + j * d, d);
}

void dot_batch_f16(const float* q, const uint16_t* base, size_t n, size_t d, float* out) {
    for (size_t j = 0; j < n; ++j) out[j] = dot_f16(q, base + j * d, d);
}

void dot4x4(const float* q, size_t ldq, const float* x, size_t ldx, size_t d, float* out, size_t ldo) {
    for (size_t i = 0; i < 4; ++i)
        for (size_t j = 0; j < 4; ++j) out[i * ldo + j] = dot(q + i * ldq, x + j * ldx, d);
}

void to_half(const float* src, uint16_t* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
}

void from_half(const uint16_t* src, float* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

constexpr size_t kMR = 4, kNR = 8;

void pack(const float* x, size_t ldx, size_t nv, size_t d, float* panel) {
    for (size_t k = 0; k < d; ++k)
        for (size_t j = 0; j < kNR; ++j) panel[k * kNR + j] = j < nv ? x[j * ldx + k] : 0.0f;
}

void gemm(const float* q, size_t ldq, const float* panel, size_t d, float* out, size_t ldo, bool accumulate) {
    float acc[kMR][kNR] = {};
    if (accumulate)
        for (size_t i = 0; i < kMR; ++i)
            for (size_t j = 0; j < kNR; ++j) acc[i][j] = out[i * ldo + j];
    for (size_t k = 0; k < d; ++k)
        for (size_t i = 0; i < kMR; ++i)
            for (size_t j = 0; j < kNR; ++j) acc[i][j] += q[k * ldq + i] * panel[k * kNR + j];
    for (size_t i = 0; i < kMR; ++i)
        for (size_t j = 0; j < kNR; ++j) out[i * ldo + j] = acc[i][j];
}

}  // namespace scalar

// ---------------------------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C

#define FASTDPR_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace avx2 {

FASTDPR_AVX2 static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

FASTDPR_AVX2 float dot(const float* a, const float* b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

FASTDPR_AVX2 static inline __m256 load_half8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

FASTDPR_AVX2 float dot_f16(const float* a, const uint16_t* b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_half8(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_half8(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), load_half8(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), load_half8(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_half8(b + i), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; ++i) s += a[i] * half_to_float(b[i]);
    return s;
}

FASTDPR_AVX2 float l2sq(const float* a, const float* b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
        s0 = _mm256_fmadd_ps(d0, d0, s0);
        s1 = _mm256_fmadd_ps(d1, d1, s1);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        s0 = _mm256_fmadd_ps(d0, d0, s0);
    }
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) {
        const float t = a[i] - b[i];
        s += t * t;
    }
    return s;
}

FASTDPR_AVX2 void dot_batch(const float* q, const float* base, size_t n, size_t d, float* out) {
    for (size_t j = 0; j < n; ++j) {
        if (j + 1 < n) prefetch(base + (j + 1) * d, d * sizeof(float));
        out[j] = dot(q, base + j * d, d);
    }
}

FASTDPR_AVX2 void dot_batch_f16(const float* q, const uint16_t* base, size_t n, size_t d, float* out) {
    for (size_t j = 0; j < n; ++j) {
        if (j + 1 < n) prefetch(base + (j + 1) * d, d * sizeof(uint16_t));
        out[j] = dot_f16(q, base + j * d, d);
    }
}

// 2 queries x 4 vectors per pass keeps 8 accumulators + 3 operands inside the 16 ymm registers.
FASTDPR_AVX2 static void dot2x4(const float* q, size_t ldq, const float* x, size_t ldx, size_t d, float* out,
                                size_t ldo) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps(),
           c03 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps(),
           c13 = _mm256_setzero_ps();
    const float* q0 = q;
    const float* q1 = q + ldq;
    const float* x0 = x;
    const float* x1 = x + ldx;
    const float* x2 = x + 2 * ldx;
    const float* x3 = x + 3 * ldx;
    size_t k = 0;
    for (; k + 8 <= d; k += 8) {
        const __m256 a0 = _mm256_loadu_ps(q0 + k), a1 = _mm256_loadu_ps(q1 + k);
        __m256 b = _mm256_loadu_ps(x0 + k);
        c00 = _mm256_fmadd_ps(a0, b, c00);
        c10 = _mm256_fmadd_ps(a1, b, c10);
        b = _mm256_loadu_ps(x1 + k);
        c01 = _mm256_fmadd_ps(a0, b, c01);
        c11 = _mm256_fmadd_ps(a1, b, c11);
        b = _mm256_loadu_ps(x2 + k);
        c02 = _mm256_fmadd_ps(a0, b, c02);
        c12 = _mm256_fmadd_ps(a1, b, c12);
        b = _mm256_loadu_ps(x3 + k);
        c03 = _mm256_fmadd_ps(a0, b, c03);
        c13 = _mm256_fmadd_ps(a1, b, c13);
    }
    float r[2][4] = {{hsum(c00), hsum(c01), hsum(c02), hsum(c03)}, {hsum(c10), hsum(c11), hsum(c12), hsum(c13)}};
    for (; k < d; ++k) {
        for (int j = 0; j < 4; ++j) {
            const float xv = x[j * ldx + k];
            r[0][j] += q0[k] * xv;
            r[1][j] += q1[k] * xv;
        }
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) out[i * ldo + j] = r[i][j];
}

FASTDPR_AVX2 void dot4x4(const float* q, size_t ldq, const float* x, size_t ldx, size_t d, float* out, size_t ldo) {
    dot2x4(q, ldq, x, ldx, d, out, ldo);
    dot2x4(q + 2 * ldq, ldq, x, ldx, d, out + 2 * ldo, ldo);
}

FASTDPR_AVX2 void to_half(const float* src, uint16_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

FASTDPR_AVX2 void from_half(const uint16_t* src, float* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_half8(src + i));
    for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

// 6 queries x 16 vectors: 12 accumulators + 2 panel rows + 1 broadcast in the 16 ymm registers.
constexpr size_t kMR = 6, kNR = 16;

// 8 x 8 blocks transposed in registers (transpose.h), the dimensions past the last multiple of 8 one by one.
FASTDPR_AVX2 void pack(const float* x, size_t ldx, size_t nv, size_t d, float* panel) {
    const size_t d8 = d / 8 * 8;
    for (size_t j0 = 0; j0 < kNR; j0 += 8) {
        const int rows = static_cast<int>(std::min<size_t>(8, nv > j0 ? nv - j0 : 0));
        for (size_t k0 = 0; k0 < d8; k0 += 8)
            simd::transpose8(x + j0 * ldx + k0, ldx, rows, panel + k0 * kNR + j0, static_cast<int64_t>(kNR));
    }
    for (size_t k = d8; k < d; ++k)
        for (size_t j = 0; j < kNR; ++j) panel[k * kNR + j] = j < nv ? x[j * ldx + k] : 0.0f;
}

FASTDPR_AVX2 void gemm(const float* q, size_t ldq, const float* panel, size_t d, float* out, size_t ldo,
                       bool accumulate) {
    __m256 acc[kMR][2];
#pragma GCC unroll 6
    for (size_t i = 0; i < kMR; ++i) {
        acc[i][0] = accumulate ? _mm256_loadu_ps(out + i * ldo) : _mm256_setzero_ps();
        acc[i][1] = accumulate ? _mm256_loadu_ps(out + i * ldo + 8) : _mm256_setzero_ps();
    }
    for (size_t k = 0; k < d; ++k) {
        const __m256 b0 = _mm256_loadu_ps(panel + k * kNR), b1 = _mm256_loadu_ps(panel + k * kNR + 8);
#pragma GCC unroll 6
        for (size_t i = 0; i < kMR; ++i) {
            const __m256 a = _mm256_broadcast_ss(q + k * ldq + i);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (size_t i = 0; i < kMR; ++i) {
        _mm256_storeu_ps(out + i * ldo, acc[i][0]);
        _mm256_storeu_ps(out + i * ldo + 8, acc[i][1]);
    }
}

}  // namespace avx2

// ---------------------------------------------------------------------------------------------------------------
// AVX-512F (+F16C for the conversions it shares)

#define FASTDPR_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

namespace avx512 {

FASTDPR_AVX512 static inline __mmask16 tail_mask(size_t r) { return static_cast<__mmask16>((1u << r) - 1u); }

FASTDPR_AVX512 float dot(const float* a, const float* b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

FASTDPR_AVX512 static inline __m512 load_half16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The last < 16 halves, copied so that no byte past the end is read (a masked 16-bit load needs AVX512BW).
FASTDPR_AVX512 static inline __m512 load_half_tail(const uint16_t* p, size_t r) {
    alignas(32) uint16_t buf[16] = {0};
    std::memcpy(buf, p, r * sizeof(uint16_t));
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(buf)));
}

FASTDPR_AVX512 float dot_f16(const float* a, const uint16_t* b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load_half16(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load_half16(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), load_half16(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), load_half16(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load_half16(b + i), s0);
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load_half_tail(b + i, n - i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

FASTDPR_AVX512 float l2sq(const float* a, const float* b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
        const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
        s0 = _mm512_fmadd_ps(d0, d0, s0);
        s1 = _mm512_fmadd_ps(d1, d1, s1);
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
        s0 = _mm512_fmadd_ps(d0, d0, s0);
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 d0 = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
        s1 = _mm512_fmadd_ps(d0, d0, s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// Four rows at a time: four independent FMA chains and four sequential streams for the hardware prefetcher, which
// read a large fp32 base faster than one row at a time with the next row prefetched in software. T: float, or
// uint16_t for fp16 rows.
FASTDPR_AVX512 static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
FASTDPR_AVX512 static inline __m512 load16(const uint16_t* p) { return load_half16(p); }
FASTDPR_AVX512 static inline __m512 load_tail(const float* p, size_t r) {
    return _mm512_maskz_loadu_ps(tail_mask(r), p);
}
FASTDPR_AVX512 static inline __m512 load_tail(const uint16_t* p, size_t r) { return load_half_tail(p, r); }

template <class T>
FASTDPR_AVX512 void dot_rows(const float* q, const T* base, size_t n, size_t d, float* out) {
    const size_t d16 = d / 16 * 16;
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const T* x0 = base + j * d;
        const T *x1 = x0 + d, *x2 = x1 + d, *x3 = x2 + d;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
               s3 = _mm512_setzero_ps();
        for (size_t k = 0; k < d16; k += 16) {
            const __m512 qv = _mm512_loadu_ps(q + k);
            s0 = _mm512_fmadd_ps(qv, load16(x0 + k), s0);
            s1 = _mm512_fmadd_ps(qv, load16(x1 + k), s1);
            s2 = _mm512_fmadd_ps(qv, load16(x2 + k), s2);
            s3 = _mm512_fmadd_ps(qv, load16(x3 + k), s3);
        }
        if (d16 < d) {
            const __m512 qv = _mm512_maskz_loadu_ps(tail_mask(d - d16), q + d16);
            s0 = _mm512_fmadd_ps(qv, load_tail(x0 + d16, d - d16), s0);
            s1 = _mm512_fmadd_ps(qv, load_tail(x1 + d16, d - d16), s1);
            s2 = _mm512_fmadd_ps(qv, load_tail(x2 + d16, d - d16), s2);
            s3 = _mm512_fmadd_ps(qv, load_tail(x3 + d16, d - d16), s3);
        }
        out[j] = _mm512_reduce_add_ps(s0);
        out[j + 1] = _mm512_reduce_add_ps(s1);
        out[j + 2] = _mm512_reduce_add_ps(s2);
        out[j + 3] = _mm512_reduce_add_ps(s3);
    }
    for (; j < n; ++j) {
        const T* x = base + j * d;
        __m512 s = _mm512_setzero_ps();
        for (size_t k = 0; k < d16; k += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(q + k), load16(x + k), s);
        if (d16 < d)
            s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail_mask(d - d16), q + d16), load_tail(x + d16, d - d16), s);
        out[j] = _mm512_reduce_add_ps(s);
    }
}

FASTDPR_AVX512 void dot_batch(const float* q, const float* base, size_t n, size_t d, float* out) {
    dot_rows(q, base, n, d, out);
}

FASTDPR_AVX512 void dot_batch_f16(const float* q, const uint16_t* base, size_t n, size_t d, float* out) {
    dot_rows(q, base, n, d, out);
}

// 4 queries x 4 vectors: 16 zmm accumulators + 8 operands fit the 32 registers; 16 FMAs per 8 loads.
FASTDPR_AVX512 void dot4x4(const float* q, size_t ldq, const float* x, size_t ldx, size_t d, float* out,
                           size_t ldo) {
    __m512 c[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) c[i][j] = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + 16 <= d; k += 16) {
        __m512 a[4], b[4];
        for (int i = 0; i < 4; ++i) a[i] = _mm512_loadu_ps(q + i * ldq + k);
        for (int j = 0; j < 4; ++j) b[j] = _mm512_loadu_ps(x + j * ldx + k);
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) c[i][j] = _mm512_fmadd_ps(a[i], b[j], c[i][j]);
    }
    if (k < d) {
        const __mmask16 m = tail_mask(d - k);
        __m512 a[4], b[4];
        for (int i = 0; i < 4; ++i) a[i] = _mm512_maskz_loadu_ps(m, q + i * ldq + k);
        for (int j = 0; j < 4; ++j) b[j] = _mm512_maskz_loadu_ps(m, x + j * ldx + k);
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) c[i][j] = _mm512_fmadd_ps(a[i], b[j], c[i][j]);
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) out[i * ldo + j] = _mm512_reduce_add_ps(c[i][j]);
}

FASTDPR_AVX512 void to_half(const float* src, uint16_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

FASTDPR_AVX512 void from_half(const uint16_t* src, float* dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_half16(src + i));
    for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

// 12 queries x 32 vectors: 24 accumulators + 2 panel rows + 1 broadcast in the 32 zmm registers; 14 loads per
// 24 FMAs, so the FMA units, not the loads, set the pace.
constexpr size_t kMR = 12, kNR = 32;

// 16 x 16 blocks transposed in registers (transpose.h), the dimensions past the last multiple of 16 one by one.
FASTDPR_AVX512 void pack(const float* x, size_t ldx, size_t nv, size_t d, float* panel) {
    const size_t d16 = d / 16 * 16;
    for (size_t j0 = 0; j0 < kNR; j0 += 16) {
        const int rows = static_cast<int>(std::min<size_t>(16, nv > j0 ? nv - j0 : 0));
        for (size_t k0 = 0; k0 < d16; k0 += 16)
            simd::transpose16(x + j0 * ldx + k0, ldx, rows, panel + k0 * kNR + j0, static_cast<int64_t>(kNR));
    }
    for (size_t k = d16; k < d; ++k)
        for (size_t j = 0; j < kNR; ++j) panel[k * kNR + j] = j < nv ? x[j * ldx + k] : 0.0f;
}

FASTDPR_AVX512 void gemm(const float* q, size_t ldq, const float* panel, size_t d, float* out, size_t ldo,
                         bool accumulate) {
    __m512 acc[kMR][2];
#pragma GCC unroll 12
    for (size_t i = 0; i < kMR; ++i) {
        acc[i][0] = accumulate ? _mm512_loadu_ps(out + i * ldo) : _mm512_setzero_ps();
        acc[i][1] = accumulate ? _mm512_loadu_ps(out + i * ldo + 16) : _mm512_setzero_ps();
    }
    for (size_t k = 0; k < d; ++k) {
        const __m512 b0 = _mm512_loadu_ps(panel + k * kNR), b1 = _mm512_loadu_ps(panel + k * kNR + 16);
#pragma GCC unroll 12
        for (size_t i = 0; i < kMR; ++i) {
            const __m512 a = _mm512_set1_ps(q[k * ldq + i]);
            acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 12
    for (size_t i = 0; i < kMR; ++i) {
        _mm512_storeu_ps(out + i * ldo, acc[i][0]);
        _mm512_storeu_ps(out + i * ldo + 16, acc[i][1]);
    }
}

}  // namespace avx512

// ---------------------------------------------------------------------------------------------------------------
// dispatch

static const Kernels kScalar{cpu::Level::Scalar,     scalar::dot,       scalar::dot_f16,   scalar::l2sq,
                             scalar::dot_batch, scalar::dot_batch_f16, scalar::dot4x4, scalar::to_half,
                             scalar::from_half, scalar::kMR,        scalar::kNR,       scalar::pack,
                             scalar::gemm};
static const Kernels kAVX2{cpu::Level::AVX2,     avx2::dot,       avx2::dot_f16,  avx2::l2sq,   avx2::dot_batch,
                           avx2::dot_batch_f16, avx2::dot4x4, avx2::to_half,  avx2::from_half, avx2::kMR,
                           avx2::kNR,       avx2::pack,      avx2::gemm};
static const Kernels kAVX512{cpu::Level::AVX512,     avx512::dot,       avx512::dot_f16,  avx512::l2sq,
                             avx512::dot_batch, avx512::dot_batch_f16, avx512::dot4x4, avx512::to_half,
                             avx512::from_half, avx512::kMR,       avx512::kNR,      avx512::pack,
                             avx512::gemm};

static const Kernels& table_of(cpu::Level level) {
    switch (level) {
        case cpu::Level::Scalar: return kScalar;
        case cpu::Level::AVX2: return kAVX2;
        default: return kAVX512;
    }
}

const Kernels& kernels() { return table_of(level()); }

const Kernels& kernels_at(cpu::Level level) { return table_of(cpu::require(level, "simd kernels")); }

}  // namespace fastdpr::simd

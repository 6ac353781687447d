// Vectorised elementwise functions of the CPU kernels (AVX-512F), each with its accuracy: e^x for the softmax of
// attention, GELU for the epilogue of the few-rows linear layer.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#define FASTDPR_VECMATH __attribute__((target("avx512f"))) inline

namespace fastdpr::vecmath {

// e^x for x <= 0: x = n·ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error below
// 2e-7 there), scaled by 2^n; inputs below -87 (e^x under fp32's normal range) give 0 after the scaling.
FASTDPR_VECMATH __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// GELU(x) = x·Φ(x) with Φ(x) = 1 − erfc(z)/2 for z = x/√2 >= 0 and erfc(|z|)/2 below, so that no 1 − erf
// cancellation loses the small values of negative x. erfc(z) = t·P(t)·e^(−z²), t = 1/(1 + 0.3275911·z)
// (Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7).
FASTDPR_VECMATH __m512 gelu_erf(__m512 x) {
    const __m512 z = _mm512_abs_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)));
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(z, _mm512_set1_ps(0.3275911f),
                                                                         _mm512_set1_ps(1.0f)));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    const __m512 half_erfc = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(p, t), _mm512_set1_ps(0.5f)),
                                           exp_nonpositive(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), z), z)));
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 phi = _mm512_mask_blend_ps(negative, _mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc), half_erfc);
    return _mm512_mul_ps(x, phi);
}

// GELU's tanh form, x·(1 + tanh(u))/2 with u = √(2/π)·(x + 0.044715·x³): (1 + tanh u)/2 = 1/(1 + e^(−2u)) for
// u >= 0 and e^(2u)/(1 + e^(2u)) below, both from e^(−2|u|) (relative error a few 1e-7).
FASTDPR_VECMATH __m512 gelu_tanh(__m512 x) {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 u = _mm512_mul_ps(_mm512_fmadd_ps(x3, _mm512_set1_ps(0.044715f), x),
                                   _mm512_set1_ps(0.79788456080286536f));
    const __m512 e = exp_nonpositive(_mm512_mul_ps(_mm512_abs_ps(u), _mm512_set1_ps(-2.0f)));
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    const __mmask16 negative = _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mul_ps(x, _mm512_mask_blend_ps(negative, inv, _mm512_mul_ps(e, inv)));
}

}  // namespace fastdpr::vecmath

#endif

// Exact softmax attention, bf16 in and out (see attention.h for the math and why it is written by hand).
#include "attention.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which its uninitialised-use analysis reports
// once they are inlined; the values are always overwritten
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bf16.h"
#include "cpu.h"
#include "parallel.h"
#include "transpose.h"
#include "vecmath.h"

namespace fastdpr::attention {
namespace {

// One (sequence, head): rows `q`, `k`, `v` of `length` tokens with row stride `ld`; output rows of stride `ldo`.
struct Task {
    int64_t first_row, length, head;
};

// Per-thread scratch, grown as needed and reused across tasks.
struct Scratch {
    std::vector<uint32_t> kp, vp;
    std::vector<float> s, o, kt;
    std::vector<uint16_t> p, q;
    float inv[16];  // per query row of a block: 1 / Σ of its softmax weights
};

// Key pairs, lane-major: kp[p * lp + j] = (k_j[2p], k_j[2p+1]), zero for j >= length. Value pairs: vp[t * D + d] =
// (v_{2t}[d], v_{2t+1}[d]), v_length = 0. Shared by both paths so their operands are the same bits.
void lay_out(const uint16_t* k, const uint16_t* v, size_t ld, int64_t length, int64_t lp, int64_t D, Scratch& w) {
    const int64_t pairs = D / 2, tpairs = (length + 1) / 2;
    w.kp.assign(static_cast<size_t>(pairs * lp), 0u);
    for (int64_t j = 0; j < length; ++j) {
        const uint16_t* row = k + j * ld;
        for (int64_t p = 0; p < pairs; ++p) {
            uint32_t pair;
            std::memcpy(&pair, row + 2 * p, sizeof pair);
            w.kp[p * lp + j] = pair;
        }
    }
    w.vp.resize(static_cast<size_t>(tpairs * D));
    for (int64_t t = 0; t < tpairs; ++t) {
        const uint16_t* v0 = v + 2 * t * ld;
        const uint16_t* v1 = 2 * t + 1 < length ? v0 + ld : nullptr;
        for (int64_t d = 0; d < D; ++d)
            w.vp[t * D + d] = static_cast<uint32_t>(v0[d]) | (v1 ? static_cast<uint32_t>(v1[d]) << 16 : 0u);
    }
    w.s.resize(static_cast<size_t>(lp));
    w.p.assign(static_cast<size_t>(lp), 0);
}

void head_scalar(const uint16_t* qkv, size_t ld, const Task& task, int64_t H, int64_t D, float scale,
                 uint16_t* out, size_t ldo, Scratch& w) {
    const int64_t L = task.length, lp = (L + 15) / 16 * 16, pairs = D / 2, tpairs = (L + 1) / 2;
    const uint16_t* base = qkv + task.first_row * ld;
    lay_out(base + (H + task.head) * D, base + (2 * H + task.head) * D, ld, L, lp, D, w);
    for (int64_t i = 0; i < L; ++i) {
        const uint16_t* q = base + i * ld + task.head * D;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < L; ++j) {
            float acc = 0.0f;
            for (int64_t p = 0; p < pairs; ++p) {  // the odd element of a pair first, as vdpbf16ps adds them
                const uint32_t kk = w.kp[p * lp + j];
                acc += bf16::to_float(q[2 * p + 1]) * bf16::to_float(static_cast<uint16_t>(kk >> 16));
                acc += bf16::to_float(q[2 * p]) * bf16::to_float(static_cast<uint16_t>(kk & 0xFFFFu));
            }
            w.s[j] = acc * scale;
            top = std::max(top, w.s[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < L; ++j) {
            const float e = std::exp(w.s[j] - top);
            sum += e;
            w.p[j] = bf16::from_float(e);
        }
        const float inv = 1.0f / sum;
        uint16_t* o = out + (task.first_row + i) * ldo + task.head * D;
        for (int64_t d = 0; d < D; ++d) {
            float acc = 0.0f;
            for (int64_t t = 0; t < tpairs; ++t) {
                const uint32_t vv = w.vp[t * D + d];
                const float p0 = bf16::to_float(w.p[2 * t]), p1 = 2 * t + 1 < L ? bf16::to_float(w.p[2 * t + 1]) : 0.0f;
                acc += p1 * bf16::to_float(static_cast<uint16_t>(vv >> 16));
                acc += p0 * bf16::to_float(static_cast<uint16_t>(vv & 0xFFFFu));
            }
            o[d] = bf16::from_float(acc * inv);
        }
    }
}

// fp32: the same attention without roundings, for fp32 towers. Keys and values are read from qkv directly here;
// the AVX-512 path lays the keys out transposed (16 keys per vector) and copies the values to contiguous rows.
void head_scalar_f32(const float* qkv, size_t ld, const Task& task, int64_t H, int64_t D, float scale, float* out,
                     size_t ldo, Scratch& w) {
    const int64_t L = task.length;
    const float* base = qkv + task.first_row * ld;
    const float* k = base + (H + task.head) * D;
    const float* v = base + (2 * H + task.head) * D;
    w.s.resize(static_cast<size_t>(L));
    for (int64_t i = 0; i < L; ++i) {
        const float* q = base + i * ld + task.head * D;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < L; ++j) {
            float acc = 0.0f;
            for (int64_t d = 0; d < D; ++d) acc += q[d] * k[j * ld + d];
            w.s[j] = acc * scale;
            top = std::max(top, w.s[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < L; ++j) sum += (w.s[j] = std::exp(w.s[j] - top));
        const float inv = 1.0f / sum;
        float* o = out + (task.first_row + i) * ldo + task.head * D;
        for (int64_t d = 0; d < D; ++d) {
            float acc = 0.0f;
            for (int64_t t = 0; t < L; ++t) acc += w.s[t] * v[t * ld + d];
            o[d] = acc * inv;
        }
    }
}

#if defined(__x86_64__) || defined(_M_X64)
#define FASTDPR_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define FASTDPR_AVX512F __attribute__((target("avx512f")))

using vecmath::exp_nonpositive;

// One row of softmax weights: P = exp(s − top) over scores already scaled (padding keys at −inf), written as bf16
// (zeros past L) for the second product; returns 1 / Σ P, the sum taken over the unrounded fp32 weights.
// exp(s[jb .. jb + 16) − top), zero past L: one block of a softmax row.
FASTDPR_AVX512F inline __m512 exp_block(const float* s, int64_t jb, int64_t L, __m512 vtop) {
    const int64_t valid = std::min<int64_t>(16, L - jb);
    return _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << valid) - 1u),
                               exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + jb), vtop)));
}

FASTDPR_AVX512BF16 inline float exp_row(const float* s, int64_t L, int64_t lp, float top, uint16_t* pw) {
    const __m512 vtop = _mm512_set1_ps(top);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t jb = 0; jb < lp; jb += 16) {
        const __m512 e = exp_block(s, jb, L, vtop);
        vsum = _mm512_add_ps(vsum, e);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pw + jb), (__m256i)_mm512_cvtneps_pbh(e));
    }
    return 1.0f / _mm512_reduce_add_ps(vsum);
}

// R query rows at once: each key (or value) vector loaded once serves R rows, and the R accumulators are
// independent chains, which the instruction's latency needs; each row's sums keep the scalar path's order.
template <int R>
FASTDPR_AVX512BF16 void rows_avx512(const uint16_t* const* q, uint16_t* const* o, int64_t L, int64_t lp, int64_t D,
                                    float scale, Scratch& w) {
    const int64_t pairs = D / 2, tpairs = (L + 1) / 2;
    const uint32_t* kp = w.kp.data();
    const uint32_t* vp = w.vp.data();
    float* s = w.s.data();  // R rows of lp scores
    uint16_t* pw = w.p.data();  // R rows of lp weights
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 vmax[R];
    for (int r = 0; r < R; ++r) vmax[r] = neg_inf;
    for (int64_t jb = 0; jb < lp; jb += 16) {
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t p = 0; p < pairs; ++p) {
            const __m512bh kv = (__m512bh)_mm512_loadu_si512(kp + p * lp + jb);
            for (int r = 0; r < R; ++r) {
                uint32_t qq;
                std::memcpy(&qq, q[r] + 2 * p, sizeof qq);
                acc[r] = _mm512_dpbf16_ps(acc[r], kv, (__m512bh)_mm512_set1_epi32(static_cast<int>(qq)));
            }
        }
        const int64_t valid = std::min<int64_t>(16, L - jb);
        const __mmask16 m = static_cast<__mmask16>((1u << valid) - 1u);
        for (int r = 0; r < R; ++r) {
            const __m512 sc = _mm512_mask_blend_ps(m, neg_inf, _mm512_mul_ps(acc[r], vscale));  // padding: -inf
            _mm512_storeu_ps(s + r * lp + jb, sc);
            vmax[r] = _mm512_max_ps(vmax[r], sc);
        }
    }
    __m512 inv[R];
    for (int r = 0; r < R; ++r)
        inv[r] = _mm512_set1_ps(exp_row(s + r * lp, L, lp, _mm512_reduce_max_ps(vmax[r]), pw + r * lp));
    for (int64_t db = 0; db < D; db += 16) {
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t t = 0; t < tpairs; ++t) {
            const __m512bh vv = (__m512bh)_mm512_loadu_si512(vp + t * D + db);
            for (int r = 0; r < R; ++r) {
                uint32_t pp;
                std::memcpy(&pp, pw + r * lp + 2 * t, sizeof pp);
                acc[r] = _mm512_dpbf16_ps(acc[r], vv, (__m512bh)_mm512_set1_epi32(static_cast<int>(pp)));
            }
        }
        for (int r = 0; r < R; ++r)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[r] + db),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[r], inv[r])));
    }
}

constexpr int kRows = 8;

FASTDPR_AVX512BF16 void head_avx512(const uint16_t* qkv, size_t ld, const Task& task, int64_t H, int64_t D,
                                    float scale, uint16_t* out, size_t ldo, Scratch& w) {
    const int64_t L = task.length, lp = (L + 15) / 16 * 16;
    const uint16_t* base = qkv + task.first_row * ld;
    lay_out(base + (H + task.head) * D, base + (2 * H + task.head) * D, ld, L, lp, D, w);
    w.s.resize(static_cast<size_t>(kRows * lp));
    w.p.assign(static_cast<size_t>(kRows * lp), 0);
    for (int64_t i = 0; i < L; i += kRows) {
        const uint16_t* q[kRows];
        uint16_t* o[kRows];
        const int rows = static_cast<int>(std::min<int64_t>(kRows, L - i));
        for (int r = 0; r < rows; ++r) {
            q[r] = base + (i + r) * ld + task.head * D;
            o[r] = out + (task.first_row + i + r) * ldo + task.head * D;
        }
        switch (rows) {
            case 8: rows_avx512<8>(q, o, L, lp, D, scale, w); break;
            case 7: rows_avx512<7>(q, o, L, lp, D, scale, w); break;
            case 6: rows_avx512<6>(q, o, L, lp, D, scale, w); break;
            case 5: rows_avx512<5>(q, o, L, lp, D, scale, w); break;
            case 4: rows_avx512<4>(q, o, L, lp, D, scale, w); break;
            case 3: rows_avx512<3>(q, o, L, lp, D, scale, w); break;
            case 2: rows_avx512<2>(q, o, L, lp, D, scale, w); break;
            default: rows_avx512<1>(q, o, L, lp, D, scale, w); break;
        }
    }
}

// ------------------------------------------------------------------------------------------- fp32, AVX-512F
// Scores 16 keys at a time from the transposed keys kt[d · lp + j] (zeros past L), the query element broadcast;
// softmax weights overwrite the scores in place (zeros past L); O = P V reads value rows (stride ld), 16 output
// dimensions at a time. R query rows share every key and value load, and each step covers two blocks of 16 (keys,
// or output dimensions), so 2R independent FMA chains run on R + 2 loads, the ratio the FMA units need.
template <int R, int B>
FASTDPR_AVX512F inline void scores_f32(const float* const* q, const float* kt, int64_t lp, int64_t D, int64_t L,
                                       int64_t jb, __m512 vscale, float* s, __m512 (&vmax)[R]) {
    __m512 acc[R][B];
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
        __m512 kv[B];
        for (int b = 0; b < B; ++b) kv[b] = _mm512_loadu_ps(kt + d * lp + jb + 16 * b);
        for (int r = 0; r < R; ++r) {
            const __m512 qd = _mm512_set1_ps(q[r][d]);
            for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(qd, kv[b], acc[r][b]);
        }
    }
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int b = 0; b < B; ++b) {
        const int64_t j0 = jb + 16 * b, valid = std::min<int64_t>(16, L - j0);
        const __mmask16 m = static_cast<__mmask16>((1u << valid) - 1u);  // padding keys: -inf
        for (int r = 0; r < R; ++r) {
            const __m512 sc = _mm512_mask_blend_ps(m, neg_inf, _mm512_mul_ps(acc[r][b], vscale));
            _mm512_storeu_ps(s + r * lp + j0, sc);
            vmax[r] = _mm512_max_ps(vmax[r], sc);
        }
    }
}

template <int R, int B>
FASTDPR_AVX512F inline void values_f32(const float* p, int64_t lp, const float* v, size_t ld, int64_t L, int64_t db,
                                       const float* inv, float* const* o) {
    __m512 acc[R][B];
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
    for (int64_t t = 0; t < L; ++t) {
        __m512 vv[B];
        for (int b = 0; b < B; ++b) vv[b] = _mm512_loadu_ps(v + t * ld + db + 16 * b);
        for (int r = 0; r < R; ++r) {
            const __m512 pt = _mm512_set1_ps(p[r * lp + t]);
            for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(pt, vv[b], acc[r][b]);
        }
    }
    for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_set1_ps(inv[r]);
        for (int b = 0; b < B; ++b) _mm512_storeu_ps(o[r] + db + 16 * b, _mm512_mul_ps(acc[r][b], scale));
    }
}

template <int R>
FASTDPR_AVX512F void rows_f32(const float* const* q, float* const* o, const float* v, size_t ld, int64_t L,
                              int64_t lp, int64_t D, float scale, Scratch& w) {
    const float* kt = w.kt.data();
    float* s = w.s.data();  // R rows of lp scores, then weights
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmax[R];
    for (int r = 0; r < R; ++r) vmax[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t jb = 0; jb < lp; jb += 32) {
        if (jb + 16 < lp) scores_f32<R, 2>(q, kt, lp, D, L, jb, vscale, s, vmax);
        else scores_f32<R, 1>(q, kt, lp, D, L, jb, vscale, s, vmax);
    }
    // O = (Σ_t e_t v_t) / Σ_t e_t, the division applied to each output row as it is stored. The R reciprocals wait
    // in memory (scratch), not in registers: held through the value loop as vectors they pushed one of its
    // operands out of registers (a store and reload per key).
    float* inv = w.inv;
    for (int r = 0; r < R; ++r) {
        float* row = s + r * lp;
        const __m512 vtop = _mm512_set1_ps(_mm512_reduce_max_ps(vmax[r]));
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t jb = 0; jb < lp; jb += 16) {
            const __m512 e = exp_block(row, jb, L, vtop);
            vsum = _mm512_add_ps(vsum, e);
            _mm512_storeu_ps(row + jb, e);
        }
        inv[r] = 1.0f / _mm512_reduce_add_ps(vsum);
    }
    for (int64_t db = 0; db < D; db += 32) {
        if (db + 16 < D) values_f32<R, 2>(s, lp, v, ld, L, db, inv, o);
        else values_f32<R, 1>(s, lp, v, ld, L, db, inv, o);
    }
}

constexpr int kRowsF32 = 8;

FASTDPR_AVX512F void head_avx512_f32(const float* qkv, size_t ld, const Task& task, const Task* after, int64_t H,
                                     int64_t D, float scale, float* out, size_t ldo, Scratch& w) {
    const float* next_rows = after == nullptr ? nullptr : qkv + after->first_row * ld;
    const int64_t next_head = after == nullptr ? 0 : after->head, next_length = after == nullptr ? 0 : after->length;
    const int64_t L = task.length, lp = (L + 15) / 16 * 16;
    const float* base = qkv + task.first_row * ld;
    const float* k = base + (H + task.head) * D;
    // keys transposed 16 × 16 at a time in registers (zeros past L): a scalar transpose, or gathers, cost this path
    // a large share of its time
    w.kt.resize(static_cast<size_t>(D * lp));
    for (int64_t jb = 0; jb < lp; jb += 16)
        for (int64_t d = 0; d < D; d += 16)
            simd::transpose16(k + jb * ld + d, ld, static_cast<int>(std::min<int64_t>(16, L - jb)), &w.kt[d * lp + jb], lp);
    // values copied to contiguous rows: in place, rows 3·heads·head_dim floats apart map to a few cache sets, and
    // every group of query rows would read them from L2 again
    w.o.resize(static_cast<size_t>(L * D));
    const float* vsrc = base + (2 * H + task.head) * D;
    for (int64_t t = 0; t < L; ++t) std::memcpy(&w.o[t * D], vsrc + t * ld, D * sizeof(float));
    const float* v = w.o.data();
    w.s.resize(static_cast<size_t>(kRowsF32 * lp));
    // The next task's query, key and value slices are 128-byte pieces of rows 4.5 KiB apart, which no hardware
    // prefetcher follows: fetch them into L2 while this head computes, a few rows per block of query rows.
    const float* next = next_rows == nullptr ? nullptr : next_rows + next_head * D;
    for (int64_t i = 0; i < L; i += kRowsF32) {
        const float* q[kRowsF32];
        float* o[kRowsF32];
        const int rows = static_cast<int>(std::min<int64_t>(kRowsF32, L - i));
        if (next != nullptr)
            for (int64_t t = i; t < std::min(i + kRowsF32, next_length); ++t)
                for (int64_t part = 0; part < 3; ++part)
                    for (int64_t b = 0; b < D * 4; b += 64) __builtin_prefetch(
                        reinterpret_cast<const char*>(next + t * ld + part * H * D) + b, 0, 2);
        for (int r = 0; r < rows; ++r) {
            q[r] = base + (i + r) * ld + task.head * D;
            o[r] = out + (task.first_row + i + r) * ldo + task.head * D;
        }
        switch (rows) {
            case 8: rows_f32<8>(q, o, v, D, L, lp, D, scale, w); break;
            case 7: rows_f32<7>(q, o, v, D, L, lp, D, scale, w); break;
            case 6: rows_f32<6>(q, o, v, D, L, lp, D, scale, w); break;
            case 5: rows_f32<5>(q, o, v, D, L, lp, D, scale, w); break;
            case 4: rows_f32<4>(q, o, v, D, L, lp, D, scale, w); break;
            case 3: rows_f32<3>(q, o, v, D, L, lp, D, scale, w); break;
            case 2: rows_f32<2>(q, o, v, D, L, lp, D, scale, w); break;
            default: rows_f32<1>(q, o, v, D, L, lp, D, scale, w); break;
        }
    }
}

// ------------------------------------------------------------------------------------------------------ AMX
// The same attention on AMX tiles: one TDPBF16PS multiplies a 16×32 bf16 tile by a 32×16 one (in pairs of rows,
// the layout `lay_out` already makes) into a 16×16 fp32 tile, so a 16×16 block of scores at head dimension 32 is
// one instruction where AVX512-BF16 needs 16 per row. Q is copied into a zero-padded block so tail rows read
// zeros; padded keys score 0 and are masked to -inf before the softmax, padded weights are 0.
#define FASTDPR_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

struct alignas(64) TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
// tiles 0 (accumulator), 1 (left operand), 2 (right operand): 16 rows of 64 bytes each. A constant in memory:
// _tile_loadconfig's asm names only the first 8 bytes as its operand, so the stores that fill a local
// configuration could be dropped as dead
constexpr TileConfig kTileConfig = {1, 0, {}, {64, 64, 64}, {16, 16, 16}};

FASTDPR_AMX void amx_configure() { _tile_loadconfig(&kTileConfig); }

// the tile intrinsics are asm statements without memory operands: keep the compiler from moving buffer writes
// past them
inline void compiler_barrier() { __asm__ __volatile__("" ::: "memory"); }

FASTDPR_AMX void head_amx(const uint16_t* qkv, size_t ld, const Task& task, int64_t H, int64_t D, float scale,
                          uint16_t* out, size_t ldo, Scratch& w) {
    const int64_t L = task.length, lp = (L + 15) / 16 * 16, lk = (L + 31) / 32 * 32;  // rows, keys (mult. of 32)
    const uint16_t* base = qkv + task.first_row * ld;
    // keys padded to lk so the second product's 32-key steps read zeros past L
    lay_out(base + (H + task.head) * D, base + (2 * H + task.head) * D, ld, L, lk, D, w);
    w.vp.resize(static_cast<size_t>(lk / 2 * D), 0u);
    std::fill(w.vp.begin() + (L + 1) / 2 * D, w.vp.end(), 0u);
    w.q.assign(static_cast<size_t>(lp * D), 0);
    for (int64_t i = 0; i < L; ++i) std::memcpy(&w.q[i * D], base + i * ld + task.head * D, D * sizeof(uint16_t));
    w.s.resize(static_cast<size_t>(16 * lk));
    w.p.assign(static_cast<size_t>(16 * lk), 0);
    w.o.resize(static_cast<size_t>(16 * D));
    float* s = w.s.data();
    uint16_t* pw = w.p.data();
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    const long kstride = static_cast<long>(lk * sizeof(uint32_t));
    compiler_barrier();
    for (int64_t ib = 0; ib < lp; ib += 16) {
        const int rows = static_cast<int>(std::min<int64_t>(16, L - ib));
        for (int64_t jb = 0; jb < lp; jb += 16) {
            _tile_zero(0);
            for (int64_t ks = 0; ks < D; ks += 32) {
                _tile_loadd(1, &w.q[ib * D + ks], static_cast<long>(D * sizeof(uint16_t)));
                _tile_loadd(2, w.kp.data() + (ks / 2) * lk + jb, kstride);
                _tile_dpbf16ps(0, 1, 2);
            }
            _tile_stored(0, s + jb, static_cast<long>(lk * sizeof(float)));
        }
        compiler_barrier();
        float inv[16];
        for (int r = 0; r < rows; ++r) {
            float* srow = s + r * lk;
            uint16_t* prow = pw + r * lk;
            __m512 vmax = neg_inf;
            for (int64_t jb = 0; jb < lp; jb += 16) {
                const int64_t valid = std::min<int64_t>(16, L - jb);
                const __m512 sc = _mm512_mask_blend_ps(static_cast<__mmask16>((1u << valid) - 1u), neg_inf,
                                                       _mm512_mul_ps(_mm512_loadu_ps(srow + jb), vscale));
                _mm512_storeu_ps(srow + jb, sc);
                vmax = _mm512_max_ps(vmax, sc);
            }
            inv[r] = exp_row(srow, L, lp, _mm512_reduce_max_ps(vmax), prow);
        }
        for (int r = rows; r < 16; ++r) std::memset(pw + r * lk, 0, lk * sizeof(uint16_t));
        compiler_barrier();
        for (int64_t db = 0; db < D; db += 16) {
            _tile_zero(0);
            for (int64_t kb = 0; kb < lk; kb += 32) {
                _tile_loadd(1, pw + kb, static_cast<long>(lk * sizeof(uint16_t)));
                _tile_loadd(2, w.vp.data() + (kb / 2) * D + db, static_cast<long>(D * sizeof(uint32_t)));
                _tile_dpbf16ps(0, 1, 2);
            }
            _tile_stored(0, w.o.data() + db, static_cast<long>(D * sizeof(float)));
        }
        compiler_barrier();
        for (int r = 0; r < rows; ++r) {
            uint16_t* o = out + (task.first_row + ib + r) * ldo + task.head * D;
            const __m512 vinv = _mm512_set1_ps(inv[r]);
            for (int64_t db = 0; db < D; db += 16)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + db),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(&w.o[r * D + db]),
                                                                              vinv)));
        }
    }
}

FASTDPR_AMX void amx_release() { _tile_release(); }

#endif

}  // namespace

cpu::Level best_bf16(int64_t head_dim) {
    const cpu::Level level = cpu::best(kBf16Levels);
    return level == cpu::Level::AMX && head_dim % 32 != 0 ? cpu::best(kBf16Levels + 1, 2) : level;
}

namespace {

// One task per (sequence, head), after checking the shapes; the same checks for both precisions.
std::vector<Task> make_tasks(const char* name, int64_t T, int64_t heads, int64_t head_dim, const int64_t* groups,
                             int64_t n_groups) {
    const std::string fn = std::string("attention_") + name;
    if (heads <= 0 || head_dim <= 0 || head_dim % 16 != 0)
        throw std::invalid_argument(fn + ": heads must be > 0 and head_dim a positive multiple of 16, got heads=" +
                                    std::to_string(heads) + ", head_dim=" + std::to_string(head_dim));
    std::vector<Task> tasks;
    int64_t row = 0;
    for (int64_t g = 0; g < n_groups; ++g) {
        const int64_t count = groups[2 * g], length = groups[2 * g + 1];
        // count x length must fit in the rows left, checked by division: their product could overflow int64
        if (count < 0 || length <= 0 || length > T - row || count > (T - row) / length)
            throw std::invalid_argument(fn + ": group " + std::to_string(g) + " has count " + std::to_string(count) +
                                        " and length " + std::to_string(length) + ", more than the " +
                                        std::to_string(T - row) + " rows of qkv left");
        for (int64_t c = 0; c < count; ++c, row += length)
            for (int64_t h = 0; h < heads; ++h) tasks.push_back({row, length, h});
    }
    if (row != T)
        throw std::invalid_argument(fn + ": the groups cover " + std::to_string(row) + " rows, qkv has " +
                                    std::to_string(T));
    return tasks;
}

// Runs head(task, next, scratch) for every task on `threads` threads, one scratch per thread, where next is the
// task after it in the list (nullptr for the last), so that a head may prefetch its successor's rows; AMX tiles
// are configured per thread.
template <class Head>
void run_tasks(const std::vector<Task>& tasks, int threads, bool amx, Head head) {
    const int nt = resolve_threads(threads);
    const int64_t n = static_cast<int64_t>(tasks.size());
    ParallelErrors errors;
#pragma omp parallel num_threads(nt) if (nt > 1 && n > 1)
    {
        Scratch w;
#if defined(__x86_64__) || defined(_M_X64)
        if (amx) amx_configure();
#endif
#pragma omp for schedule(dynamic, 4)
        for (int64_t t = 0; t < n; ++t) errors.run([&] { head(tasks[t], t + 1 < n ? &tasks[t + 1] : nullptr, w); });
#if defined(__x86_64__) || defined(_M_X64)
        if (amx) amx_release();
#endif
    }
    errors.rethrow();
}

}  // namespace

void attention_bf16(const uint16_t* qkv, int64_t T, int64_t heads, int64_t head_dim, const int64_t* groups,
                    int64_t n_groups, uint16_t* out, cpu::Level level, int threads) {
    cpu::require(level, kBf16Levels, "attention_bf16");
    const std::vector<Task> tasks = make_tasks("bf16", T, heads, head_dim, groups, n_groups);
    if (level == cpu::Level::AMX && head_dim % 32 != 0)
        throw std::invalid_argument("attention_bf16: the amx path needs head_dim a multiple of 32, got " +
                                    std::to_string(head_dim));
    const size_t ld = static_cast<size_t>(3 * heads * head_dim), ldo = static_cast<size_t>(heads * head_dim);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    run_tasks(tasks, threads, level == cpu::Level::AMX, [&](const Task& task, const Task*, Scratch& w) {
#if defined(__x86_64__) || defined(_M_X64)
        if (level == cpu::Level::AMX) return head_amx(qkv, ld, task, heads, head_dim, scale, out, ldo, w);
        if (level == cpu::Level::AVX512_BF16)
            return head_avx512(qkv, ld, task, heads, head_dim, scale, out, ldo, w);
#endif
        head_scalar(qkv, ld, task, heads, head_dim, scale, out, ldo, w);
    });
}

void attention_f32(const float* qkv, int64_t T, int64_t heads, int64_t head_dim, const int64_t* groups,
                   int64_t n_groups, float* out, cpu::Level level, int threads) {
    cpu::require(level, kF32Levels, "attention_f32");
    const std::vector<Task> tasks = make_tasks("f32", T, heads, head_dim, groups, n_groups);
    const size_t ld = static_cast<size_t>(3 * heads * head_dim), ldo = static_cast<size_t>(heads * head_dim);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    run_tasks(tasks, threads, false, [&](const Task& task, const Task* after, Scratch& w) {
#if defined(__x86_64__) || defined(_M_X64)
        if (level == cpu::Level::AVX512)
            return head_avx512_f32(qkv, ld, task, after, heads, head_dim, scale, out, ldo, w);
#endif
        head_scalar_f32(qkv, ld, task, heads, head_dim, scale, out, ldo, w);
    });
}

}  // namespace fastdpr::attention

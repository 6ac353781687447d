// Python bindings of the 4-bit fast-scan kernels (tests and benchmarks compare the SIMD levels with the scalar one).
#include <string>

#include "bind.h"
#include "pq4.h"

namespace fastdpr::bind {
namespace {

using U8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

pq4::ScanFn scan_for(const std::string& level) {
    if (level.empty()) return pq4::scan_kernel();
    if (level == "scalar") return pq4::scan_kernel(simd::Level::Scalar);
    if (level == "avx2") return pq4::scan_kernel(simd::Level::AVX2);
    if (level == "avx512") return pq4::scan_kernel(simd::Level::AVX512);
    throw std::invalid_argument("unknown SIMD level '" + level + "' (scalar, avx2, avx512)");
}

int64_t check_m(py::handle m) { return arg_int(m, "m", 1, pq4::kMaxM); }

// blocks of n vectors with m sub-spaces and a quantized table (padded_m(m), 16): shapes checked
void check_scan_args(const U8Array& blocks, int64_t n, int64_t m, const U8Array& table) {
    if (static_cast<size_t>(blocks.size()) != pq4::packed_bytes(n, m))
        throw std::invalid_argument("pq4: " + std::to_string(n) + " vectors with m=" + std::to_string(m) +
                                    " take " + std::to_string(pq4::packed_bytes(n, m)) + " packed bytes, got " +
                                    std::to_string(blocks.size()));
    if (table.size() != pq4::padded_m(m) * pq4::kKsub)
        throw std::invalid_argument("pq4: the quantized table must hold padded_m(m) x 16 = " +
                                    std::to_string(pq4::padded_m(m) * pq4::kKsub) + " bytes");
}

}  // namespace

void bind_pq4(py::module_& m) {
    m.attr("pq4_block") = pq4::kBlock;
    m.def("pq4_padded_m", [](py::handle msub) { return pq4::padded_m(check_m(msub)); });
    m.def("pq4_kernel", [](const std::string& level) {
        return std::string(pq4::kernel_name(level.empty() ? simd::current()
                                            : level == "scalar" ? simd::Level::Scalar
                                            : level == "avx2"   ? simd::Level::AVX2
                                                                : simd::Level::AVX512));
    }, py::arg("level") = "", "Which scan kernel a SIMD level runs (scalar, avx2, avx512bw).");
    m.def(
        "pq4_pack",
        [](const U8Array& codes) {
            if (codes.ndim() != 2) throw std::invalid_argument("pq4_pack: codes must be (n, m)");
            const int64_t n = codes.shape(0), ms = check_m(py::int_(codes.shape(1)));
            py::array_t<uint8_t> out(static_cast<py::ssize_t>(pq4::packed_bytes(n, ms)));
            pq4::pack(codes.data(), n, ms, out.mutable_data());
            return out;
        },
        py::arg("codes"), "(n, m) codes < 16 -> blocks of 32 vectors (see csrc/pq4.h).");
    m.def(
        "pq4_unpack",
        [](const U8Array& blocks, py::handle n_, py::handle m_) {
            const int64_t n = arg_int(n_, "n"), ms = check_m(m_);
            if (static_cast<size_t>(blocks.size()) != pq4::packed_bytes(n, ms))
                throw std::invalid_argument("pq4_unpack: wrong number of packed bytes");
            py::array_t<uint8_t> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(ms)});
            pq4::unpack(blocks.data(), n, ms, out.mutable_data());
            return out;
        },
        py::arg("blocks"), py::arg("n"), py::arg("m"));
    m.def(
        "pq4_quantize_lut",
        [](const FloatArray& lut) {
            if (lut.ndim() != 2 || lut.shape(1) != pq4::kKsub)
                throw std::invalid_argument("pq4_quantize_lut: the table must be (m, 16)");
            const int64_t ms = check_m(py::int_(lut.shape(0)));
            pq4::QuantizedLUT q;
            pq4::quantize_lut(lut.data(), ms, q);
            py::array_t<uint8_t> t({static_cast<py::ssize_t>(pq4::padded_m(ms)), static_cast<py::ssize_t>(16)});
            std::copy(q.table.begin(), q.table.end(), t.mutable_data());
            return py::make_tuple(t, q.bias, q.delta, q.error_bound(ms));
        },
        py::arg("lut"), "(m, 16) float table -> (uint8 table (padded_m, 16), bias, delta, error bound).");
    m.def(
        "pq4_scan",
        [](const U8Array& blocks, py::handle n_, py::handle m_, const U8Array& table, const std::string& level) {
            const int64_t n = arg_int(n_, "n"), ms = check_m(m_);
            check_scan_args(blocks, n, ms, table);
            const pq4::ScanFn scan = scan_for(level);
            std::vector<uint16_t> buf(static_cast<size_t>(pq4::nblocks(n) * pq4::kBlock));
            {
                py::gil_scoped_release release;
                scan(blocks.data(), pq4::nblocks(n), ms, table.data(), buf.data());
            }
            py::array_t<uint16_t> out(static_cast<py::ssize_t>(n));
            std::copy(buf.begin(), buf.begin() + n, out.mutable_data());
            return out;
        },
        py::arg("blocks"), py::arg("n"), py::arg("m"), py::arg("table"), py::arg("level") = "",
        "uint16 sums of the quantized table over every packed vector.");
    m.def(
        "pq4_topk",
        [](const U8Array& blocks, py::handle n_, py::handle m_, const U8Array& table, py::handle k_,
           const std::string& level) {
            const int64_t n = arg_int(n_, "n"), ms = check_m(m_), k = arg_int(k_, "k", 1);
            check_scan_args(blocks, n, ms, table);
            const pq4::ScanFn scan = scan_for(level);
            std::vector<uint16_t> s;
            std::vector<int64_t> ids;
            {
                py::gil_scoped_release release;
                pq4::topk(blocks.data(), n, ms, table.data(), k, scan, s, ids);
            }
            py::array_t<uint16_t> so(static_cast<py::ssize_t>(s.size()));
            py::array_t<int64_t> io(static_cast<py::ssize_t>(ids.size()));
            std::copy(s.begin(), s.end(), so.mutable_data());
            std::copy(ids.begin(), ids.end(), io.mutable_data());
            return py::make_tuple(so, io);
        },
        py::arg("blocks"), py::arg("n"), py::arg("m"), py::arg("table"), py::arg("k"), py::arg("level") = "",
        "The k largest uint16 sums (best first; ties: smaller index) and their indices.");
}

}  // namespace fastdpr::bind

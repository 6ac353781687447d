// Python bindings of the 4-bit fast-scan kernels (tests and benchmarks compare the CPU levels with the scalar one).
#include <string>

#include "bind.h"
#include "pq4.h"
#include "sq4.h"

namespace fastdpr::bind {
namespace {

using U8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

pq4::ScanFn scan_for(const std::string& level, const std::string& fn) {
    return pq4::scan_kernel(index_level(level, fn));
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
    using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
    m.def(
        "sq4_train",
        [](const F32Array& x) {
            if (x.ndim() != 2 || x.shape(0) < 1 || x.shape(1) < 1)
                throw std::invalid_argument("sq4_train: x must be (n >= 1, d >= 1)");
            const int64_t d = x.shape(1);
            py::array_t<float> lo(d), step(d);
            sq4::train(x.data(), x.shape(0), d, lo.mutable_data(), step.mutable_data());
            return py::make_tuple(lo, step);
        },
        py::arg("x"), "(lo, step) per dimension of x (n, d): its range in 15 even steps (csrc/sq4.h).");
    m.def(
        "sq4_encode",
        [](const F32Array& x, const F32Array& lo, const F32Array& step) {
            if (x.ndim() != 2 || lo.size() != x.shape(1) || step.size() != x.shape(1))
                throw std::invalid_argument("sq4_encode: x must be (n, d), lo and step (d,)");
            const int64_t n = x.shape(0), d = x.shape(1);
            py::array_t<uint8_t> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(sq4::row_bytes(d))});
            sq4::encode(x.data(), n, d, lo.data(), step.data(), out.mutable_data());
            return out;
        },
        py::arg("x"), py::arg("lo"), py::arg("step"), "(n, ceil(d / 2)) 4-bit rows (csrc/sq4.h).");
    m.def(
        "sq4_scores",
        [](const F32Array& q, const U8Array& rows, const F32Array& lo, const F32Array& step, const std::string& level) {
            const int64_t d = q.size();
            if (q.ndim() != 1 || lo.size() != d || step.size() != d || rows.ndim() != 2 ||
                rows.shape(1) != static_cast<py::ssize_t>(sq4::row_bytes(d)))
                throw std::invalid_argument("sq4_scores: q, lo and step must be (d,), rows (n, ceil(d / 2))");
            const sq4::DotFn dot = sq4::dot_kernel(index_level(level, "sq4_scores"));
            sq4::Query prepared;
            sq4::prepare_query(q.data(), d, lo.data(), step.data(), prepared);
            py::array_t<float> out(rows.shape(0));
            for (py::ssize_t i = 0; i < rows.shape(0); ++i)
                out.mutable_data()[i] =
                    prepared.offset + dot(prepared.scaled.data(), rows.data() + i * rows.shape(1), d);
            return out;
        },
        py::arg("q"), py::arg("rows"), py::arg("lo"), py::arg("step"), py::arg("level") = "",
        "<q, x~> of each 4-bit row with the kernel of a CPU level ('' the active one).");
    m.attr("pq4_block") = pq4::kBlock;
    m.def("pq4_padded_m", [](py::handle msub) { return pq4::padded_m(check_m(msub)); });
    m.def(
        "pq4_kernel",
        [](const std::string& level) { return std::string(pq4::kernel_name(index_level(level, "pq4_kernel"))); },
        py::arg("level") = "", "Which scan kernel a CPU level runs (scalar, avx2, avx512bw; '' the active level).");
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
        [](const FloatArray& lut, const std::string& level) {
            if (lut.ndim() != 2 || lut.shape(1) != pq4::kKsub)
                throw std::invalid_argument("pq4_quantize_lut: the table must be (m, 16)");
            const int64_t ms = check_m(py::int_(lut.shape(0)));
            pq4::QuantizedLUT q;
            pq4::quantize_lut(lut.data(), ms, q, index_level(level, "pq4_quantize_lut"));
            py::array_t<uint8_t> t({static_cast<py::ssize_t>(pq4::padded_m(ms)), static_cast<py::ssize_t>(16)});
            std::copy(q.table.begin(), q.table.end(), t.mutable_data());
            return py::make_tuple(t, q.bias, q.delta, q.error_bound(ms), q.max_sum);
        },
        py::arg("lut"), py::arg("level") = "",
        "(m, 16) float table -> (uint8 table (padded_m, 16), bias, delta, error bound, largest possible sum).");
    m.def(
        "pq4_filter",
        [](const U16Array& sums, py::handle floor_, const std::string& level) {
            const int64_t n = static_cast<int64_t>(sums.size());
            const int64_t floor = arg_int(floor_, "floor", 0, 65536);
            // the wide kernels read whole blocks of 32: a padded copy
            std::vector<uint16_t> padded(static_cast<size_t>(pq4::nblocks(n) * pq4::kBlock), 0);
            std::copy(sums.data(), sums.data() + n, padded.begin());
            std::vector<uint32_t> hits(static_cast<size_t>(n));
            const pq4::FilterFn filter = pq4::filter_kernel(index_level(level, "pq4_filter"));
            const int64_t c = filter(padded.data(), n, static_cast<uint32_t>(floor), hits.data());
            py::array_t<int64_t> out(static_cast<py::ssize_t>(c));
            std::copy(hits.begin(), hits.begin() + c, out.mutable_data());
            return out;
        },
        py::arg("sums"), py::arg("floor"), py::arg("level") = "", "Indices of the sums >= floor, in order.");
    m.def("pq4_first_reaching", &pq4::first_reaching, py::arg("base"), py::arg("delta"), py::arg("threshold"),
          "Smallest uint16 sum s whose score base + delta * s reaches the threshold (65536: none).");
    m.def("pq4_score", [](float base, float delta, uint32_t s) { return pq4::score(base, delta, s); },
          py::arg("base"), py::arg("delta"), py::arg("sum"), "The float score of a sum, as the search computes it.");
    m.def(
        "pq4_scan",
        [](const U8Array& blocks, py::handle n_, py::handle m_, const U8Array& table, const std::string& level) {
            const int64_t n = arg_int(n_, "n"), ms = check_m(m_);
            check_scan_args(blocks, n, ms, table);
            const pq4::ScanFn scan = scan_for(level, "pq4_scan");
            std::vector<uint16_t> buf(static_cast<size_t>(pq4::nblocks(n) * pq4::kBlock));
            {
                py::gil_scoped_release release;
                scan(blocks.data(), pq4::nblocks(n), ms, table.data(), buf.data(), nullptr, 0);
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
            const pq4::ScanFn scan = scan_for(level, "pq4_topk");
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

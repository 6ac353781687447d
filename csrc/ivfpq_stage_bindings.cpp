// Python bindings of the IVF-PQ search's parts on their own (fastdpr._C.ivfpq_stages): the list store, one
// scanner over caller-given (codes, ids, n), the probe order, and the re-rank chain over caller-given candidates, so
// that tests hold each stage to its contract without building an index around it.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bind.h"
#include "ivf_lists.h"
#include "ivfpq_search.h"
#include "pq4.h"
#include "sq4.h"

namespace fastdpr::bind {
namespace {

using U8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
using U32Array = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>;

int64_t list_of(const IVFLists& s, py::handle l) {
    const int64_t v = arg_int(l, "list", std::numeric_limits<int64_t>::min());
    if (v < 0 || v >= s.nlist()) throw py::index_error("ivf lists: list index out of range");
    return v;
}

// Quantizers of one list at the origin: codebooks (m, ksub, dsub).
ivfpq::PackedQuantizers quantizers(const FloatArray& codebooks) {
    if (codebooks.ndim() != 3) throw std::invalid_argument("codebooks must be (m, ksub, dsub)");
    const int64_t m = codebooks.shape(0), ksub = codebooks.shape(1), dsub = codebooks.shape(2);
    const std::vector<float> centroid(static_cast<size_t>(m * dsub), 0.f);
    ivfpq::PackedQuantizers qz;
    qz.pack(centroid.data(), 1, m * dsub, codebooks.data(), m, ksub);
    return qz;
}

py::tuple results(const std::vector<Scored>& found) {
    py::array_t<float> scores(static_cast<py::ssize_t>(found.size()));
    py::array_t<int64_t> ids(static_cast<py::ssize_t>(found.size()));
    for (size_t i = 0; i < found.size(); ++i) scores.mutable_data()[i] = found[i].score, ids.mutable_data()[i] = found[i].id;
    return py::make_tuple(scores, ids);
}

}  // namespace

void bind_ivfpq_stages(py::module_& parent) {
    py::module_ m = parent.def_submodule("ivfpq_stages", "the IVF-PQ search's stages on their own (csrc/ivfpq_search.h)");

    py::class_<IVFLists>(m, "IVFLists", "inverted lists: per list its code rows and ids (csrc/ivf_lists.h)")
        .def(py::init([](py::handle nlist, py::handle msub, py::handle nbits) {
                 return IVFLists(arg_int(nlist, "nlist", 0, int64_t{1} << 28),
                                 CodeLayout{arg_int(msub, "m", 1, 1 << 20),
                                            static_cast<int>(arg_int(nbits, "nbits", 1, 64))});
             }),
             py::arg("nlist"), py::arg("m"), py::arg("nbits") = 8)
        .def_property_readonly("nlist", &IVFLists::nlist)
        .def_property_readonly("total", &IVFLists::total)
        .def_property_readonly("code_type", [](const IVFLists& s) { return s.layout().code_type(); })
        .def("size", [](const IVFLists& s, py::handle l) { return s.size(list_of(s, l)); }, py::arg("list"))
        .def("room", [](const IVFLists& s, py::handle l) { return s.room(list_of(s, l)); }, py::arg("list"))
        .def("code_bytes", [](const IVFLists& s, py::handle l) { return s.code_bytes(list_of(s, l)); },
             py::arg("list"))
        .def(
            "codes",
            [](const IVFLists& s, py::handle list) {
                const int64_t l = list_of(s, list), n = s.size(l), mm = s.layout().m;
                py::array_t<uint8_t> a({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(mm)});
                if (s.layout().nbits == 4)
                    pq4::unpack(s.codes(l), n, mm, a.mutable_data());
                else if (n)
                    std::memcpy(a.mutable_data(), s.codes(l), s.code_bytes(l));
                return a;
            },
            py::arg("list"), "(size, m) codes of the list")
        .def(
            "ids",
            [](const IVFLists& s, py::handle list) {
                const int64_t l = list_of(s, list);
                py::array_t<int64_t> a(static_cast<py::ssize_t>(s.size(l)));
                std::copy(s.ids(l), s.ids(l) + s.size(l), a.mutable_data());
                return a;
            },
            py::arg("list"))
        .def(
            "make_room",
            [](IVFLists& s, const Int64Array& added) {
                if (added.size() != s.nlist()) throw std::invalid_argument("ivf lists: added must have nlist entries");
                s.make_room(std::vector<int64_t>(added.data(), added.data() + added.size()));
            },
            py::arg("added"))
        .def(
            "relayout",
            [](IVFLists& s, const Int64Array& room) {
                s.relayout(std::vector<int64_t>(room.data(), room.data() + room.size()));
            },
            py::arg("room"))
        .def(
            "append",
            [](IVFLists& s, py::handle list, const U8Array& code, py::handle id) {
                const int64_t l = list_of(s, list);
                if (code.size() != s.layout().m) throw std::invalid_argument("ivf lists: a code row has m codes");
                s.append(l, code.data(), static_cast<uint32_t>(arg_int(id, "id", 0, IVFLists::kMaxIds)));
            },
            py::arg("list"), py::arg("code"), py::arg("id"))
        .def("save", [](const IVFLists& s, io::Writer& w) { s.save(w); }, py::arg("writer"))
        .def_static(
            "load",
            [](const io::Reader& r, py::handle nlist, py::handle msub, py::handle nbits, py::handle total) {
                return IVFLists::load(r, arg_int(nlist, "nlist", 1, int64_t{1} << 28),
                                      CodeLayout{arg_int(msub, "m", 1, 1 << 20),
                                                 static_cast<int>(arg_int(nbits, "nbits", 4, 8))},
                                      arg_int(total, "total"));
            },
            py::arg("reader"), py::arg("nlist"), py::arg("m"), py::arg("nbits"), py::arg("total"));

    m.def(
        "scan",
        [](const std::string& code_type, const FloatArray& codebooks, const FloatArray& query, py::bytes codes,
           const U32Array& ids, py::handle n, double list_score, py::handle keep) {
            const ivfpq::PackedQuantizers qz = quantizers(codebooks);
            if (query.size() != qz.d) throw std::invalid_argument("query must have m * dsub components");
            const int64_t rows = arg_int(n, "n", 1);
            if (ids.size() < rows) throw std::invalid_argument("ids must have n entries");
            const std::string bytes = codes;  // the caller's layout: IVFLists.code_rows
            // (the layouts of the two built-in code types: enough to check that the bytes hold n rows)
            const CodeLayout layout{qz.m, code_type == "pq4" ? 4 : 8};
            if (bytes.size() < layout.bytes(rows)) throw std::invalid_argument("codes hold fewer than n rows");
            std::unique_ptr<ivfpq::Scanner> scanner = ivfpq::make_scanner(code_type, qz);
            scanner->start(query.data(), static_cast<size_t>(arg_int(keep, "keep", 1)));
            scanner->scan(reinterpret_cast<const uint8_t*>(bytes.data()), ids.data(), rows,
                          static_cast<float>(list_score), nullptr, 0);
            std::vector<Scored> found;
            scanner->take(found, true);
            return results(found);
        },
        py::arg("code_type"), py::arg("codebooks"), py::arg("query"), py::arg("codes"), py::arg("ids"), py::arg("n"),
        py::arg("list_score"), py::arg("keep"),
        "(scores, ids) best first: the scanner of code_type over n rows of codes (an IVFLists list's bytes) with "
        "the caller's ids");
    m.def(
        "code_rows",
        [](const IVFLists& s, py::handle list) {
            const int64_t l = list_of(s, list);
            return py::bytes(reinterpret_cast<const char*>(s.codes(l)), s.code_bytes(l));
        },
        py::arg("lists"), py::arg("list"), "the raw code bytes of one list, as a scanner reads them");

    m.def(
        "probe",
        [](const FloatArray& qc, const FloatArray& list_spread, const FloatArray& query, py::handle nprobe,
           double spread) {
            const int64_t nlist = qc.size();
            if (list_spread.size() != nlist) throw std::invalid_argument("list_spread must have one entry per list");
            ivfpq::Plan plan{};
            plan.nprobe = std::min(arg_int(nprobe, "nprobe", 1), nlist);
            plan.spread = static_cast<float>(spread);
            ivfpq::Prober prober;
            std::vector<Scored> lists;
            prober.probe(nlist, query.size(), list_spread.data(), plan, query.data(), qc.data(), lists);
            return results(lists);
        },
        py::arg("qc"), py::arg("list_spread"), py::arg("query"), py::arg("nprobe"), py::arg("spread"),
        "(order scores, lists) best first: the probe order of one query from its <q, c> over the lists");

    m.def(
        "rerank",
        [](const FloatArray& queries, const std::vector<std::vector<uint32_t>>& candidates, py::handle k,
           py::handle rerank, py::handle exact, py::object vectors, py::object sq_rows, py::object sq_lo,
           py::object sq_step, py::handle ntotal) {
            if (queries.ndim() != 2) throw std::invalid_argument("queries must be (n, d)");
            const int64_t nq = queries.shape(0), d = queries.shape(1);
            if (static_cast<int64_t>(candidates.size()) != nq)
                throw std::invalid_argument("candidates must have one list per query");
            ivfpq::RerankRows rows;
            rows.ntotal = arg_int(ntotal, "ntotal", 0, IVFLists::kMaxIds);
            FloatArray vf;
            U16Array vh;
            if (!vectors.is_none()) {
                rows.has_vectors = true;
                if (py::isinstance<py::array_t<uint16_t>>(vectors)) {
                    vh = vectors.cast<U16Array>();
                    rows.vectors = reinterpret_cast<const uint8_t*>(vh.data());
                    rows.vector_bytes = 2 * static_cast<size_t>(d);
                    if (vh.size() != rows.ntotal * d) throw std::invalid_argument("vectors must be (ntotal, d)");
                } else {
                    vf = vectors.cast<FloatArray>();
                    rows.vectors = reinterpret_cast<const uint8_t*>(vf.data());
                    rows.vectors_f32 = true;
                    rows.vector_bytes = 4 * static_cast<size_t>(d);
                    if (vf.size() != rows.ntotal * d) throw std::invalid_argument("vectors must be (ntotal, d)");
                }
            }
            U8Array sr;
            FloatArray lo, step;
            if (!sq_rows.is_none()) {
                rows.has_sq = true;
                sr = sq_rows.cast<U8Array>(), lo = sq_lo.cast<FloatArray>(), step = sq_step.cast<FloatArray>();
                if (sr.size() != rows.ntotal * static_cast<int64_t>(sq4::row_bytes(d)) || lo.size() != d ||
                    step.size() != d)
                    throw std::invalid_argument("sq_rows must be (ntotal, row_bytes), sq_lo and sq_step (d,)");
                rows.sq_rows = sr.data(), rows.sq_lo = lo.data(), rows.sq_step = step.data();
            }
            if (!rows.has_vectors && !rows.has_sq) throw std::invalid_argument("rerank needs vectors or sq_rows");
            for (const auto& c : candidates)
                for (uint32_t id : c)
                    if (id >= rows.ntotal) throw std::invalid_argument("a candidate is not below ntotal");
            ivfpq::PackedQuantizers qz;
            qz.nlist = 1, qz.d = d;
            const IVFLists lists(1, CodeLayout{1, 8});
            const ivfpq::IndexView ix{qz, nullptr, lists, rows};
            const int64_t kk = arg_int(k, "k", 1);
            const ivfpq::Plan plan =
                ivfpq::Plan::make(ix, kk, 1, arg_int(rerank, "rerank", 1), 0.f, arg_int(exact, "exact"));
            std::vector<std::vector<uint32_t>> ids = candidates;
            std::vector<uint32_t*> id_ptr;
            std::vector<uint32_t> count;
            for (auto& c : ids) {
                if (static_cast<int64_t>(c.size()) > plan.kc) throw std::invalid_argument("more candidates than rerank");
                id_ptr.push_back(c.data());
                count.push_back(static_cast<uint32_t>(c.size()));
            }
            py::array_t<float> scores({static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(kk)});
            py::array_t<int64_t> out({static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(kk)});
            std::fill(scores.mutable_data(), scores.mutable_data() + nq * kk, -std::numeric_limits<float>::infinity());
            std::fill(out.mutable_data(), out.mutable_data() + nq * kk, int64_t{-1});
            ivfpq::Reranker reranker;
            reranker.run(ivfpq::rerank_chain(ix, plan), plan, queries.data(), d, nq, id_ptr.data(), count.data(),
                         [&](int64_t j, const Scored* best, size_t nbest) {
                             for (size_t r = 0; r < nbest && static_cast<int64_t>(r) < kk; ++r)
                                 scores.mutable_data()[j * kk + r] = best[r].score,
                                 out.mutable_data()[j * kk + r] = best[r].id;
                         });
            return py::make_tuple(scores, out);
        },
        py::arg("queries"), py::arg("candidates"), py::arg("k"), py::arg("rerank"), py::arg("exact") = 0,
        py::arg("vectors") = py::none(), py::arg("sq_rows") = py::none(), py::arg("sq_lo") = py::none(),
        py::arg("sq_step") = py::none(), py::arg("ntotal") = 0,
        "(scores, ids) of the re-rank chain over each query's candidate ids: the 4-bit rows (sq_rows with exact > 0, "
        "or without vectors), then the vectors (fp32, or uint16 half bits)");
}

}  // namespace fastdpr::bind

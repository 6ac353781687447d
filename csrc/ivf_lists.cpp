#include "ivf_lists.h"

#include <cstring>
#include <stdexcept>

#include "pq4.h"

namespace fastdpr {

size_t CodeLayout::bytes(int64_t rows) const {
    return nbits == 4 ? pq4::packed_bytes(rows, m) : static_cast<size_t>(rows * m);
}

IVFLists::IVFLists(int64_t nlist, CodeLayout layout)
    : layout_(layout), off_(static_cast<size_t>(nlist), 0), room_(static_cast<size_t>(nlist), 0),
      ids_(static_cast<size_t>(nlist)) {
    if (layout.m < 1 || (layout.nbits != 8 && layout.nbits != 4))
        throw std::invalid_argument("ivf lists: codes are m >= 1 codes of 8 or 4 bits, got m=" +
                                    std::to_string(layout.m) + " nbits=" + std::to_string(layout.nbits));
}

size_t IVFLists::memory_bytes() const { return codes_.size() + sizeof(uint32_t) * static_cast<size_t>(total_); }

void IVFLists::relayout(const std::vector<int64_t>& room) {
    const size_t nl = ids_.size();
    if (room.size() != nl) throw std::invalid_argument("ivf lists: relayout needs one room per list");
    std::vector<size_t> off(nl);
    size_t total = 0;
    for (size_t l = 0; l < nl; ++l) {
        if (room[l] < size(static_cast<int64_t>(l)))
            throw std::invalid_argument("ivf lists: the room of list " + std::to_string(l) + " is below its size");
        off[l] = total;
        total = (total + layout_.bytes(room[l]) + 63) & ~size_t{63};  // each list from a cache line
    }
    std::vector<uint8_t, HugePageAllocator<uint8_t>> codes(total, 0);  // zeros: the padding of 4-bit blocks
    for (size_t l = 0; l < nl; ++l)
        if (const size_t bytes = code_bytes(static_cast<int64_t>(l)))
            std::memcpy(codes.data() + off[l], codes_.data() + off_[l], bytes);
    codes_.swap(codes);
    off_.swap(off);
    room_ = room;
}

void IVFLists::make_room(const std::vector<int64_t>& added) {
    const size_t nl = ids_.size();
    if (added.size() != nl) throw std::invalid_argument("ivf lists: make_room needs one count per list");
    std::vector<int64_t> len(nl);
    bool fits = true;
    for (size_t l = 0; l < nl; ++l) {
        len[l] = size(static_cast<int64_t>(l)) + added[l];
        fits = fits && len[l] <= room_[l];
    }
    if (fits) return;
    if (total_ > 0)
        for (int64_t& r : len) r += r / 2;
    relayout(len);
}

// The row goes at index size(l), inside the room relayout() made (4-bit: on zero padding).
void IVFLists::append(int64_t l, const uint8_t* row, uint32_t id) {
    const int64_t len = size(l);
    if (len >= room(l)) throw std::logic_error("ivf lists: list " + std::to_string(l) + " has no room left");
    uint8_t* dst = codes_.data() + off_[static_cast<size_t>(l)];
    const int64_t m = layout_.m;
    if (layout_.nbits == 8)
        std::memcpy(dst + len * m, row, static_cast<size_t>(m));
    else
        for (int64_t j = 0; j < m; ++j) pq4::set_code(dst, m, len, j, row[j]);
    ids_[static_cast<size_t>(l)].push_back(id);
    ++total_;
}

void IVFLists::save(io::Writer& w) const {
    const int64_t nl = nlist();
    std::vector<int64_t> offsets(static_cast<size_t>(nl) + 1, 0);
    for (int64_t l = 0; l < nl; ++l) offsets[l + 1] = offsets[l] + size(l);
    std::vector<uint8_t> all_codes;
    std::vector<int64_t> all_ids;  // int64 in the file
    size_t bytes = 0;
    for (int64_t l = 0; l < nl; ++l) bytes += code_bytes(l);
    all_codes.reserve(bytes);
    all_ids.reserve(static_cast<size_t>(total_));
    for (int64_t l = 0; l < nl; ++l) {
        all_codes.insert(all_codes.end(), codes(l), codes(l) + code_bytes(l));
        all_ids.insert(all_ids.end(), ids_[l].begin(), ids_[l].end());
    }
    w.add_vector("list_offsets", offsets);
    w.add_vector("codes", all_codes);
    w.add_vector("list_pos", all_ids);
}

IVFLists IVFLists::load(const io::Reader& rd, int64_t nlist, CodeLayout layout, int64_t n) {
    if (n < 0 || n > kMaxIds) rd.fail("the row count is beyond what 4-byte ids can name");
    const int64_t* off = rd.array<int64_t>("list_offsets", static_cast<size_t>(nlist + 1));
    if (off[0] != 0 || off[nlist] != n) rd.fail("list offsets do not cover the vectors");
    for (int64_t l = 0; l < nlist; ++l)
        if (off[l + 1] < off[l]) rd.fail("list offsets are not increasing");
    size_t all_code_bytes = 0;
    for (int64_t l = 0; l < nlist; ++l) all_code_bytes += layout.bytes(off[l + 1] - off[l]);
    const uint8_t* codes = rd.array<uint8_t>("codes", all_code_bytes);
    const int64_t* pos = rd.array<int64_t>("list_pos", static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        if (pos[i] < 0 || pos[i] >= n) rd.fail("list position out of range");
    {  // every row filed exactly once (a repeated id would come back twice from one search)
        std::vector<bool> seen(static_cast<size_t>(n), false);
        for (int64_t i = 0; i < n; ++i) {
            if (seen[static_cast<size_t>(pos[i])]) rd.fail("list positions repeat a vector");
            seen[static_cast<size_t>(pos[i])] = true;
        }
    }
    IVFLists lists(nlist, layout);
    std::vector<int64_t> len(static_cast<size_t>(nlist));
    for (int64_t l = 0; l < nlist; ++l) len[l] = off[l + 1] - off[l];
    lists.relayout(len);  // empty lists of the file's sizes
    size_t at = 0;
    for (int64_t l = 0; l < nlist; ++l) {
        lists.ids_[l].assign(pos + off[l], pos + off[l + 1]);  // < n <= kMaxIds: checked above
        const size_t bytes = lists.code_bytes(l);
        // (lists that are all empty have no code buffer at all: memcpy must not see its null pointer)
        if (bytes) std::memcpy(lists.codes_.data() + lists.off_[l], codes + at, bytes);
        at += bytes;
    }
    lists.total_ = n;
    return lists;
}

}  // namespace fastdpr

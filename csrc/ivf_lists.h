// The inverted lists of an IVF index, as a store of their own: per list the code rows of its members and their
// ids, in one allocation on huge pages with room to append. The index that owns it decides which list a row goes
// to and what its codes are; the search reads a list's (codes, ids, size) from here and hands them to a scanner
// (csrc/ivfpq_search.h), which never sees the index.
//
// A row's id is its position in the index (the order rows were added): 4 bytes, hence at most kMaxIds rows. A list's
// codes are laid out by the code type (CodeLayout): 8-bit codes one row of m bytes after the other, 4-bit codes in
// pq4 blocks of 32 rows (csrc/pq4.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "huge_alloc.h"
#include "io.h"

namespace fastdpr {

// How a list lays out its code rows.
struct CodeLayout {
    int64_t m;  // codes per row
    int nbits;  // 8: a byte per code; 4: pq4 blocks

    size_t bytes(int64_t rows) const;  // bytes of `rows` rows of one list
    // The name scanners are registered under (csrc/ivfpq_search.h): "pq8" or "pq4".
    std::string code_type() const { return "pq" + std::to_string(nbits); }
};

class IVFLists {
public:
    static constexpr int64_t kMaxIds = (int64_t{1} << 32) - 1;  // ids are uint32

    // nlist empty lists (no room yet). nbits: 8 or 4; m >= 1.
    IVFLists(int64_t nlist, CodeLayout layout);

    int64_t nlist() const { return static_cast<int64_t>(ids_.size()); }
    const CodeLayout& layout() const { return layout_; }
    int64_t size(int64_t l) const { return static_cast<int64_t>(ids_[static_cast<size_t>(l)].size()); }
    int64_t room(int64_t l) const { return room_[static_cast<size_t>(l)]; }  // rows list l holds before a relayout
    int64_t total() const { return total_; }  // rows in all lists
    // list l's code rows (code_bytes(l) bytes, 64-byte aligned; 4-bit: zero padding after the last row)
    const uint8_t* codes(int64_t l) const { return codes_.data() + off_[static_cast<size_t>(l)]; }
    size_t code_bytes(int64_t l) const { return layout_.bytes(size(l)); }
    const uint32_t* ids(int64_t l) const { return ids_[static_cast<size_t>(l)].data(); }
    const std::vector<uint32_t>& id_vector(int64_t l) const { return ids_[static_cast<size_t>(l)]; }
    size_t memory_bytes() const;  // codes (with their room) + ids

    // Room for added[l] more rows in list l. The lists are laid out again (one new allocation, one copy of the
    // codes) only when one of them runs out: the first time with exact room, later with half as much again, so
    // that adding in many batches copies the codes a logarithmic number of times, not once per batch.
    void make_room(const std::vector<int64_t>& added);
    // Lays the lists out again with room for room[l] >= size(l) rows in list l.
    void relayout(const std::vector<int64_t>& room);
    // Appends one row (layout().m codes) with its id to list l, inside the room (std::logic_error when none is left).
    void append(int64_t l, const uint8_t* code_row, uint32_t id);

    // The sections list_offsets (int64, nlist + 1), codes (every list's rows, one list after the other) and list_pos
    // (int64 ids: the format predates 4-byte ids in memory).
    void save(io::Writer& writer) const;
    // The same sections, every size checked against nlist, the layout and `total` (the index's row count), every id
    // in [0, total) and given once; a bad file is an io::FormatError naming what is wrong.
    static IVFLists load(const io::Reader& reader, int64_t nlist, CodeLayout layout, int64_t total);

private:
    CodeLayout layout_;
    // Every list's codes in one allocation on huge pages, list l from off_[l] (64-byte aligned): a search streams
    // codes from DRAM, and with 4 KiB pages it would also miss the TLB once per page.
    std::vector<uint8_t, HugePageAllocator<uint8_t>> codes_;
    std::vector<size_t> off_;
    std::vector<int64_t> room_;
    std::vector<std::vector<uint32_t>> ids_;
    int64_t total_ = 0;
};

}  // namespace fastdpr

// The index file format: one file, a versioned header, named sections (64-byte aligned so large vector blocks
// can be memory-mapped in place), a section table and CRC-32 checksums (zlib's polynomial, so Python's
// zlib.crc32 checks the same numbers; fastdpr/index/fileformat.py is the pure-Python twin of this file).
//
// Layout (little-endian):
//   [0, 64)   header: magic "FDPRIDX\0" | u32 version | u32 n_sections | char type[16] | u64 file_size
//             | u64 table_offset | u32 table_crc | u32 header_crc (crc of bytes [0, 56)) | u64 reserved
//   ...       sections, each starting at a multiple of 64
//   table     n_sections x 48 bytes: char name[16] | u64 offset | u64 length | u32 crc | u32 reserved | u64 reserved
//
// The reader checks every offset and length against the file size and every checksum before anything is used;
// any mismatch is a FormatError with a message naming the file and what is wrong, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace fastdpr::io {

constexpr char kMagic[8] = {'F', 'D', 'P', 'R', 'I', 'D', 'X', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 64;
constexpr size_t kEntrySize = 48;
constexpr size_t kAlign = 64;
constexpr size_t kNameMax = 15;  // section and type names: at most 15 bytes + NUL

// A file that is not a (valid) fastdpr index. Bound to Python ValueError.
class FormatError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// Writes to its own `path.tmp-<pid>-<random>` and renames it over `path` on commit(), so readers never see half a
// file, and two writers of one path never write into one temporary file.
class Writer {
public:
    Writer(std::string path, std::string type);
    ~Writer();  // without commit(), the temporary file is removed
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;

    void add(const std::string& name, const void* data, size_t bytes);
    template <class T>
    void add_vector(const std::string& name, const std::vector<T>& v) {
        add(name, v.data(), v.size() * sizeof(T));
    }
    // Small key=value metadata, stored as the text section "meta".
    void meta(const std::string& key, const std::string& value);
    void meta(const std::string& key, int64_t value) { meta(key, std::to_string(value)); }
    void meta_float(const std::string& key, double value);
    void commit();

private:
    struct Entry {
        std::string name;
        uint64_t offset, length;
        uint32_t crc;
    };
    void write_at_end(const void* data, size_t bytes);
    void pad_to_alignment();
    std::string path_, tmp_, type_;
    std::FILE* fp_ = nullptr;
    uint64_t pos_ = 0;
    std::vector<Entry> entries_;
    std::vector<std::pair<std::string, std::string>> meta_;
    bool committed_ = false;
};

// A read-only memory mapping of the whole file, shared by the sections that point into it.
class Mapping {
public:
    explicit Mapping(const std::string& path);
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    // Drops the whole pages of [p, p + n) from this process's resident set (they stay in the page cache and come
    // back on the next read). The checks at open read every byte of a file; without this a mapped 40 GB index
    // would count its checked pages as resident memory until the kernel reclaims them.
    void release(const void* p, size_t n) const;
    // Tells the kernel that [p, p + n) is read at random (re-rank rows): a page fault then reads that page, not
    // the read-around window a sequential reader wants, which on a file larger than memory would fill the page
    // cache with rows no search asked for.
    void advise_random(const void* p, size_t n) const;

private:
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

struct Section {
    const uint8_t* data;
    size_t length;
};

class Reader {
public:
    // Maps and validates the whole file (header, table, every section's checksum when `verify`).
    explicit Reader(const std::string& path, bool verify = true);

    const std::string& path() const { return path_; }
    const std::string& type() const { return type_; }
    uint32_t version() const { return version_; }
    bool has(const std::string& name) const { return sections_.count(name) != 0; }
    std::vector<std::string> names() const;
    Section section(const std::string& name) const;  // throws FormatError when absent

    // The section as `count` elements of T (its length must be exactly count * sizeof(T)).
    template <class T>
    const T* array(const std::string& name, size_t count) const {
        const Section s = section(name);
        if (count != 0 && s.length / sizeof(T) != count) fail("section '" + name + "' has the wrong length");
        if (s.length != count * sizeof(T)) fail("section '" + name + "' has the wrong length");
        return reinterpret_cast<const T*>(s.data);
    }
    template <class T>
    std::vector<T> copy(const std::string& name, size_t count) const {
        const T* p = array<T>(name, count);
        return std::vector<T>(p, p + count);
    }

    bool has_meta(const std::string& key) const { return meta_.count(key) != 0; }
    std::string meta(const std::string& key) const;
    int64_t meta_int(const std::string& key) const;
    // An integer key that must lie in [lo, hi]; anything else is a FormatError.
    int64_t meta_int(const std::string& key, int64_t lo, int64_t hi) const;
    double meta_float(const std::string& key) const;

    // Keeps the mapping alive for memory-mapped arrays that outlive the Reader.
    std::shared_ptr<Mapping> mapping() const { return map_; }

    [[noreturn]] void fail(const std::string& what) const;
    // NaN or Inf among the n numbers of a section is a FormatError: checksums vouch only for the bytes, and such a
    // value in a vector, centroid or codeword makes every score it enters NaN (found nothing) or Inf.
    void check_finite(const std::string& section, const float* p, size_t n) const;
    void check_finite_half(const std::string& section, const uint16_t* p, size_t n) const;  // IEEE half bits

private:
    // The checks read a section in blocks and release each block's pages (Mapping::release) as they go.
    static constexpr size_t kCheckBlock = size_t{64} << 20;
    uint32_t checked_crc32(const uint8_t* p, size_t n) const;

    std::string path_, type_;
    uint32_t version_ = 0;
    std::shared_ptr<Mapping> map_;
    std::map<std::string, Section> sections_;
    std::map<std::string, std::string> meta_;
};

// Reads only the header's type tag (cheap; validates magic and version).
std::string peek_type(const std::string& path);

}  // namespace fastdpr::io

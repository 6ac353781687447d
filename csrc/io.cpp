#include "io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

namespace fastdpr::io {

// ---------------------------------------------------------------------------------------------------------------
// CRC-32 (IEEE, reflected 0xEDB88320), slicing by 8 bytes (eight table lookups per 8 bytes instead of one per byte),
// without a dependency on zlib's headers.

namespace {
struct CrcTables {
    uint32_t t[8][256];
    CrcTables() {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; ++i)
            for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
    }
};
const CrcTables& tables() {
    static const CrcTables tabs;
    return tabs;
}

void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
uint64_t get_u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

void check_name(const std::string& name, const char* what) {
    if (name.empty() || name.size() > kNameMax || name.find('\0') != std::string::npos)
        throw std::invalid_argument(std::string(what) + " name must be 1.." + std::to_string(kNameMax) +
                                    " bytes: '" + name + "'");
}

std::string fixed_string(const uint8_t* p, size_t n) {
    size_t len = 0;
    while (len < n && p[len] != 0) ++len;
    return std::string(reinterpret_cast<const char*>(p), len);
}
}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
    const auto& T = tables().t;
    const uint8_t* p = static_cast<const uint8_t*>(data);
    crc = ~crc;
    while (n >= 8) {
        const uint32_t lo = get_u32(p) ^ crc;
        const uint32_t hi = get_u32(p + 4);
        crc = T[7][lo & 0xff] ^ T[6][(lo >> 8) & 0xff] ^ T[5][(lo >> 16) & 0xff] ^ T[4][lo >> 24] ^
              T[3][hi & 0xff] ^ T[2][(hi >> 8) & 0xff] ^ T[1][(hi >> 16) & 0xff] ^ T[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = T[0][(crc ^ *p++) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

// ---------------------------------------------------------------------------------------------------------------
// Writer

Writer::Writer(std::string path, std::string type) : path_(std::move(path)), type_(std::move(type)) {
    check_name(type_, "type");
    // One temporary file per writer, never shared: two writers of one path (threads of one process, too) each
    // fill their own and the last rename wins with a whole file. The pid leads, so that fastdpr/atomic.py can tell
    // a dead writer's leftovers from a live one's; O_EXCL makes a collision of the random part a retry, not a share.
    static std::atomic<uint64_t> counter{0};
    std::random_device entropy;
    int fd = -1;
    for (int attempt = 0; fd < 0; ++attempt) {
        const uint64_t salt = (uint64_t{entropy()} << 32 | entropy()) ^
                              (std::hash<std::thread::id>{}(std::this_thread::get_id()) * 0x9e3779b97f4a7c15ULL) ^
                              counter.fetch_add(1);
        char suffix[32];
        std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(salt));
        tmp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + suffix;
        fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && (errno != EEXIST || attempt >= 100))
            throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(errno));
    }
    fp_ = ::fdopen(fd, "wb");
    if (!fp_) {
        const int err = errno;
        ::close(fd);
        std::remove(tmp_.c_str());
        throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(err));
    }
    uint8_t zeros[kHeaderSize] = {0};
    write_at_end(zeros, kHeaderSize);  // the real header is written by commit()
}

Writer::~Writer() {
    if (fp_) std::fclose(fp_);
    if (!committed_) std::remove(tmp_.c_str());
}

void Writer::write_at_end(const void* data, size_t bytes) {
    if (bytes && std::fwrite(data, 1, bytes, fp_) != bytes)
        throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(errno));
    pos_ += bytes;
}

void Writer::pad_to_alignment() {
    static const uint8_t zeros[kAlign] = {0};
    const size_t pad = (kAlign - pos_ % kAlign) % kAlign;
    write_at_end(zeros, pad);
}

void Writer::add(const std::string& name, const void* data, size_t bytes) {
    check_name(name, "section");
    for (const Entry& e : entries_)
        if (e.name == name) throw std::invalid_argument("duplicate section '" + name + "'");
    pad_to_alignment();
    Entry e{name, pos_, bytes, crc32(data, bytes)};
    write_at_end(data, bytes);
    entries_.push_back(e);
}

void Writer::meta(const std::string& key, const std::string& value) {
    if (key.find_first_of("=\n") != std::string::npos || value.find('\n') != std::string::npos)
        throw std::invalid_argument("bad metadata key or value: " + key);
    meta_.emplace_back(key, value);
}

void Writer::meta_float(const std::string& key, double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    meta(key, std::string(buf));
}

void Writer::commit() {
    if (committed_) throw std::logic_error("Writer::commit called twice");
    if (!meta_.empty()) {
        std::string text;
        for (const auto& kv : meta_) text += kv.first + "=" + kv.second + "\n";
        add("meta", text.data(), text.size());
    }
    pad_to_alignment();
    const uint64_t table_offset = pos_;
    std::vector<uint8_t> table(entries_.size() * kEntrySize, 0);
    for (size_t i = 0; i < entries_.size(); ++i) {
        uint8_t* p = table.data() + i * kEntrySize;
        std::memcpy(p, entries_[i].name.data(), entries_[i].name.size());
        put_u64(p + 16, entries_[i].offset);
        put_u64(p + 24, entries_[i].length);
        put_u32(p + 32, entries_[i].crc);
    }
    write_at_end(table.data(), table.size());
    const uint64_t file_size = pos_;

    uint8_t header[kHeaderSize] = {0};
    std::memcpy(header, kMagic, 8);
    put_u32(header + 8, kVersion);
    put_u32(header + 12, static_cast<uint32_t>(entries_.size()));
    std::memcpy(header + 16, type_.data(), type_.size());
    put_u64(header + 32, file_size);
    put_u64(header + 40, table_offset);
    put_u32(header + 48, crc32(table.data(), table.size()));
    put_u32(header + 52, crc32(header, 52));
    if (std::fseek(fp_, 0, SEEK_SET) != 0) throw std::runtime_error("cannot seek in " + tmp_);
    if (std::fwrite(header, 1, kHeaderSize, fp_) != kHeaderSize || std::fflush(fp_) != 0 ||
        ::fsync(::fileno(fp_)) != 0)
        throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(errno));
    std::fclose(fp_);
    fp_ = nullptr;
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
        throw std::runtime_error("cannot rename " + tmp_ + " to " + path_ + ": " + std::strerror(errno));
    committed_ = true;
}

// ---------------------------------------------------------------------------------------------------------------
// Mapping / Reader

namespace {
// Opens `path` for reading if it is a regular file. O_NONBLOCK: opening a FIFO would wait for a writer forever (a
// device could block too); it is refused after the open returns, and means nothing for a regular file.
int open_regular(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw std::runtime_error("cannot stat " + path + ": " + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw FormatError(path + ": not a valid fastdpr index: not a regular file");
    }
    return fd;
}
}  // namespace

Mapping::Mapping(const std::string& path) {
    const int fd = open_regular(path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw std::runtime_error("cannot stat " + path + ": " + std::strerror(err));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            ::close(fd);
            throw std::runtime_error("cannot map " + path + ": " + std::strerror(errno));
        }
        data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
}

void Mapping::release(const void* p, size_t n) const {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const auto hi = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // advice: failure changes nothing
}

void Mapping::advise_random(const void* p, size_t n) const {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto lo = reinterpret_cast<uintptr_t>(p) / page * page;
    const auto hi = reinterpret_cast<uintptr_t>(p) + n;
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_RANDOM);  // advice only
}

Mapping::~Mapping() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void Reader::fail(const std::string& what) const { throw FormatError(path_ + ": not a valid fastdpr index: " + what); }

Reader::Reader(const std::string& path, bool verify) : path_(path) {
    map_ = std::make_shared<Mapping>(path);
    const uint8_t* base = map_->data();
    const size_t size = map_->size();
    if (size < kHeaderSize) fail("file is truncated (" + std::to_string(size) + " bytes)");
    if (std::memcmp(base, kMagic, 8) != 0) fail("bad magic number");
    if (get_u32(base + 52) != crc32(base, 52)) fail("header checksum mismatch (corrupted header)");
    version_ = get_u32(base + 8);
    if (version_ != kVersion)
        fail("format version " + std::to_string(version_) + " (this build reads " + std::to_string(kVersion) + ")");
    const uint64_t n_sections = get_u32(base + 12);
    type_ = fixed_string(base + 16, 16);
    const uint64_t file_size = get_u64(base + 32);
    const uint64_t table_offset = get_u64(base + 40);
    if (file_size != size)
        fail("file is " + std::to_string(size) + " bytes but its header says " + std::to_string(file_size) +
             " (truncated or appended to)");
    if (table_offset < kHeaderSize || table_offset > size || n_sections > (size - table_offset) / kEntrySize ||
        table_offset + n_sections * kEntrySize != size)
        fail("section table out of bounds");
    const uint8_t* table = base + table_offset;
    if (get_u32(base + 48) != crc32(table, n_sections * kEntrySize)) fail("section table checksum mismatch");
    for (uint64_t i = 0; i < n_sections; ++i) {
        const uint8_t* e = table + i * kEntrySize;
        const std::string name = fixed_string(e, 16);
        const uint64_t off = get_u64(e + 16), len = get_u64(e + 24);
        if (name.empty() || off < kHeaderSize || off > table_offset || len > table_offset - off)
            fail("section '" + name + "' out of bounds");
        if (sections_.count(name)) fail("duplicate section '" + name + "'");
        if (verify && get_u32(e + 32) != checked_crc32(base + off, len)) fail("checksum mismatch in section '" + name + "'");
        sections_[name] = Section{base + off, static_cast<size_t>(len)};
    }
    // Every byte outside the sections is padding and must be zero, and sections must not overlap: then a flipped
    // byte anywhere in the file is caught (by a checksum or here).
    for (size_t i = 56; i < kHeaderSize; ++i)
        if (base[i] != 0) fail("reserved header bytes are not zero");
    {
        std::vector<std::pair<uint64_t, uint64_t>> spans;
        for (const auto& kv : sections_)
            spans.emplace_back(static_cast<uint64_t>(kv.second.data - base), kv.second.length);
        std::sort(spans.begin(), spans.end());
        uint64_t pos = kHeaderSize;
        for (const auto& sp : spans) {
            if (sp.first < pos) fail("sections overlap");
            for (uint64_t b = pos; b < sp.first; ++b)
                if (base[b] != 0) fail("padding bytes are not zero");
            pos = sp.first + sp.second;
        }
        for (uint64_t b = pos; b < table_offset; ++b)
            if (base[b] != 0) fail("padding bytes are not zero");
        for (uint64_t i = 0; i < n_sections; ++i) {
            const uint8_t* e = table + i * kEntrySize;
            for (size_t b = 36; b < kEntrySize; ++b)
                if (e[b] != 0) fail("reserved table bytes are not zero");
            const std::string name = fixed_string(e, 16);
            for (size_t b = name.size(); b < 16; ++b)
                if (e[b] != 0) fail("bad section name");
        }
        for (size_t b = type_.size(); b < 16; ++b)
            if (base[16 + b] != 0) fail("bad type tag");
    }
    if (has("meta")) {
        const Section s = section("meta");
        std::string text(reinterpret_cast<const char*>(s.data), s.length);
        std::istringstream in(text);
        std::string line;
        while (std::getline(in, line)) {
            const size_t eq = line.find('=');
            if (eq == std::string::npos) fail("bad metadata line");
            meta_[line.substr(0, eq)] = line.substr(eq + 1);
        }
    }
}

uint32_t Reader::checked_crc32(const uint8_t* p, size_t n) const {
    uint32_t crc = 0;
    for (size_t at = 0; at < n; at += kCheckBlock) {
        const size_t len = std::min(kCheckBlock, n - at);
        crc = crc32(p + at, len, crc);
        map_->release(p + at, len);
    }
    return crc;
}

void Reader::check_finite(const std::string& section, const float* p, size_t n) const {
    bool finite = true;
    for (size_t at = 0; at < n; at += kCheckBlock / 4) {
        const size_t end = std::min(n, at + kCheckBlock / 4);
        for (size_t i = at; i < end; ++i) {
            uint32_t u;
            std::memcpy(&u, p + i, 4);
            finite &= (u & 0x7f800000u) != 0x7f800000u;  // exponent all ones: Inf or NaN
        }
        map_->release(p + at, (end - at) * 4);
    }
    if (!finite) fail("section '" + section + "' holds NaN or Inf");
}

void Reader::check_finite_half(const std::string& section, const uint16_t* p, size_t n) const {
    bool finite = true;
    for (size_t at = 0; at < n; at += kCheckBlock / 2) {
        const size_t end = std::min(n, at + kCheckBlock / 2);
        for (size_t i = at; i < end; ++i) finite &= (p[i] & 0x7c00u) != 0x7c00u;
        map_->release(p + at, (end - at) * 2);
    }
    if (!finite) fail("section '" + section + "' holds NaN or Inf");
}

std::vector<std::string> Reader::names() const {
    std::vector<std::string> out;
    for (const auto& kv : sections_) out.push_back(kv.first);
    return out;
}

Section Reader::section(const std::string& name) const {
    auto it = sections_.find(name);
    if (it == sections_.end()) fail("missing section '" + name + "'");
    return it->second;
}

std::string Reader::meta(const std::string& key) const {
    auto it = meta_.find(key);
    if (it == meta_.end()) fail("missing metadata '" + key + "'");
    return it->second;
}

int64_t Reader::meta_int(const std::string& key) const {
    const std::string v = meta(key);
    try {
        size_t used = 0;
        const long long x = std::stoll(v, &used);
        if (used != v.size()) fail("metadata '" + key + "' is not an integer");
        return x;
    } catch (const std::logic_error&) {
        fail("metadata '" + key + "' is not an integer");
    }
}

int64_t Reader::meta_int(const std::string& key, int64_t lo, int64_t hi) const {
    const int64_t v = meta_int(key);
    if (v < lo || v > hi) fail("metadata '" + key + "' = " + std::to_string(v) + " is out of range");
    return v;
}

double Reader::meta_float(const std::string& key) const {
    const std::string v = meta(key);
    try {
        size_t used = 0;
        const double x = std::stod(v, &used);
        if (used != v.size()) fail("metadata '" + key + "' is not a number");
        return x;
    } catch (const std::logic_error&) {
        fail("metadata '" + key + "' is not a number");
    }
}

std::string peek_type(const std::string& path) {
    const int fd = open_regular(path);
    uint8_t header[kHeaderSize];
    size_t got = 0;
    while (got < kHeaderSize) {
        const ssize_t r = ::read(fd, header + got, kHeaderSize - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += static_cast<size_t>(r);
    }
    ::close(fd);
    if (got < kHeaderSize) throw FormatError(path + ": not a valid fastdpr index: file is truncated");
    if (std::memcmp(header, kMagic, 8) != 0) throw FormatError(path + ": not a valid fastdpr index: bad magic number");
    if (get_u32(header + 52) != crc32(header, 52))
        throw FormatError(path + ": not a valid fastdpr index: header checksum mismatch");
    return fixed_string(header + 16, 16);
}

}  // namespace fastdpr::io

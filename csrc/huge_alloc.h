// An allocator for large arrays read at scattered rows (the full vectors an IVF-PQ re-rank scores): blocks of
// 2 MiB or more are 2 MiB-aligned and marked for transparent huge pages before their first touch, so that a row
// read does not also miss the TLB (4 KiB pages: one page walk per re-ranked row). Only a hint: where the kernel gives no huge pages it is an
// ordinary aligned allocation.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fastdpr {

template <class T>
struct HugePageAllocator {
    using value_type = T;
    static constexpr size_t kHuge = size_t{2} << 20;

    HugePageAllocator() = default;
    template <class U>
    HugePageAllocator(const HugePageAllocator<U>&) {}

    T* allocate(size_t n) {
        const size_t bytes = n * sizeof(T);
        if (bytes < kHuge) {
            if (void* p = std::malloc(bytes ? bytes : 1)) return static_cast<T*>(p);
            throw std::bad_alloc();
        }
        const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;  // aligned_alloc wants a multiple
        void* p = std::aligned_alloc(kHuge, rounded);
        if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
        madvise(p, rounded, MADV_HUGEPAGE);  // advice only: its failure changes nothing but speed
#endif
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t) { std::free(p); }
};

template <class T, class U>
bool operator==(const HugePageAllocator<T>&, const HugePageAllocator<U>&) { return true; }
template <class T, class U>
bool operator!=(const HugePageAllocator<T>&, const HugePageAllocator<U>&) { return false; }

// An allocator for the small tables that SIMD loads read a row at a time (the packed centroids and codebooks of
// IVF-PQ): 64-byte aligned, so that a 64-byte row of a packed panel is one cache line, not two. malloc aligns to
// 16 bytes, and its mmapped blocks start 16 bytes into a page: the coarse probe and each query's 4-bit table then
// read twice the lines they need (under callgrind's cache model, 256 first-level misses per query's table instead of
// 128: benchmarks/results/ivfpq_stages_side_by_side.md), and how often depended on where the heap put the table.
template <class T>
struct LineAlignedAllocator {
    using value_type = T;
    static constexpr size_t kLine = 64;

    LineAlignedAllocator() = default;
    template <class U>
    LineAlignedAllocator(const LineAlignedAllocator<U>&) {}

    T* allocate(size_t n) {
        const size_t rounded = (n * sizeof(T) + kLine - 1) / kLine * kLine;  // aligned_alloc wants a multiple
        if (void* p = std::aligned_alloc(kLine, rounded ? rounded : kLine)) return static_cast<T*>(p);
        throw std::bad_alloc();
    }
    void deallocate(T* p, size_t) { std::free(p); }
};

template <class T, class U>
bool operator==(const LineAlignedAllocator<T>&, const LineAlignedAllocator<U>&) { return true; }
template <class T, class U>
bool operator!=(const LineAlignedAllocator<T>&, const LineAlignedAllocator<U>&) { return false; }

// An allocator for a call's large scratch arrays (a search's batch buffers): blocks of 64 KiB or more are mapped
// on their own and unmapped when freed, so that they go back to the system when the call ends. malloc keeps freed
// blocks for reuse, and its dynamic mmap threshold soon puts blocks of a few MiB on the heap, where a compressed
// index's process would carry them as resident memory after every large search.
template <class T>
struct ReturnedAllocator {
    using value_type = T;
    static constexpr size_t kMapped = size_t{64} << 10;

    ReturnedAllocator() = default;
    template <class U>
    ReturnedAllocator(const ReturnedAllocator<U>&) {}

    T* allocate(size_t n) {
        const size_t bytes = n * sizeof(T);
#if defined(__linux__)
        if (bytes >= kMapped) {
            void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) throw std::bad_alloc();
            return static_cast<T*>(p);
        }
#endif
        if (void* p = std::malloc(bytes ? bytes : 1)) return static_cast<T*>(p);
        throw std::bad_alloc();
    }
    void deallocate(T* p, size_t n) {
#if defined(__linux__)
        if (n * sizeof(T) >= kMapped) {
            munmap(p, n * sizeof(T));
            return;
        }
#endif
        std::free(p);
    }
};

template <class T, class U>
bool operator==(const ReturnedAllocator<T>&, const ReturnedAllocator<U>&) { return true; }
template <class T, class U>
bool operator!=(const ReturnedAllocator<T>&, const ReturnedAllocator<U>&) { return false; }

}  // namespace fastdpr

// Thread counts and exceptions in OpenMP loops.
//
// An exception that leaves an OpenMP parallel region calls std::terminate (the process dies), so every parallel
// loop runs its body through ParallelErrors::run: the first exception is caught on the worker, the remaining
// iterations are skipped, and rethrow() raises it on the calling thread after the region.
//
// Thread counts come from users (a `threads=` argument); a count far beyond the machine makes the OpenMP runtime
// try to create that many threads (and crash when it cannot), so resolve_threads() checks them against
// max_threads() first.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace fastdpr {

// The largest thread count accepted: 64 per core, and never above 4096.
inline int max_threads() {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    return static_cast<int>(std::min<unsigned long>(4096ul, 64ul * cores));
}

// `requested` threads, or the OpenMP default when 0; a negative count or one above max_threads() is an error.
inline int resolve_threads(long long requested) {
    if (requested < 0)
        throw std::invalid_argument("threads must be >= 0 (0: all cores), got " + std::to_string(requested));
    if (requested > max_threads())
        throw std::invalid_argument("threads=" + std::to_string(requested) +
                                    " is more than this machine can use (at most " + std::to_string(max_threads()) +
                                    ": 64 per core)");
#ifdef _OPENMP
    if (requested == 0) return std::min(omp_get_max_threads(), max_threads());
    return static_cast<int>(requested);
#else
    return 1;
#endif
}

// This thread's number in the current parallel region (0 outside one).
inline int thread_index() {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

// Catches the first exception of a parallel loop's iterations and rethrows it on the caller.
class ParallelErrors {
public:
    // Runs f() unless an earlier iteration failed; never lets an exception out.
    template <class F>
    void run(F&& f) noexcept {
        if (failed_.load(std::memory_order_relaxed)) return;
        try {
            f();
        } catch (...) {
            std::lock_guard<std::mutex> g(mu_);
            if (!first_) first_ = std::current_exception();
            failed_.store(true, std::memory_order_relaxed);
        }
    }
    bool failed() const { return failed_.load(std::memory_order_relaxed); }
    // On the calling thread, after the parallel region.
    void rethrow() {
        if (first_) std::rethrow_exception(first_);
    }

private:
    std::atomic<bool> failed_{false};
    std::mutex mu_;
    std::exception_ptr first_;
};

}  // namespace fastdpr

// The C ABI from C++17: see lifecycle_tests.h for the checks (compiled as C++ here),
// plus what a C++ engine does: RAII ownership of the pool, std::thread.
#include "lifecycle_tests.h"

#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

static_assert(std::is_standard_layout<FlareSnapshot>::value, "FlareSnapshot is plain C");
static_assert(sizeof(FlarePoolConfig) == 112, "FlarePoolConfig layout");
static_assert(offsetof(FlarePoolConfig, record_path) == 96, "FlarePoolConfig layout");
static_assert(offsetof(FlarePoolConfig, cross_stream_reuse) == 64, "FlarePoolConfig layout");
static_assert(offsetof(FlarePoolConfig, segment_whole_threshold_bytes) == 72,
              "FlarePoolConfig layout");
static_assert(offsetof(FlarePoolConfig, thread_cache_entries) == 80, "FlarePoolConfig layout");
static_assert(offsetof(FlarePoolConfig, thread_cache_bytes) == 88, "FlarePoolConfig layout");
static_assert(FLARE_THREAD_CACHE_OFF == UINT32_MAX, "FLARE_THREAD_CACHE_OFF");
static_assert(sizeof(FlareStream) == sizeof(void *), "FlareStream is a CUstream");
static_assert(sizeof(FlareSnapshot) == 472, "FlareSnapshot layout");
static_assert(offsetof(FlareSnapshot, segment_lent_bytes) == 360, "FlareSnapshot layout");
static_assert(offsetof(FlareSnapshot, thread_cache_count) == 368, "FlareSnapshot layout");
static_assert(offsetof(FlareSnapshot, thread_cache_bytes) == 376, "FlareSnapshot layout");
static_assert(offsetof(FlareSnapshot, thread_cache_hits) == 384, "FlareSnapshot layout");
static_assert(offsetof(FlareSnapshot, remote_frees) == 392, "FlareSnapshot layout");
static_assert(offsetof(FlareSnapshot, reuse_forced_hits) == 240, "FlareSnapshot layout");
static_assert(offsetof(FlareSnapshot, segment_count) == 304, "FlareSnapshot layout");
static_assert(offsetof(FlareSnapshot, block_free_bytes) == 344, "FlareSnapshot layout");
static_assert(FLARE_REUSE_SEGMENTS == 3, "FlareReusePolicy numbers");
static_assert(sizeof(FlareDestroyReport) == 40, "FlareDestroyReport layout");
static_assert(offsetof(FlarePoolConfig, best_fit_max_waste_percent) == 60, "FlarePoolConfig layout");

static void run_parallel(void *(*fn)(void *), void *args[], int n) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; i++) {
        threads.emplace_back(fn, args[i]);
    }
    for (auto &t : threads) {
        t.join();
    }
}

namespace {

struct PoolDeleter {
    void operator()(FlarePool *pool) const noexcept { flare_pool_destroy(pool); }
};
using PoolPtr = std::unique_ptr<FlarePool, PoolDeleter>;

std::string last_error() {
    std::string msg(flare_last_error_message(nullptr, 0), '\0');
    flare_last_error_message(&msg[0], msg.size() + 1);
    return msg;
}

void test_cpp_idioms() {
    FlarePoolConfig cfg;
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.backend = FLARE_BACKEND_SIMULATED;
    FlarePool *raw = nullptr;
    OK(flare_pool_create(&cfg, &raw));
    PoolPtr pool(raw);
    void *p = nullptr;
    OK(flare_package_allocate(pool.get(), 1 << 20, &p));
    CHECK_STATUS(flare_package_free(pool.get(), static_cast<char *>(p) + 1),
                 FLARE_STATUS_UNKNOWN_POINTER);
    std::string msg = last_error();
    CHECK(msg.find("unknown pointer") != std::string::npos && msg.size() == strlen(msg.c_str()));
    OK(flare_package_free(pool.get(), p));
    // The pool is destroyed by PoolPtr.
}

}  // namespace

int main() {
    test_cpp_idioms();
    return run_all_tests("C++17");
}

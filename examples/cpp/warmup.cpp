// A forward's warm-up from C++: the C ABI behind a small RAII wrapper (the pool
// destroyed by its owner, a failed call thrown with the library's message, a scope
// aborted if an exception leaves it). The weights stay; each of 12 warm-up forwards
// allocates a 1 GiB transient and frees it; inside the retention scope the freed
// mapping is kept and reused, so the pool holds 4 + 1 GiB, not 4 + 12.
//
// Runs anywhere: the pool is on the simulated H200 (no GPU). Build from the checkout:
//
//   cargo clib
//   c++ -std=c++17 -I include examples/cpp/warmup.cpp target/release/libflare_package.a
//       -lpthread -ldl -lm -o warmup   (one line)
//   ./warmup
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "flare_package.h"

namespace {

constexpr size_t kGiB = size_t{1} << 30;

// Throws the library's message when a call fails.
void check(FlareStatus status, const char *call) {
    if (status == FLARE_STATUS_SUCCESS) return;
    char msg[512];
    flare_last_error_message(msg, sizeof msg);
    throw std::runtime_error(std::string(call) + ": " + flare_status_name(status) + ": " + msg);
}

struct PoolDeleter {
    void operator()(FlarePool *pool) const { flare_pool_destroy(pool); }
};
using PoolPtr = std::unique_ptr<FlarePool, PoolDeleter>;

PoolPtr make_pool(FlareBackend backend, int32_t device) {
    FlarePoolConfig cfg;
    flare_pool_config_init(&cfg, sizeof cfg);  // defaults: the simulated H200
    cfg.backend = backend;
    cfg.device = device;
    FlarePool *pool = nullptr;
    check(flare_pool_create(&cfg, &pool), "flare_pool_create");
    return PoolPtr(pool);
}

// A retention scope: begun by the constructor, finished by finish(); aborted (the
// same release, counted as aborted) when an exception leaves it unfinished.
class Retention {
  public:
    explicit Retention(FlarePool *pool) : pool_(pool) { check(flare_retention_begin(pool), "begin"); }
    Retention(const Retention &) = delete;
    Retention &operator=(const Retention &) = delete;
    ~Retention() {
        if (pool_) flare_retention_abort(pool_);
    }
    void finish() {
        FlarePool *pool = pool_;
        pool_ = nullptr;
        check(flare_retention_finish(pool), "finish");
    }

  private:
    FlarePool *pool_;
};

void *allocate(FlarePool *pool, size_t size) {
    void *p = nullptr;
    check(flare_package_allocate(pool, size, &p), "allocate");
    return p;
}

}  // namespace

int main() {
    try {
        PoolPtr pool = make_pool(FLARE_BACKEND_SIMULATED, 0);  // FLARE_BACKEND_CUDA on a GPU
        void *weights = allocate(pool.get(), 4 * kGiB);
        Retention scope(pool.get());  // around warm-up and graph capture
        for (int shape = 0; shape < 12; shape++) {
            void *t = allocate(pool.get(), kGiB);                // 1 GiB transient
            check(flare_package_free(pool.get(), t), "free");  // retained; the next one reuses it
        }
        scope.finish();  // one synchronize, then what is idle is released

        FlareSnapshot s{};
        s.struct_size = sizeof s;
        check(flare_pool_snapshot(pool.get(), &s), "snapshot");
        std::printf("peak %llu GiB, %llu reuse hits, %llu GiB held after the scope\n",
                    static_cast<unsigned long long>(s.peak_physical_bytes / kGiB),
                    static_cast<unsigned long long>(s.reuse_hits),
                    static_cast<unsigned long long>(s.physical_bytes / kGiB));
        check(flare_package_free(pool.get(), weights), "free weights");
        return s.peak_physical_bytes == 5 * kGiB && s.reuse_hits == 11 ? 0 : 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}

// The same through the C++ compiler: the header's extern "C" block links.
#include <flare_package.h>

#include <cstdio>
#include <memory>

int main() {
    FlarePoolConfig cfg;
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.backend = FLARE_BACKEND_SIMULATED;
    FlarePool *raw = nullptr;
    if (flare_pool_create(&cfg, &raw) != FLARE_STATUS_SUCCESS) {
        std::printf("0 passed, 1 failed\n");
        return 1;
    }
    std::unique_ptr<FlarePool, FlareStatus (*)(FlarePool *)> pool(raw, flare_pool_destroy);
    void *p = nullptr;
    int failed = flare_package_allocate(pool.get(), 4096, &p) != FLARE_STATUS_SUCCESS;
    failed += flare_package_free(pool.get(), p) != FLARE_STATUS_SUCCESS;
    std::printf("%d passed, %d failed\n", 2 - failed, failed);
    return failed != 0;
}

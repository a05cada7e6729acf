/* Links flare-package through CMake's imported target and runs one allocation on the
 * simulated backend. Prints "N passed, N failed". */
#include <flare_package.h>
#include <stdio.h>

static int passed, failed;
#define CHECK(c) ((c) ? (void)passed++ : (void)(failed++, fprintf(stderr, "FAIL %d: %s\n", __LINE__, #c)))

int main(void) {
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    FlareSnapshot s;
    void *p = NULL;
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.backend = FLARE_BACKEND_SIMULATED;
    CHECK(flare_pool_create(&cfg, &pool) == FLARE_STATUS_SUCCESS);
    CHECK(flare_package_allocate(pool, 1 << 20, &p) == FLARE_STATUS_SUCCESS && p != NULL);
    s.struct_size = sizeof s;
    CHECK(flare_pool_snapshot(pool, &s) == FLARE_STATUS_SUCCESS && s.live_count == 1);
    CHECK(flare_package_free(pool, p) == FLARE_STATUS_SUCCESS);
    CHECK(flare_pool_destroy(pool) == FLARE_STATUS_SUCCESS);
    printf("flare-package %d.%d.%d via CMake\n", FLARE_PACKAGE_VERSION_MAJOR,
           FLARE_PACKAGE_VERSION_MINOR, FLARE_PACKAGE_VERSION_PATCH);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

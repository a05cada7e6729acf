/* An out-of-tree consumer of an installed flare-package (tests/install/run.sh builds it
 * with CMake's find_package, with pkg-config and with a plain cc line, against the
 * static and the shared library). It checks the version it sees: the header's macros
 * against FLARE_EXPECT_VERSION (Cargo.toml's version, passed by the build), the
 * library's run-time version against the header's; then a retention scope on the
 * simulated H200 reuses a freed mapping (12 transients of 1 GiB: 11 reuse hits, a
 * peak of 4 + 1 GiB). The last line is "N passed, M failed"; exit 0 only when M is 0.
 * Compiles as C11 and as C++17 (consumer.cpp includes this file).
 */
#include <stdio.h>
#include <string.h>
#include "flare_package.h"

#ifndef FLARE_EXPECT_VERSION
#error "build with -DFLARE_EXPECT_VERSION=\"MAJOR.MINOR.PATCH\" (Cargo.toml's version)"
#endif

#define GIB ((size_t)1 << 30)
#define STR2(x) #x
#define STR(x) STR2(x)

static int passed, failed;

static void check(int cond, const char *what) {
    if (cond) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "FAILED: %s\n", what);
    }
}

static int ok(FlareStatus status, const char *call) {
    char msg[512];
    if (status == FLARE_STATUS_SUCCESS) return 1;
    flare_last_error_message(msg, sizeof msg);
    fprintf(stderr, "%s: %s: %s\n", call, flare_status_name(status), msg);
    return 0;
}

int main(void) {
    const char *header_version = STR(FLARE_PACKAGE_VERSION_MAJOR) "." STR(
        FLARE_PACKAGE_VERSION_MINOR) "." STR(FLARE_PACKAGE_VERSION_PATCH);
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    FlareSnapshot s;
    void *weights = NULL;
    int i, good;

    printf("header %s, expected %s\n", header_version, FLARE_EXPECT_VERSION);
    check(strcmp(header_version, FLARE_EXPECT_VERSION) == 0, "header version == Cargo.toml's");
    check(strcmp(FLARE_PACKAGE_VERSION_STRING, FLARE_EXPECT_VERSION) == 0,
          "FLARE_PACKAGE_VERSION_STRING == Cargo.toml's");
    printf("library %s (%u)\n", flare_package_version_string(), flare_package_version());
    check(flare_package_version() == FLARE_PACKAGE_VERSION,
          "flare_package_version() == FLARE_PACKAGE_VERSION (the library is the header's)");
    check(strcmp(flare_package_version_string(), FLARE_EXPECT_VERSION) == 0,
          "flare_package_version_string() == Cargo.toml's");

    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    flare_pool_config_init(&cfg, sizeof cfg); /* the simulated H200 */
    good = ok(flare_pool_create(&cfg, &pool), "flare_pool_create");
    check(good, "a pool on the simulated backend");
    if (!good) {
        printf("%d passed, %d failed\n", passed, failed);
        return 1;
    }
    good = ok(flare_package_allocate(pool, 4 * GIB, &weights), "allocate weights");
    good = good && ok(flare_retention_begin(pool), "begin");
    for (i = 0; i < 12 && good; i++) {
        void *t = NULL;
        good = ok(flare_package_allocate(pool, GIB, &t), "allocate")
            && ok(flare_package_free(pool, t), "free");
    }
    good = good && ok(flare_retention_finish(pool), "finish");
    good = good && ok(flare_pool_snapshot(pool, &s), "snapshot");
    check(good, "the warm-up's calls succeed");
    check(s.peak_physical_bytes == 5 * GIB, "peak physical 5 GiB (4 weights + 1 reused transient)");
    check(s.reuse_hits == 11, "11 reuse hits (12 transients, one mapping)");
    check(s.physical_bytes == 4 * GIB, "4 GiB held after the scope (the transient released)");
    if (weights) check(ok(flare_package_free(pool, weights), "free weights"), "free the weights");
    check(ok(flare_pool_destroy(pool), "destroy"), "destroy the pool");
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}

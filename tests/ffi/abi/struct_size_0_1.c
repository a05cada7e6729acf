/*
 * A caller compiled against the 0.1 header, run with this library (issue 36): every
 * struct_size-versioned struct (FlarePoolConfig in, FlareSnapshot, FlareDestroyReport
 * and FlareTagCensus out) as a 0.1 program lays it out.
 *
 * flare_package-0.1.h is include/flare_package.h of flare-package 0.1.0 exactly as it
 * was at commit e569a1c900659fc0867ceae0834ead892abd656b (main, before the header
 * split and the version call of 0.2.0): `git show e569a1c:include/flare_package.h`.
 * It is never regenerated: it is what 0.1 callers were compiled against. When a new
 * MINOR version grows a struct, this program keeps checking that the 0.1 layout is
 * still accepted (an older caller's smaller struct_size: an output filled only up to
 * its size, a byte past it untouched; an input read only up to its size, the new
 * fields defaulted). The same holds for older prefixes still (a caller from before
 * segment mode, whose structs end earlier), checked here with the 0.1 offsets.
 *
 * Built by tests/ffi/run.sh with -I tests/ffi/abi (never include/), linked with the
 * library of this tree. Prints "N passed, M failed".
 */
#include "flare_package-0.1.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if FLARE_PACKAGE_VERSION_MAJOR != 0 || FLARE_PACKAGE_VERSION_MINOR != 1
#error "this program must be compiled against the 0.1 header (tests/ffi/abi/)"
#endif

#define MiB (UINT64_C(1) << 20)
#define CANARY 0xa5
/* Bytes past a caller's struct that the library must leave alone. */
#define TAIL 64

static int g_passed = 0, g_failed = 0;

static void report(int ok, int line, const char *what) {
    if (ok) {
        g_passed++;
    } else {
        char msg[512];
        g_failed++;
        flare_last_error_message(msg, sizeof msg);
        fprintf(stderr, "FAIL struct_size_0_1.c:%d: %s (last error: %s)\n", line, what, msg);
    }
}
#define CHECK(cond) report((cond) ? 1 : 0, __LINE__, #cond)
#define OK(expr) CHECK((expr) == FLARE_STATUS_SUCCESS)

/* Whether bytes [from, to) of buf all hold CANARY. */
static int untouched(const unsigned char *buf, size_t from, size_t to) {
    size_t i;
    for (i = from; i < to; i++) {
        if (buf[i] != CANARY) {
            return 0;
        }
    }
    return 1;
}

/* A buffer for a struct of the 0.1 header and TAIL bytes past it, all CANARY, aligned
 * for any of them. */
typedef union {
    FlarePoolConfig config;
    FlareSnapshot snapshot;
    FlareDestroyReport report;
    FlareTagCensus census;
    unsigned char bytes[sizeof(FlareSnapshot) + TAIL];
} Buffer;

static void fill(Buffer *b) { memset(b->bytes, CANARY, sizeof b->bytes); }

/* A pool from a 0.1 configuration of struct_size `size` (the fields past it hold
 * CANARY bytes: a library that read them would see a record path at 0xa5a5...,
 * 0xa5a5a5a5 thread-cache entries). */
static FlarePool *pool_from_0_1_config(uint32_t size) {
    Buffer b;
    FlarePool *pool = NULL;
    fill(&b);
    flare_pool_config_init(&b.config, size);
    /* Filled only up to `size`: the struct's own tail (if any) and TAIL untouched. */
    CHECK(b.config.struct_size == size);
    CHECK(untouched(b.bytes, size, sizeof(FlarePoolConfig) + TAIL));
    CHECK(b.config.backend == FLARE_BACKEND_SIMULATED && b.config.device == 0 &&
          b.config.reuse_policy == FLARE_REUSE_BEST_FIT);
    b.config.sim_capacity_bytes = 64 * MiB;
    OK(flare_pool_create(&b.config, &pool));
    CHECK(pool != NULL);
    return pool;
}

static void test_config_and_snapshot(uint32_t config_size, uint32_t snapshot_size) {
    FlarePool *pool = pool_from_0_1_config(config_size);
    void *p = NULL;
    Buffer b;
    if (pool == NULL) {
        return;
    }
    OK(flare_package_allocate(pool, 3 * MiB, &p));
    fill(&b);
    b.snapshot.struct_size = snapshot_size;
    OK(flare_pool_snapshot(pool, &b.snapshot));
    /* The fields inside snapshot_size are this pool's: one live 3 MiB allocation in
     * a 4 MiB mapping (2 MiB granularity); the rest is untouched. */
    CHECK(b.snapshot.struct_size == snapshot_size && b.snapshot.scope_open == 0 &&
          b.snapshot.granularity_bytes == 2 * MiB && b.snapshot.live_count == 1 &&
          b.snapshot.live_requested_bytes == 3 * MiB &&
          b.snapshot.live_mapped_bytes == 4 * MiB && b.snapshot.allocations == 1);
    CHECK(untouched(b.bytes, snapshot_size, sizeof b.bytes));
    if (snapshot_size >= offsetof(FlareSnapshot, thread_cache_count) + 8) {
        /* Fields 0.1 has that older callers lack: written when inside the size. */
        CHECK(b.snapshot.segment_count == 0 && b.snapshot.thread_cache_count == 0);
    }
    if (snapshot_size == sizeof(FlareSnapshot)) {
        CHECK(b.snapshot.host_kept_bytes == 0 && b.snapshot.tags_sleeping == 0);
    }

    /* The destroy report, at the 0.1 size and at a shorter prefix. */
    fill(&b);
    b.report.struct_size = (uint32_t)sizeof(FlareDestroyReport);
    OK(flare_pool_destroy_report(pool, &b.report));
    CHECK(b.report.struct_size == sizeof(FlareDestroyReport) && b.report.scope_was_open == 0 &&
          b.report.live_count == 1 && b.report.live_requested_bytes == 3 * MiB &&
          b.report.live_mapped_bytes == 4 * MiB && b.report.physical_bytes == 4 * MiB);
    CHECK(untouched(b.bytes, sizeof(FlareDestroyReport), sizeof b.bytes));
}

static void test_short_destroy_report(void) {
    FlarePool *pool = pool_from_0_1_config((uint32_t)sizeof(FlarePoolConfig));
    const uint32_t size = (uint32_t)offsetof(FlareDestroyReport, live_requested_bytes);
    void *p = NULL;
    Buffer b;
    if (pool == NULL) {
        return;
    }
    OK(flare_package_allocate(pool, MiB, &p));
    fill(&b);
    b.report.struct_size = size;
    OK(flare_pool_destroy_report(pool, &b.report));
    CHECK(b.report.struct_size == size && b.report.live_count == 1);
    CHECK(untouched(b.bytes, size, sizeof b.bytes));
}

static void test_tag_census(void) {
    FlarePool *pool = pool_from_0_1_config((uint32_t)sizeof(FlarePoolConfig));
    const uint32_t short_size = (uint32_t)offsetof(FlareTagCensus, offloaded_bytes);
    void *p = NULL;
    Buffer b;
    if (pool == NULL) {
        return;
    }
    OK(flare_package_allocate_tagged(pool, 6 * MiB, NULL, 7, &p));
    fill(&b);
    b.census.struct_size = (uint32_t)sizeof(FlareTagCensus);
    OK(flare_pool_tag_census(pool, 7, &b.census));
    CHECK(b.census.struct_size == sizeof(FlareTagCensus) && b.census.sleeping == 0 &&
          b.census.live_count == 1 && b.census.live_bytes == 6 * MiB &&
          b.census.peak_live_bytes == 6 * MiB && b.census.offloaded_bytes == 0 &&
          b.census.zeroed_bytes == 0 && b.census.zero_memsets == 0);
    CHECK(untouched(b.bytes, sizeof(FlareTagCensus), sizeof b.bytes));
    /* A shorter prefix: offloaded_bytes and after are left alone. */
    fill(&b);
    b.census.struct_size = short_size;
    OK(flare_pool_tag_census(pool, 7, &b.census));
    CHECK(b.census.struct_size == short_size && b.census.live_bytes == 6 * MiB);
    CHECK(untouched(b.bytes, short_size, sizeof b.bytes));
    OK(flare_pool_destroy(pool));
}

int main(void) {
    fprintf(stderr, "0.1 header (%d.%d.%d) against the library of this tree\n",
            FLARE_PACKAGE_VERSION_MAJOR, FLARE_PACKAGE_VERSION_MINOR,
            FLARE_PACKAGE_VERSION_PATCH);
    /* The 0.1 sizes the header gives (104 and 472 bytes on 64-bit targets). */
    test_config_and_snapshot((uint32_t)sizeof(FlarePoolConfig), (uint32_t)sizeof(FlareSnapshot));
    /* A caller from before segment mode and thread caches: its configuration ends
     * after cross_stream_reuse, its snapshot after stream_call_failures. */
    test_config_and_snapshot((uint32_t)offsetof(FlarePoolConfig, segment_whole_threshold_bytes),
                             (uint32_t)offsetof(FlareSnapshot, segment_count));
    test_short_destroy_report();
    test_tag_census();
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}

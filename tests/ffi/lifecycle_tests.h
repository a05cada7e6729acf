/*
 * The C ABI's contract, checked from C and C++: this file is the harness (CHECK, OK,
 * the snapshot helpers, new_pool) and run_all_tests; the tests are in the files it
 * includes, one concern each.
 *
 * The C ABI tests shared by lifecycle.c (C11) and lifecycle.cpp (C++17): the same
 * checks compile as both languages. The including file defines
 *
 *     static void run_parallel(void *(*fn)(void *), void *args[], int n);
 *
 * (pthreads in C, std::thread in C++) after including this file.
 *
 * Everything runs on the simulated backend: pointers are device addresses of a
 * simulated device and are never dereferenced.
 */
#ifndef FLARE_LIFECYCLE_TESTS_H
#define FLARE_LIFECYCLE_TESTS_H

#include "flare_package.h"
#include "flare_package.h" /* twice on purpose: the include guard must hold */
/* The simulated backend's test hooks (flare_sim_*, FlareDriverCall). */
#include "flare_package_sim.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(FLARE_PACKAGE_VERSION_MAJOR) || !defined(FLARE_PACKAGE_VERSION_MINOR) || \
    !defined(FLARE_PACKAGE_VERSION_PATCH)
#error "flare_package.h must define FLARE_PACKAGE_VERSION_MAJOR/MINOR/PATCH"
#endif

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

static int g_passed = 0;
static int g_failed = 0;

static void report(int ok, const char *file, int line, const char *what) {
    if (ok) {
        g_passed++;
    } else {
        char msg[512];
        g_failed++;
        flare_last_error_message(msg, sizeof msg);
        fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", file, line, what, msg);
    }
}

#define CHECK(cond) report((cond) ? 1 : 0, __FILE__, __LINE__, #cond)

#define CHECK_STATUS(expr, want)                                                         \
    do {                                                                                 \
        FlareStatus got_ = (expr);                                                       \
        if (got_ != (want)) {                                                            \
            fprintf(stderr, "  %s returned %s, expected %s\n", #expr,                    \
                    flare_status_name(got_), flare_status_name(want));                   \
        }                                                                                \
        report(got_ == (want), __FILE__, __LINE__, #expr " == " #want);                  \
    } while (0)

#define OK(expr) CHECK_STATUS(expr, FLARE_STATUS_SUCCESS)

/* Whether this thread's last error message contains `needle`. */
static int last_error_contains(const char *needle) {
    char msg[1024];
    flare_last_error_message(msg, sizeof msg);
    return strstr(msg, needle) != NULL;
}

static FlareSnapshot snap(const FlarePool *pool) {
    FlareSnapshot s;
    memset(&s, 0, sizeof s);
    s.struct_size = (uint32_t)sizeof s;
    if (flare_pool_snapshot(pool, &s) != FLARE_STATUS_SUCCESS) {
        report(0, __FILE__, __LINE__, "flare_pool_snapshot");
    }
    return s;
}

static int snap_equal(const FlareSnapshot *a, const FlareSnapshot *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

/* Nothing held: no physical memory, no reservation, nothing pending or idle. */
static int snap_empty(const FlareSnapshot *s) {
    return s->physical_bytes == 0 && s->reserved_bytes == 0 && s->pending_count == 0 &&
           s->pending_bytes == 0 && s->idle_count == 0 && s->live_count == 0;
}

/* Nothing held but the segments' address reservations (FLARE_REUSE_SEGMENTS keeps a
 * segment's reservation until destroy, for its heap to regrow into): no physical
 * memory, no handle in a segment, nothing pending, idle or live; reserved bytes only
 * with a segment. */
static int snap_released(const FlareSnapshot *s) {
    return s->physical_bytes == 0 && s->pending_count == 0 && s->pending_bytes == 0 &&
           s->idle_count == 0 && s->live_count == 0 && s->segment_handles == 0 &&
           s->segment_mapped_bytes == 0 && s->block_live_count == 0 &&
           s->block_free_bytes == 0 && (s->reserved_bytes == 0) == (s->segment_count == 0);
}

/* The snapshot's invariants (FlareSnapshot's doc): every physical handle counted once
 * (whole mappings live, idle or pending, and handles mapped in segments), a
 * segment's mapped bytes are its live and free blocks; what thread caches hold is
 * idle memory (idle whole mappings or free blocks), and a thread-cache hit is a reuse
 * hit. */
static int snap_consistent(const FlareSnapshot *s) {
    return s->physical_bytes == s->live_mapped_bytes + s->idle_bytes + s->pending_bytes +
                                    s->segment_mapped_bytes + s->sleeping_held_bytes &&
           s->segment_mapped_bytes == s->block_live_bytes + s->block_free_bytes &&
           s->block_live_count <= s->live_count &&
           (s->segment_handles_lent == 0) == (s->segment_lent_bytes == 0) &&
           s->allocations == s->frees + s->live_count &&
           s->physical_bytes <= s->peak_physical_bytes &&
           s->thread_cache_hits <= s->reuse_hits &&
           (s->thread_cache_count == 0) == (s->thread_cache_bytes == 0) &&
           s->thread_cache_bytes <= s->idle_bytes + s->block_free_bytes;
}

static FlarePool *new_pool(FlareReusePolicy policy, uint64_t capacity, uint64_t threshold) {
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.backend = FLARE_BACKEND_SIMULATED;
    cfg.reuse_policy = (uint32_t)policy;
    cfg.sim_capacity_bytes = capacity;
    cfg.release_threshold_bytes = threshold;
    OK(flare_pool_create(&cfg, &pool));
    CHECK(pool != NULL);
    return pool;
}

/* The tests, one concern a file, each with the helpers above (and the files before it). */
/* Names and configuration. */
#include "config_tests.h"
/* A pool's life: allocate, free, scopes, reuse, warm-up. */
#include "pool_tests.h"
/* Bad inputs, injected driver failures, another pool's pointer. */
#include "failure_tests.h"
/* The destroy report and poisoned pools. */
#include "destroy_tests.h"
/* Threads on one pool; declares run_parallel. */
#include "thread_tests.h"
/* Stream order (issue 11): its own file, with the helpers above. */
#include "stream_tests.h"
/* Segment mode (issue 12): its own file, with the helpers above and stream_tests.h's. */
#include "segment_tests.h"
/* Thread caches (issue 13): its own file, with the helpers above and segment_tests.h's. */
#include "thread_cache_tests.h"
/* Tags, sleep and wake (issue 15): its own file, with the helpers above. */
#include "tag_tests.h"
/* Recording (issue 17): its own file, with the helpers above. */
#include "record_tests.h"
/* The growth report (issue 38): its own file, with the helpers above. */
#include "growth_tests.h"

static int run_all_tests(const char *language) {
    fprintf(stderr, "flare-package %d.%d.%d C ABI tests (%s)\n", FLARE_PACKAGE_VERSION_MAJOR,
            FLARE_PACKAGE_VERSION_MINOR, FLARE_PACKAGE_VERSION_PATCH, language);
    test_status_names();
    test_config();
    test_lifecycle();
    test_warmup(FLARE_REUSE_BEST_FIT, 0, GiB);
    test_warmup(FLARE_REUSE_EXACT, 0, GiB);
    test_warmup(FLARE_REUSE_NONE, 0, 24 * GiB);
    test_warmup(FLARE_REUSE_SEGMENTS, 0, GiB);
    test_warmup(FLARE_REUSE_BEST_FIT, 1, 2 * GiB);
    test_warmup(FLARE_REUSE_EXACT, 1, 2 * GiB);
    test_warmup(FLARE_REUSE_NONE, 1, 24 * GiB);
    test_warmup(FLARE_REUSE_SEGMENTS, 1, 2 * GiB);
    test_forced_reuse();
    test_bad_inputs();
    test_injected_failures();
    test_wrong_pool();
    test_destroy_report();
    test_poisoned();
    test_threads(FLARE_REUSE_BEST_FIT, 0, 0);
    test_threads(FLARE_REUSE_BEST_FIT, 0, 64 * MiB);
    test_threads(FLARE_REUSE_BEST_FIT, 1, 0);
    test_threads(FLARE_REUSE_SEGMENTS, 0, 0);
    test_threads(FLARE_REUSE_SEGMENTS, 0, 64 * MiB);
    test_threads(FLARE_REUSE_SEGMENTS, 1, 0);
    test_stream_bad_inputs();
    test_sim_streams();
    test_stream_same_stream_reuse();
    test_stream_cross_stream();
    test_stream_capture();
    test_stream_record();
    test_stream_forget();
    test_segments_small_blocks();
    test_segments_whole_threshold();
    test_segments_streams();
    test_segments_invariant();
    test_thread_cache_config();
    test_tags_sleep_and_wake();
    test_tags_wake_out_of_memory();
    test_tags_bad_inputs();
    test_tags_wake_zeroed();
    test_record();
    test_record_unwritable();
    test_growth_report();
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}

#endif /* FLARE_LIFECYCLE_TESTS_H */

/*
 * One concern in one file: the C ABI's contract, checked from C and C++.
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

static void test_status_names(void) {
    static const char *const names[] = {
        "FLARE_STATUS_SUCCESS",         "FLARE_STATUS_INVALID_ARGUMENT",
        "FLARE_STATUS_OUT_OF_MEMORY",   "FLARE_STATUS_NOT_SUPPORTED",
        "FLARE_STATUS_UNKNOWN_POINTER", "FLARE_STATUS_SCOPE_STATE",
        "FLARE_STATUS_DRIVER_ERROR",    "FLARE_STATUS_NO_DRIVER",
        "FLARE_STATUS_INTERNAL",        "FLARE_STATUS_REQUEST_TOO_LARGE",
        "FLARE_STATUS_TAG_STATE",       "FLARE_STATUS_STREAM_STATE",
    };
    int i;
    for (i = 0; i <= 11; i++) {
        const char *n = flare_status_name((FlareStatus)i);
        CHECK(n != NULL && strcmp(n, names[i]) == 0);
    }
    /* 15 is inside the enum's value range in C++ too, but no enumerator. */
    CHECK(strcmp(flare_status_name((FlareStatus)15), "FLARE_STATUS_UNRECOGNIZED") == 0);
    CHECK(strcmp(flare_status_name((FlareStatus)12), "FLARE_STATUS_UNRECOGNIZED") == 0);
    CHECK(FLARE_STATUS_REQUEST_TOO_LARGE == 9 && FLARE_STATUS_INTERNAL == 8 &&
          FLARE_CALL_SYNCHRONIZE == 7 && FLARE_REUSE_SEGMENTS == 3 &&
          FLARE_REUSE_NONE == 2 && FLARE_BACKEND_SIMULATED == 1);
    /* The layouts on a 64-bit target, by hand (lifecycle.c and lifecycle.cpp assert
     * them at compile time): the configuration's u64 segment_whole_threshold_bytes at
     * 72, after 4 bytes of padding behind cross_stream_reuse (64..68), then the u32
     * thread_cache_entries at 80 and, after 4 bytes of padding (84..88), the u64
     * thread_cache_bytes at 88, up to 96, then the pointer record_path at 96, up to
     * 104; the snapshot's eight segment counters after
     * stream_call_failures (296..304), up to 368, then the four thread-cache counters,
     * up to 400, then the six sleep counters (issue 15), up to 448, then the two
     * sleeping block counters (segments per tag), up to 464, then the kept host
     * buffer's bytes, up to 472. */
    CHECK(sizeof(FlarePoolConfig) == 104 && offsetof(FlarePoolConfig, record_path) == 96 &&
          offsetof(FlarePoolConfig, segment_whole_threshold_bytes) == 72 &&
          offsetof(FlarePoolConfig, thread_cache_entries) == 80 &&
          offsetof(FlarePoolConfig, thread_cache_bytes) == 88);
    CHECK(sizeof(FlareTagCensus) == 72 && offsetof(FlareTagCensus, live_count) == 8 &&
          offsetof(FlareTagCensus, zeroed_bytes) == 56);
    CHECK(sizeof(FlareSnapshot) == 472 && offsetof(FlareSnapshot, segment_count) == 304 &&
          offsetof(FlareSnapshot, block_free_bytes) == 344 &&
          offsetof(FlareSnapshot, segment_lent_bytes) == 360 &&
          offsetof(FlareSnapshot, thread_cache_count) == 368 &&
          offsetof(FlareSnapshot, thread_cache_bytes) == 376 &&
          offsetof(FlareSnapshot, thread_cache_hits) == 384 &&
          offsetof(FlareSnapshot, remote_frees) == 392 &&
          offsetof(FlareSnapshot, tags_sleeping) == 400 &&
          offsetof(FlareSnapshot, offloaded_bytes) == 440 &&
          offsetof(FlareSnapshot, sleeping_block_count) == 448 &&
          offsetof(FlareSnapshot, sleeping_block_bytes) == 456 &&
          offsetof(FlareSnapshot, host_kept_bytes) == 464);
    CHECK(FLARE_THREAD_CACHE_OFF == UINT32_MAX);
    CHECK(FLARE_PACKAGE_VERSION_MAJOR == 0 && FLARE_PACKAGE_VERSION_MINOR == 1 &&
          FLARE_PACKAGE_VERSION_PATCH == 0);
}

static void test_config(void) {
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    FlarePool *const sentinel = (FlarePool *)(uintptr_t)0x5e5e;
    FlareSnapshot s;
    int32_t peers[2] = {1, 2};
    uint32_t bad_sizes[4] = {0, 4, 7, 5000};
    uint32_t bad;
    int i;

    flare_pool_config_init(NULL, sizeof cfg); /* a no-op, not a crash */
    memset(&cfg, 0xcd, sizeof cfg);
    flare_pool_config_init(&cfg, sizeof cfg);
    CHECK(cfg.struct_size == sizeof cfg && cfg.backend == FLARE_BACKEND_SIMULATED && cfg.device == 0 &&
          cfg.reuse_policy == FLARE_REUSE_BEST_FIT && cfg.release_threshold_bytes == 0 &&
          cfg.peer_devices == NULL && cfg.peer_device_count == 0 &&
          cfg.sim_capacity_bytes == 0 && cfg.sim_granularity_bytes == 0 &&
          cfg.sim_device_count == 0 && cfg.best_fit_max_waste_percent == 30 &&
          cfg.cross_stream_reuse == FLARE_CROSS_STREAM_WHEN_COMPLETE &&
          cfg.segment_whole_threshold_bytes == 0 && cfg.thread_cache_entries == 32 &&
          cfg.thread_cache_bytes == 1024 * MiB); /* 1 GiB: DEFAULT_THREAD_CACHE_BYTES */
    /* Enum-valued fields are fixed-width integers, whatever the compiler makes of an
     * enum. */
    CHECK(sizeof cfg.backend == 4 && sizeof cfg.reuse_policy == 4 &&
          sizeof cfg.cross_stream_reuse == 4);
    cfg.backend = FLARE_BACKEND_SIMULATED;

    CHECK_STATUS(flare_pool_create(NULL, &pool), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_create(&cfg, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("out_pool is NULL"));

    for (i = 0; i < 4; i++) {
        FlarePoolConfig c = cfg;
        c.struct_size = bad_sizes[i];
        pool = sentinel;
        CHECK_STATUS(flare_pool_create(&c, &pool), FLARE_STATUS_INVALID_ARGUMENT);
        CHECK(pool == sentinel); /* outputs only on success */
        CHECK(last_error_contains("struct_size"));
    }
    {
        /* Unknown enum values, written as raw integers (valid C, and never UB on the
         * library's side, which reads them as integers). */
        FlarePoolConfig c = cfg;
        bad = 7;
        memcpy(&c.backend, &bad, sizeof bad);
        pool = sentinel;
        CHECK_STATUS(flare_pool_create(&c, &pool), FLARE_STATUS_INVALID_ARGUMENT);
        CHECK(pool == sentinel && last_error_contains("backend 7"));
        c = cfg;
        bad = 9;
        memcpy(&c.reuse_policy, &bad, sizeof bad);
        CHECK_STATUS(flare_pool_create(&c, &pool), FLARE_STATUS_INVALID_ARGUMENT);
        CHECK(pool == sentinel && last_error_contains("reuse_policy 9"));
        c = cfg;
        c.device = -1;
        CHECK_STATUS(flare_pool_create(&c, &pool), FLARE_STATUS_INVALID_ARGUMENT);
        c = cfg;
        c.peer_device_count = 1;
        CHECK_STATUS(flare_pool_create(&c, &pool), FLARE_STATUS_INVALID_ARGUMENT);
        CHECK(pool == sentinel && last_error_contains("peer_devices"));
    }
    {
        /* Peers: every mapping gets access for device 0, 1 and 2, on a simulated
         * machine of 3 devices; on the default machine (1 device) the peers do not
         * exist, as on a real one-GPU host. */
        FlarePoolConfig c = cfg;
        void *p = NULL;
        c.peer_devices = peers;
        c.peer_device_count = 2;
        pool = sentinel;
        CHECK_STATUS(flare_pool_create(&c, &pool), FLARE_STATUS_INVALID_ARGUMENT);
        CHECK(pool == sentinel && last_error_contains("peer device 1"));
        c.sim_device_count = 2;
        CHECK_STATUS(flare_pool_create(&c, &pool), FLARE_STATUS_INVALID_ARGUMENT);
        CHECK(pool == sentinel && last_error_contains("peer device 2"));
        c.sim_device_count = 3;
        pool = NULL;
        OK(flare_pool_create(&c, &pool));
        OK(flare_package_allocate(pool, 1, &p));
        OK(flare_package_free(pool, p));
        OK(flare_pool_destroy(pool));
    }
    {
        /* An older caller whose struct ends before the simulated sizes: the garbage
         * after its struct_size is not read, the sizes take their defaults. */
        FlarePoolConfig c = cfg;
        c.struct_size = (uint32_t)offsetof(FlarePoolConfig, sim_capacity_bytes);
        c.sim_capacity_bytes = 12345;
        c.sim_granularity_bytes = 3;
        c.sim_device_count = 7;
        pool = NULL;
        OK(flare_pool_create(&c, &pool));
        s = snap(pool);
        CHECK(s.granularity_bytes == 2 * MiB);
        OK(flare_pool_destroy(pool));
        /* The shortest accepted: struct_size and backend only. */
        c.struct_size = 8;
        c.device = 12345; /* not read: device 0 */
        OK(flare_pool_create(&c, &pool));
        OK(flare_pool_destroy(pool));
    }
    {
        /* config_init writes at most config_size bytes: an older caller's shorter
         * struct is never overrun, only the fields wholly inside are written. */
        union {
            FlarePoolConfig c;
            unsigned char bytes[sizeof(FlarePoolConfig) + 32];
        } u;
        size_t k, end = offsetof(FlarePoolConfig, sim_capacity_bytes);
        int untouched = 1, zero = 1;
        memset(&u, 0xcd, sizeof u);
        flare_pool_config_init(&u.c, 0);
        flare_pool_config_init(&u.c, 3);
        for (k = 0; k < sizeof u; k++) {
            untouched &= u.bytes[k] == 0xcd;
        }
        CHECK(untouched); /* below the first field: nothing written */
        flare_pool_config_init(&u.c, end);
        untouched = 1;
        for (k = offsetof(FlarePoolConfig, peer_device_count) + 4; k < sizeof u; k++) {
            untouched &= u.bytes[k] == 0xcd;
        }
        CHECK(untouched);
        CHECK(u.c.struct_size == end && u.c.backend == FLARE_BACKEND_SIMULATED &&
              u.c.device == 0 && u.c.reuse_policy == FLARE_REUSE_BEST_FIT &&
              u.c.release_threshold_bytes == 0 && u.c.peer_devices == NULL &&
              u.c.peer_device_count == 0);
        pool = NULL;
        OK(flare_pool_create(&u.c, &pool)); /* the rest takes its defaults */
        s = snap(pool);
        CHECK(s.granularity_bytes == 2 * MiB);
        OK(flare_pool_destroy(pool));
        /* A newer caller's larger struct: this library's fields, the rest untouched. */
        memset(&u, 0xcd, sizeof u);
        flare_pool_config_init(&u.c, sizeof u);
        untouched = 1;
        for (k = sizeof(FlarePoolConfig); k < sizeof u; k++) {
            untouched &= u.bytes[k] == 0xcd;
        }
        CHECK(untouched && u.c.struct_size == sizeof(FlarePoolConfig));
        CHECK(u.c.best_fit_max_waste_percent == 30 && u.c.sim_device_count == 0 &&
              u.c.cross_stream_reuse == FLARE_CROSS_STREAM_WHEN_COMPLETE &&
              u.c.segment_whole_threshold_bytes == 0 && u.c.thread_cache_entries == 32 &&
              u.c.thread_cache_bytes == 1024 * MiB);
        /* The padding after peer_device_count is zeroed, not left as garbage, and so
         * is the padding between cross_stream_reuse and segment_whole_threshold_bytes,
         * and between thread_cache_entries and thread_cache_bytes. */
        for (k = offsetof(FlarePoolConfig, peer_device_count) + 4;
             k < offsetof(FlarePoolConfig, sim_capacity_bytes); k++) {
            zero &= u.bytes[k] == 0;
        }
        CHECK(offsetof(FlarePoolConfig, segment_whole_threshold_bytes) ==
              offsetof(FlarePoolConfig, cross_stream_reuse) + 8);
        for (k = offsetof(FlarePoolConfig, cross_stream_reuse) + 4;
             k < offsetof(FlarePoolConfig, segment_whole_threshold_bytes); k++) {
            zero &= u.bytes[k] == 0;
        }
        CHECK(offsetof(FlarePoolConfig, thread_cache_bytes) ==
              offsetof(FlarePoolConfig, thread_cache_entries) + 8);
        for (k = offsetof(FlarePoolConfig, thread_cache_entries) + 4;
             k < offsetof(FlarePoolConfig, thread_cache_bytes); k++) {
            zero &= u.bytes[k] == 0;
        }
        CHECK(zero);
        /* A caller compiled before the thread-cache fields (sizeof 80): up to
         * segment_whole_threshold_bytes, not one byte more. */
        memset(&u, 0xcd, sizeof u);
        flare_pool_config_init(&u.c, offsetof(FlarePoolConfig, thread_cache_entries));
        untouched = 1;
        for (k = offsetof(FlarePoolConfig, thread_cache_entries); k < sizeof u; k++) {
            untouched &= u.bytes[k] == 0xcd;
        }
        CHECK(untouched && u.c.struct_size == 80 && u.c.segment_whole_threshold_bytes == 0);
        /* Covering thread_cache_entries, not thread_cache_bytes: the padding after it
         * and thread_cache_bytes are left alone. */
        memset(&u, 0xcd, sizeof u);
        flare_pool_config_init(&u.c, offsetof(FlarePoolConfig, thread_cache_bytes));
        untouched = 1;
        for (k = offsetof(FlarePoolConfig, thread_cache_entries) + 4; k < sizeof u; k++) {
            untouched &= u.bytes[k] == 0xcd;
        }
        CHECK(untouched && u.c.struct_size == 88 && u.c.thread_cache_entries == 32);
        /* A caller compiled before segment_whole_threshold_bytes (sizeof 72): up to
         * cross_stream_reuse; its padding and the new field's bytes are left alone. */
        memset(&u, 0xcd, sizeof u);
        flare_pool_config_init(&u.c, offsetof(FlarePoolConfig, segment_whole_threshold_bytes));
        untouched = 1;
        for (k = offsetof(FlarePoolConfig, cross_stream_reuse) + 4; k < sizeof u; k++) {
            untouched &= u.bytes[k] == 0xcd;
        }
        CHECK(untouched && u.c.struct_size == 72 &&
              u.c.cross_stream_reuse == FLARE_CROSS_STREAM_WHEN_COMPLETE);
        /* A caller compiled before cross_stream_reuse (sizeof 64): not one byte more. */
        memset(&u, 0xcd, sizeof u);
        flare_pool_config_init(&u.c, offsetof(FlarePoolConfig, cross_stream_reuse));
        untouched = 1;
        for (k = offsetof(FlarePoolConfig, cross_stream_reuse); k < sizeof u; k++) {
            untouched &= u.bytes[k] == 0xcd;
        }
        CHECK(untouched && u.c.struct_size == 64 && u.c.best_fit_max_waste_percent == 30);
    }
    {
        /* The best-fit waste bound: inside a scope, 4 MiB freed, then 2 MiB asked for.
         * The idle 4 MiB exceeds the request by 100%: reused under a bound of 100%,
         * not under the default 30% (nor under 0, which means the default). */
        static const uint32_t percents[3] = {100, 30, 0};
        static const uint64_t want_hits[3] = {1, 0, 0};
        for (i = 0; i < 3; i++) {
            FlarePoolConfig c = cfg;
            void *p = NULL, *q = NULL;
            c.best_fit_max_waste_percent = percents[i];
            pool = NULL;
            OK(flare_pool_create(&c, &pool));
            OK(flare_retention_begin(pool));
            OK(flare_package_allocate(pool, 4 * MiB, &p));
            OK(flare_package_free(pool, p));
            OK(flare_package_allocate(pool, 2 * MiB, &q));
            OK(flare_package_free(pool, q));
            s = snap(pool);
            CHECK(s.reuse_hits == want_hits[i]);
            OK(flare_pool_destroy(pool));
        }
    }
    {
        FlarePoolConfig c = cfg;
        c.sim_granularity_bytes = 64 * 1024;
        OK(flare_pool_create(&c, &pool));
        s = snap(pool);
        CHECK(s.granularity_bytes == 64 * 1024);
        OK(flare_pool_destroy(pool));
    }
    {
        /* The CUDA backend: no driver on a machine without a GPU. Where there is one,
         * fault injection is not supported on it. A negative device is an invalid
         * argument on any machine: checked before the driver is loaded. */
        FlarePoolConfig c;
        FlareStatus st;
        flare_pool_config_init(&c, sizeof c);
        c.backend = FLARE_BACKEND_CUDA;
        c.device = -1;
        pool = sentinel;
        CHECK_STATUS(flare_pool_create(&c, &pool), FLARE_STATUS_INVALID_ARGUMENT);
        CHECK(pool == sentinel && last_error_contains("device ordinal -1 is negative"));
        c.device = 0;
        pool = NULL;
        st = flare_pool_create(&c, &pool);
        CHECK(st == FLARE_STATUS_NO_DRIVER || st == FLARE_STATUS_SUCCESS);
        if (st == FLARE_STATUS_SUCCESS) {
            FlareStream stream = (FlareStream)(uintptr_t)0x5e5e;
            void *p = NULL;
            uint64_t faults = 77;
            int valid = 7;
            CHECK_STATUS(flare_sim_inject_failure(pool, FLARE_CALL_MAP, 1, 999),
                         FLARE_STATUS_NOT_SUPPORTED);
            CHECK_STATUS(flare_sim_inject_panic(pool), FLARE_STATUS_NOT_SUPPORTED);
            /* The simulated streams: a CUDA pool has real ones. */
            CHECK_STATUS(flare_sim_stream_create(pool, &stream), FLARE_STATUS_NOT_SUPPORTED);
            CHECK(stream == (FlareStream)(uintptr_t)0x5e5e);
            OK(flare_package_allocate(pool, 1, &p));
            CHECK_STATUS(flare_sim_launch(pool, NULL, p, 1), FLARE_STATUS_NOT_SUPPORTED);
            CHECK_STATUS(flare_sim_stream_complete(pool, NULL), FLARE_STATUS_NOT_SUPPORTED);
            CHECK_STATUS(flare_sim_begin_capture(pool, NULL), FLARE_STATUS_NOT_SUPPORTED);
            CHECK_STATUS(flare_sim_end_capture(pool, NULL, &valid), FLARE_STATUS_NOT_SUPPORTED);
            CHECK_STATUS(flare_sim_faults(pool, &faults), FLARE_STATUS_NOT_SUPPORTED);
            CHECK(valid == 7 && faults == 77);
            OK(flare_package_free(pool, p));
            OK(flare_pool_destroy(pool));
        } else {
            fprintf(stderr, "  (CUDA backend: %s, as expected without a GPU)\n",
                    flare_status_name(st));
        }
    }
}

static void test_lifecycle(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    FlareSnapshot s;
    void *a = NULL, *b = NULL, *c = NULL;

    s = snap(pool);
    CHECK(s.struct_size == sizeof s && s.granularity_bytes == 2 * MiB && s.scope_open == 0);
    CHECK(snap_empty(&s) && s.allocations == 0 && s.peak_physical_bytes == 0);

    OK(flare_package_allocate(pool, 1, &a));
    OK(flare_package_allocate(pool, 3 * MiB, &b));
    CHECK(a != NULL && b != NULL && a != b);
    CHECK(((uintptr_t)a % (2 * MiB)) == 0 && ((uintptr_t)b % (2 * MiB)) == 0);
    s = snap(pool);
    CHECK(s.live_count == 2 && s.live_requested_bytes == 1 + 3 * MiB);
    CHECK(s.live_mapped_bytes == 6 * MiB && s.physical_bytes == 6 * MiB);
    CHECK(s.allocations == 2 && s.mappings_created == 2 && snap_consistent(&s));

    OK(flare_package_free(pool, a));
    OK(flare_package_free(pool, b));
    OK(flare_package_free(pool, NULL)); /* a no-op */
    s = snap(pool);
    CHECK(snap_empty(&s) && s.frees == 2 && s.mappings_released == 2);
    CHECK(s.peak_physical_bytes == 6 * MiB && s.peak_live_mapped_bytes == 6 * MiB);

    /* A scope: the freed mapping is retained and reused, released at finish. */
    OK(flare_retention_begin(pool));
    CHECK(snap(pool).scope_open == 1);
    OK(flare_package_allocate(pool, 4 * MiB, &a));
    OK(flare_package_free(pool, a));
    s = snap(pool);
    CHECK(s.idle_count == 1 && s.idle_bytes == 4 * MiB && s.physical_bytes == 4 * MiB);
    OK(flare_package_allocate(pool, 4 * MiB, &b));
    CHECK(a == b);
    s = snap(pool);
    CHECK(s.reuse_hits == 1 && s.reuse_exact_hits == 1 && s.idle_count == 0);
    CHECK_STATUS(flare_pool_trim(pool), FLARE_STATUS_SCOPE_STATE);
    OK(flare_package_free(pool, b));
    OK(flare_retention_finish(pool));
    s = snap(pool);
    CHECK(snap_empty(&s) && s.scope_open == 0 && s.scopes_finished == 1);

    /* Abort: the same release, counted apart; a live allocation stays live. */
    OK(flare_retention_begin(pool));
    OK(flare_package_allocate(pool, 2 * MiB, &a));
    OK(flare_package_allocate(pool, 2 * MiB, &c));
    OK(flare_package_free(pool, a));
    OK(flare_retention_abort(pool));
    s = snap(pool);
    CHECK(s.scopes_aborted == 1 && s.live_count == 1 && s.idle_count == 0 &&
          s.physical_bytes == 2 * MiB && snap_consistent(&s));
    OK(flare_package_free(pool, c));
    OK(flare_pool_trim(pool));
    s = snap(pool);
    CHECK(snap_empty(&s));

    /* Destroy with live allocations releases them, and says so in the message. */
    OK(flare_package_allocate(pool, 10 * MiB, &a));
    OK(flare_retention_begin(pool));
    OK(flare_pool_destroy(pool));
    CHECK(last_error_contains("flare_pool_destroy: released 1 live allocation(s): 10485760 "
                              "bytes requested, 10485760 bytes (10.0 MiB) mapped"));
    OK(flare_pool_destroy(NULL)); /* a no-op */

    /* A release threshold caches freed mappings outside a scope until trim. */
    pool = new_pool(FLARE_REUSE_EXACT, 0, 4 * MiB);
    OK(flare_package_allocate(pool, 2 * MiB, &a));
    OK(flare_package_free(pool, a));
    s = snap(pool);
    CHECK(s.idle_bytes == 2 * MiB && s.physical_bytes == 2 * MiB);
    OK(flare_package_allocate(pool, 2 * MiB, &b));
    CHECK(a == b && snap(pool).reuse_hits == 1);
    OK(flare_package_free(pool, b));
    OK(flare_pool_trim(pool));
    s = snap(pool);
    CHECK(snap_empty(&s));
    OK(flare_pool_destroy(pool));
}

/* Inside a scope on a 4 MiB device: 4 MiB allocated and freed (retained idle), then
 * 2 MiB asked for. The idle mapping is 100% over the request, past the default
 * best-fit bound (30%), so it is not a policy fit; creating 2 MiB more does not fit
 * (4 + 2 > 4), and a scope releases nothing: the pool takes the idle mapping rather
 * than fail, a forced reuse, counted in reuse_forced_hits (a field added after
 * reserve_failures, before the stream-order counters of issue 11). */
static void test_forced_reuse(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 4 * MiB, 0);
    FlareSnapshot s, old;
    void *p = NULL, *q = NULL;
    OK(flare_retention_begin(pool));
    OK(flare_package_allocate(pool, 4 * MiB, &p));
    OK(flare_package_free(pool, p));
    s = snap(pool);
    CHECK(s.reuse_hits == 0 && s.reuse_forced_hits == 0 && s.idle_bytes == 4 * MiB);
    OK(flare_package_allocate(pool, 2 * MiB, &q));
    CHECK(q == p);
    s = snap(pool);
    CHECK(s.reuse_hits == 1 && s.reuse_forced_hits == 1 && s.reuse_exact_hits == 0);
    CHECK(s.mappings_created == 1 && s.create_failures == 1 && s.live_mapped_bytes == 4 * MiB &&
          s.live_requested_bytes == 2 * MiB && s.physical_bytes == 4 * MiB);
    /* A caller compiled before the field: its struct ends at reserve_failures, and the
     * field's bytes are left as they are. */
    CHECK(offsetof(FlareSnapshot, reuse_forced_hits) ==
              offsetof(FlareSnapshot, reserve_failures) + 8 &&
          offsetof(FlareSnapshot, events_outstanding) ==
              offsetof(FlareSnapshot, reuse_forced_hits) + 8 &&
          offsetof(FlareSnapshot, segment_count) ==
              offsetof(FlareSnapshot, stream_call_failures) + 8 &&
          offsetof(FlareSnapshot, thread_cache_count) ==
              offsetof(FlareSnapshot, segment_lent_bytes) + 8 &&
          offsetof(FlareSnapshot, tags_sleeping) == offsetof(FlareSnapshot, remote_frees) + 8 &&
          offsetof(FlareSnapshot, sleeping_block_count) == offsetof(FlareSnapshot, offloaded_bytes) + 8 &&
          offsetof(FlareSnapshot, host_kept_bytes) ==
              offsetof(FlareSnapshot, sleeping_block_bytes) + 8 &&
          sizeof(FlareSnapshot) == offsetof(FlareSnapshot, host_kept_bytes) + 8);
    memset(&old, 0xab, sizeof old);
    old.struct_size = (uint32_t)offsetof(FlareSnapshot, reuse_forced_hits);
    OK(flare_pool_snapshot(pool, &old));
    CHECK(old.reuse_hits == 1 && old.reserve_failures == 0 && old.create_failures == 1 &&
          old.reuse_forced_hits == UINT64_C(0xabababababababab));
    OK(flare_package_free(pool, q));
    OK(flare_retention_finish(pool));
    s = snap(pool);
    CHECK(snap_empty(&s) && s.reuse_forced_hits == 1);
    OK(flare_pool_destroy(pool));
}

/* Inside one scope, twelve forwards, each with two 1 GiB transients: allocated and
 * freed one after the other (overlap 0: allocate, free, allocate, free), or both
 * live at once (overlap 1: allocate, allocate, free, free). The peak is what one
 * forward needs when freed memory is reused (1 GiB, or 2 GiB with both live; in
 * segment mode the freed block goes back to its heap and the next transient is
 * carved from it, the same), and 24 GiB when nothing is reused (FLARE_REUSE_NONE
 * retains every mapping: the warmup-retention bug). */
static void test_warmup(FlareReusePolicy policy, int overlap, uint64_t want_peak) {
    FlarePool *pool = new_pool(policy, 0, 0);
    FlareSnapshot s;
    int i;
    OK(flare_retention_begin(pool));
    for (i = 0; i < 12; i++) {
        void *p = NULL, *q = NULL;
        OK(flare_package_allocate(pool, (size_t)GiB, &p));
        if (!overlap) {
            OK(flare_package_free(pool, p));
        }
        OK(flare_package_allocate(pool, (size_t)GiB, &q));
        CHECK(overlap ? q != p : 1);
        if (overlap) {
            OK(flare_package_free(pool, p));
        }
        OK(flare_package_free(pool, q));
    }
    s = snap(pool);
    CHECK(s.peak_physical_bytes == want_peak && snap_consistent(&s));
    /* Everything freed, retained: idle whole mappings, or free blocks in segments. */
    CHECK(s.physical_bytes == want_peak && s.idle_bytes + s.block_free_bytes == want_peak &&
          s.live_count == 0);
    if (policy == FLARE_REUSE_SEGMENTS) {
        /* One large segment holding every handle mapped: one for the first transient,
         * one more for the second when both are live (the heap grows at its end). */
        CHECK(s.segment_count == 1 && s.idle_bytes == 0 && s.segment_mapped_bytes == want_peak &&
              s.segment_handles == (uint64_t)(overlap ? 2 : 1) &&
              s.mappings_created == (uint64_t)(overlap ? 2 : 1) && s.block_live_count == 0);
    } else {
        CHECK(s.segment_count == 0 && s.segment_mapped_bytes == 0 && s.block_free_bytes == 0);
    }
    if (s.peak_physical_bytes != want_peak) {
        fprintf(stderr, "  warmup, policy %d, overlap %d: peak %" PRIu64 " bytes, expected %" PRIu64
                        "\n",
                (int)policy, overlap, s.peak_physical_bytes, want_peak);
    }
    OK(flare_retention_finish(pool));
    s = snap(pool);
    CHECK(snap_released(&s) && s.allocations == 24 && s.frees == 24);
    /* Segment mode keeps the segment's reservation (at least what was mapped in it). */
    CHECK(policy == FLARE_REUSE_SEGMENTS ? s.segment_count == 1 && s.reserved_bytes >= want_peak
                                         : snap_empty(&s));
    OK(flare_pool_destroy(pool));
}

/* Every bad input returns its status and changes nothing. */
static void test_bad_inputs(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, GiB, 0);
    void *const sentinel = (void *)(uintptr_t)0x5e5e;
    void *p = NULL, *live = NULL, *freed = NULL, *out;
    FlareSnapshot before, after, raw, raw_before;
    char buf[16];
    char full[1024];
    size_t n, m;
    uint32_t sizes[4] = {0, 4, 7, 4097};
    int i;

    OK(flare_package_allocate(pool, 3 * MiB, &live));
    OK(flare_package_allocate(pool, 2 * MiB, &freed));
    OK(flare_package_free(pool, freed));
    before = snap(pool);

    /* NULL pool, everywhere. */
    out = sentinel;
    CHECK_STATUS(flare_package_allocate(NULL, 1, &out), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(out == sentinel && last_error_contains("pool is NULL"));
    CHECK_STATUS(flare_package_free(NULL, live), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_package_free(NULL, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_retention_begin(NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_retention_finish(NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_retention_abort(NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_trim(NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_snapshot(NULL, &after), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_inject_failure(NULL, FLARE_CALL_MAP, 1, 999),
                 FLARE_STATUS_INVALID_ARGUMENT);
    /* NULL outputs. */
    CHECK_STATUS(flare_package_allocate(pool, 1, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("out_ptr is NULL"));
    CHECK_STATUS(flare_pool_snapshot(pool, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    /* Sizes: 0, one that overflows when rounded, one beyond the 1 GiB device. */
    out = sentinel;
    CHECK_STATUS(flare_package_allocate(pool, 0, &out), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(out == sentinel && last_error_contains("0 bytes"));
    CHECK_STATUS(flare_package_allocate(pool, SIZE_MAX, &out), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(out == sentinel);
    after = snap(pool);
    CHECK(snap_equal(&before, &after));

    /* Beyond the whole device (1 GiB): too large, not out of memory; refused before
     * any driver call, nothing counted. */
    CHECK_STATUS(flare_package_allocate(pool, (size_t)GiB + 1, &out),
                 FLARE_STATUS_REQUEST_TOO_LARGE);
    CHECK(out == sentinel && last_error_contains("request too large"));
    CHECK(last_error_contains("more than the device's total memory of 1.0 GiB"));
    after = snap(pool);
    CHECK(snap_equal(&before, &after));
    /* The whole device is not too large, but with 4 MiB live it is full now: out of
     * memory, after releasing the idle mapping and retrying once. */
    CHECK_STATUS(flare_package_allocate(pool, (size_t)GiB, &out), FLARE_STATUS_OUT_OF_MEMORY);
    CHECK(out == sentinel && last_error_contains("out of memory"));
    after = snap(pool);
    CHECK(after.oom_retries == before.oom_retries + 1 && after.live_count == 1);
    before = snap(pool);

    /* Pointers: unknown, interior, already freed. */
    CHECK_STATUS(flare_package_free(pool, (void *)(uintptr_t)0x1234),
                 FLARE_STATUS_UNKNOWN_POINTER);
    CHECK(last_error_contains("unknown pointer 0x1234"));
    CHECK_STATUS(flare_package_free(pool, (char *)live + 4096), FLARE_STATUS_UNKNOWN_POINTER);
    CHECK_STATUS(flare_package_free(pool, freed), FLARE_STATUS_UNKNOWN_POINTER);
    after = snap(pool);
    CHECK(snap_equal(&before, &after));

    /* Scope state. */
    CHECK_STATUS(flare_retention_finish(pool), FLARE_STATUS_SCOPE_STATE);
    CHECK(last_error_contains("flare_retention_finish"));
    CHECK_STATUS(flare_retention_abort(pool), FLARE_STATUS_SCOPE_STATE);
    after = snap(pool);
    CHECK(snap_equal(&before, &after));
    OK(flare_retention_begin(pool));
    before = snap(pool);
    CHECK_STATUS(flare_retention_begin(pool), FLARE_STATUS_SCOPE_STATE);
    CHECK_STATUS(flare_pool_trim(pool), FLARE_STATUS_SCOPE_STATE);
    after = snap(pool);
    CHECK(snap_equal(&before, &after));
    OK(flare_retention_finish(pool));
    before = snap(pool);

    /* Fault-injection arguments. */
    CHECK_STATUS(flare_sim_inject_failure(pool, (FlareDriverCall)8, 1, 999),
                 FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_inject_failure(pool, FLARE_CALL_MAP, 0, 999),
                 FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_inject_failure(pool, FLARE_CALL_MAP, 1, 0),
                 FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_inject_failure(pool, FLARE_CALL_MAP, 1, -1),
                 FLARE_STATUS_INVALID_ARGUMENT);

    /* Snapshot struct_size: bad ones write nothing. */
    for (i = 0; i < 4; i++) {
        memset(&raw, 0xab, sizeof raw);
        raw.struct_size = sizes[i];
        raw_before = raw;
        CHECK_STATUS(flare_pool_snapshot(pool, &raw), FLARE_STATUS_INVALID_ARGUMENT);
        CHECK(snap_equal(&raw, &raw_before));
    }
    /* An older caller's shorter struct: only the fields wholly inside are written (a
     * size ending mid-field stops before that field). */
    memset(&raw, 0xab, sizeof raw);
    raw.struct_size = (uint32_t)offsetof(FlareSnapshot, idle_count) + 4;
    OK(flare_pool_snapshot(pool, &raw));
    CHECK(raw.struct_size == offsetof(FlareSnapshot, idle_count) + 4);
    CHECK(raw.live_count == 1 && raw.live_requested_bytes == 3 * MiB &&
          raw.live_mapped_bytes == 4 * MiB && raw.granularity_bytes == 2 * MiB);
    CHECK(raw.idle_count == UINT64_C(0xabababababababab) &&
          raw.scopes_aborted == UINT64_C(0xabababababababab));
    /* A newer caller's larger struct: the library's fields, the rest untouched. */
    {
        unsigned char big[4096];
        FlareSnapshot head;
        uint32_t size = 4096;
        memset(big, 0xab, sizeof big);
        memcpy(big, &size, sizeof size);
        OK(flare_pool_snapshot(pool, (FlareSnapshot *)(void *)big));
        memcpy(&head, big, sizeof head);
        after = snap(pool);
        head.struct_size = after.struct_size;
        CHECK(snap_equal(&head, &after));
        CHECK(big[sizeof head] == 0xab && big[4095] == 0xab);
    }
    after = snap(pool);
    CHECK(snap_equal(&before, &after));

    /* The last error message: truncation, NULL buffer, exact fit, kept over successes. */
    CHECK_STATUS(flare_package_free(pool, freed), FLARE_STATUS_UNKNOWN_POINTER);
    OK(flare_pool_trim(pool)); /* a success does not clear it */
    n = flare_last_error_message(full, sizeof full);
    CHECK(n > sizeof buf && n < sizeof full && strlen(full) == n);
    CHECK(strstr(full, "flare_package_free") != NULL && strstr(full, "unknown pointer") != NULL);
    memset(buf, 'x', sizeof buf);
    m = flare_last_error_message(buf, sizeof buf);
    CHECK(m == n && buf[sizeof buf - 1] == '\0' && strlen(buf) == sizeof buf - 1 &&
          strncmp(buf, full, sizeof buf - 1) == 0);
    CHECK(flare_last_error_message(NULL, 0) == n);
    CHECK(flare_last_error_message(NULL, 100) == n);
    memset(buf, 'x', sizeof buf);
    CHECK(flare_last_error_message(buf, 0) == n && buf[0] == 'x');
    CHECK(flare_last_error_message(buf, 1) == n && buf[0] == '\0' && buf[1] == 'x');
    {
        char *exact = (char *)malloc(n + 1);
        CHECK(exact != NULL);
        if (exact != NULL) {
            CHECK(flare_last_error_message(exact, n + 1) == n && strcmp(exact, full) == 0);
            free(exact);
        }
    }
    after = snap(pool);
    CHECK(snap_equal(&before, &after));

    p = NULL;
    OK(flare_package_free(pool, live));
    OK(flare_package_allocate(pool, 1, &p)); /* still usable */
    OK(flare_package_free(pool, p));
    after = snap(pool);
    CHECK(snap_empty(&after));
    OK(flare_pool_destroy(pool));
}

static const char *const cuda_names[8] = {
    "cuMemCreate", "cuMemRelease", "cuMemAddressReserve", "cuMemAddressFree",
    "cuMemMap",    "cuMemSetAccess", "cuMemUnmap",        "cuCtxSynchronize",
};

/* The pool is usable (an allocation and a free work) and, after trim, holds nothing. */
static void check_recovered(FlarePool *pool, const char *what) {
    void *p = NULL;
    FlareSnapshot s;
    OK(flare_pool_trim(pool));
    s = snap(pool);
    CHECK(snap_empty(&s) && snap_consistent(&s));
    OK(flare_package_allocate(pool, 5 * MiB, &p));
    OK(flare_package_free(pool, p));
    s = snap(pool);
    CHECK(snap_empty(&s));
    if (!snap_empty(&s)) {
        fprintf(stderr, "  after %s: physical %" PRIu64 ", reserved %" PRIu64
                        ", pending %" PRIu64 "\n",
                what, s.physical_bytes, s.reserved_bytes, s.pending_count);
    }
}

static void test_injected_failures(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    FlareSnapshot s, before;
    void *p = NULL, *const sentinel = (void *)(uintptr_t)0x5e5e;
    int k;

    /* Allocation steps. */
    for (k = 0; k < 4; k++) {
        static const FlareDriverCall calls[4] = {FLARE_CALL_CREATE, FLARE_CALL_RESERVE,
                                                 FLARE_CALL_MAP, FLARE_CALL_SET_ACCESS};
        FlareDriverCall call = calls[k];
        before = snap(pool);
        OK(flare_sim_inject_failure(pool, call, 1, 999));
        p = sentinel;
        CHECK_STATUS(flare_package_allocate(pool, 3 * MiB, &p), FLARE_STATUS_DRIVER_ERROR);
        CHECK(p == sentinel);
        CHECK(last_error_contains(cuda_names[call]) && last_error_contains("999"));
        s = snap(pool);
        CHECK(snap_empty(&s) && s.allocations == before.allocations);
        CHECK(call != FLARE_CALL_MAP || s.map_failures == before.map_failures + 1);
        CHECK(call != FLARE_CALL_SET_ACCESS || s.access_failures == before.access_failures + 1);
        check_recovered(pool, cuda_names[call]);
    }

    /* The nth call: the second create fails, the first succeeds. */
    {
        void *a = NULL;
        OK(flare_sim_inject_failure(pool, FLARE_CALL_CREATE, 2, 999));
        OK(flare_package_allocate(pool, MiB, &a));
        CHECK_STATUS(flare_package_allocate(pool, MiB, &p), FLARE_STATUS_DRIVER_ERROR);
        OK(flare_package_free(pool, a));
        check_recovered(pool, "second cuMemCreate");
    }

    /* Out of memory from cuMemCreate: outside a scope the pool releases what is idle
     * and retries once, which succeeds; inside a scope it reports it. */
    before = snap(pool);
    OK(flare_sim_inject_failure(pool, FLARE_CALL_CREATE, 1, 2));
    OK(flare_package_allocate(pool, MiB, &p));
    CHECK(snap(pool).oom_retries == before.oom_retries + 1);
    OK(flare_package_free(pool, p));
    OK(flare_retention_begin(pool));
    OK(flare_sim_inject_failure(pool, FLARE_CALL_CREATE, 1, 2));
    CHECK_STATUS(flare_package_allocate(pool, MiB, &p), FLARE_STATUS_OUT_OF_MEMORY);
    CHECK(last_error_contains("inside a retention scope"));
    OK(flare_retention_finish(pool));
    check_recovered(pool, "out of memory");

    /* A failing undo step: map fails, then freeing the reservation fails too. The
     * leftover is kept pending and released by the next trim. */
    OK(flare_sim_inject_failure(pool, FLARE_CALL_MAP, 1, 999));
    OK(flare_sim_inject_failure(pool, FLARE_CALL_FREE_RESERVATION, 1, 999));
    CHECK_STATUS(flare_package_allocate(pool, MiB, &p), FLARE_STATUS_DRIVER_ERROR);
    s = snap(pool);
    CHECK(s.pending_count == 1 && s.reserved_bytes == 2 * MiB && s.physical_bytes == 0);
    check_recovered(pool, "map + cuMemAddressFree");

    /* Release steps, at a free outside a scope: the free succeeds, the refused step is
     * counted and its memory kept (pending after a refused release or address free;
     * still mapped, back to idle, after a refused unmap or synchronize), and the next
     * trim releases it. */
    for (k = 0; k < 4; k++) {
        static const FlareDriverCall calls[4] = {FLARE_CALL_RELEASE, FLARE_CALL_FREE_RESERVATION,
                                                 FLARE_CALL_UNMAP, FLARE_CALL_SYNCHRONIZE};
        FlareDriverCall call = calls[k];
        before = snap(pool);
        OK(flare_package_allocate(pool, 2 * MiB, &p));
        OK(flare_sim_inject_failure(pool, call, 1, 999));
        OK(flare_package_free(pool, p));
        s = snap(pool);
        CHECK(s.pending_count + s.idle_count == 1 && s.live_count == 0 && snap_consistent(&s));
        CHECK(call != FLARE_CALL_RELEASE ||
              (s.release_failures == before.release_failures + 1 &&
               s.physical_bytes == 2 * MiB && s.reserved_bytes == 0));
        CHECK(call != FLARE_CALL_FREE_RESERVATION ||
              (s.reservation_free_failures == before.reservation_free_failures + 1 &&
               s.physical_bytes == 0 && s.reserved_bytes == 2 * MiB));
        CHECK(call != FLARE_CALL_UNMAP ||
              (s.unmap_failures == before.unmap_failures + 1 && s.idle_bytes == 2 * MiB));
        CHECK(call != FLARE_CALL_SYNCHRONIZE ||
              (s.sync_failures == before.sync_failures + 1 && s.idle_bytes == 2 * MiB));
        check_recovered(pool, cuda_names[call]);
    }

    /* Release steps at the end of a scope: finish reports the first refused step,
     * closes the scope all the same, and the next trim releases what was kept. */
    for (k = 1; k < 8; k++) {
        FlareDriverCall call = (FlareDriverCall)k;
        if (call == FLARE_CALL_RESERVE || call == FLARE_CALL_MAP || call == FLARE_CALL_SET_ACCESS) {
            continue;
        }
        OK(flare_retention_begin(pool));
        OK(flare_package_allocate(pool, 2 * MiB, &p));
        OK(flare_package_free(pool, p));
        OK(flare_sim_inject_failure(pool, call, 1, 999));
        if (k % 2 == 0) {
            CHECK_STATUS(flare_retention_finish(pool), FLARE_STATUS_DRIVER_ERROR);
        } else {
            CHECK_STATUS(flare_retention_abort(pool), FLARE_STATUS_DRIVER_ERROR);
        }
        CHECK(last_error_contains(cuda_names[call]));
        s = snap(pool);
        CHECK(s.scope_open == 0 && snap_consistent(&s) && s.physical_bytes + s.reserved_bytes > 0);
        check_recovered(pool, cuda_names[call]);
    }
    OK(flare_pool_destroy(pool));
}

/* Two simulated pools never share an address: a pointer of one is unknown to the
 * other, which is left unchanged, as on the real driver (one address space per
 * process). */
static void test_wrong_pool(void) {
    FlarePool *a = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    FlarePool *b = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    FlareSnapshot before, after;
    void *p = NULL, *q = NULL;
    OK(flare_package_allocate(a, 1, &p));
    OK(flare_package_allocate(b, 1, &q));
    CHECK(p != NULL && q != NULL && p != q);
    before = snap(b);
    CHECK_STATUS(flare_package_free(b, p), FLARE_STATUS_UNKNOWN_POINTER);
    after = snap(b);
    CHECK(snap_equal(&before, &after) && after.live_count == 1);
    before = snap(a);
    CHECK_STATUS(flare_package_free(a, q), FLARE_STATUS_UNKNOWN_POINTER);
    after = snap(a);
    CHECK(snap_equal(&before, &after));
    OK(flare_package_free(b, q));
    OK(flare_package_free(a, p));
    CHECK(snap(a).live_count == 0 && snap(b).live_count == 0);
    OK(flare_pool_destroy(a));
    OK(flare_pool_destroy(b));
}

static FlareDestroyReport empty_report(void) {
    FlareDestroyReport r;
    memset(&r, 0xab, sizeof r);
    r.struct_size = (uint32_t)sizeof r;
    return r;
}

/* Destroy says how many live allocations and how many bytes it released. */
static void test_destroy_report(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 64 * MiB);
    FlareDestroyReport r = empty_report();
    void *a = NULL, *b = NULL, *idle = NULL;

    /* Two live (1 B and 3 MiB: 2 + 4 MiB mapped) and one cached idle (2 MiB). */
    OK(flare_package_allocate(pool, 1, &a));
    OK(flare_package_allocate(pool, 3 * MiB, &b));
    OK(flare_package_allocate(pool, 2 * MiB, &idle));
    OK(flare_package_free(pool, idle));
    /* Bad report arguments destroy nothing: the pool stays usable. */
    CHECK_STATUS(flare_pool_destroy_report(pool, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    r.struct_size = 4;
    CHECK_STATUS(flare_pool_destroy_report(pool, &r), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(r.live_count == UINT64_C(0xabababababababab));
    CHECK(snap(pool).live_count == 2);

    r = empty_report();
    OK(flare_pool_destroy_report(pool, &r));
    CHECK(r.struct_size == sizeof r && r.scope_was_open == 0 && r.live_count == 2 &&
          r.live_requested_bytes == 1 + 3 * MiB && r.live_mapped_bytes == 6 * MiB &&
          r.physical_bytes == 8 * MiB);
    CHECK(last_error_contains("flare_pool_destroy_report: released 2 live allocation(s): "
                              "3145729 bytes requested, 6291456 bytes (6.0 MiB) mapped"));

    /* Nothing live, a scope open: the report says so and the message is left alone. */
    pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    OK(flare_retention_begin(pool));
    OK(flare_package_allocate(pool, 2 * MiB, &a));
    OK(flare_package_free(pool, a));
    CHECK_STATUS(flare_package_free(pool, a), FLARE_STATUS_UNKNOWN_POINTER);
    r = empty_report();
    OK(flare_pool_destroy_report(pool, &r));
    CHECK(r.scope_was_open == 1 && r.live_count == 0 && r.live_requested_bytes == 0 &&
          r.live_mapped_bytes == 0 && r.physical_bytes == 2 * MiB);
    CHECK(last_error_contains("unknown pointer"));

    /* An older caller's shorter report: only the fields wholly inside are written. */
    pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    OK(flare_package_allocate(pool, 5 * MiB, &a));
    r = empty_report();
    r.struct_size = (uint32_t)offsetof(FlareDestroyReport, live_requested_bytes);
    OK(flare_pool_destroy_report(pool, &r));
    CHECK(r.live_count == 1 && r.live_requested_bytes == UINT64_C(0xabababababababab) &&
          r.physical_bytes == UINT64_C(0xabababababababab));

    /* Segment mode: live blocks are held bytes, each its request rounded to 512 B:
     * 4096 B and 3 MiB + 1 B live are 4096 + (3 MiB + 512) bytes; physical, the small
     * segment's 2 MiB handle and the large one's (3 MiB + 512 rounded to the
     * granularity) 4 MiB. */
    pool = new_pool(FLARE_REUSE_SEGMENTS, 0, 0);
    OK(flare_package_allocate(pool, 4096, &a));
    OK(flare_package_allocate(pool, 3 * MiB + 1, &b));
    r = empty_report();
    OK(flare_pool_destroy_report(pool, &r));
    CHECK(r.live_count == 2 && r.live_requested_bytes == 4096 + 3 * MiB + 1 &&
          r.live_mapped_bytes == 4096 + 3 * MiB + 512 && r.physical_bytes == 6 * MiB);
    CHECK(last_error_contains("released 2 live allocation(s): 3149825 bytes requested, "
                              "3150336 bytes"));

    /* NULL pool: success, nothing released. */
    r = empty_report();
    OK(flare_pool_destroy_report(NULL, &r));
    CHECK(r.live_count == 0 && r.physical_bytes == 0 && r.scope_was_open == 0);
}

/* A panic caught at the C boundary poisons the pool: every later call on it returns
 * FLARE_STATUS_INTERNAL and says so; destroy still releases what the pool holds. */
static void test_poisoned(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    FlarePool *other = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    void *const sentinel = (void *)(uintptr_t)0x5e5e;
    void *a = NULL, *b = sentinel, *c = NULL;
    FlareSnapshot s;
    FlareDestroyReport r = empty_report();

    OK(flare_package_allocate(pool, 3 * MiB, &a));
    OK(flare_sim_inject_panic(pool));
    /* The injected panic fires once the allocation is made, before its pointer is
     * returned (the message goes to stderr too: the panic hook's). */
    fprintf(stderr, "  (an injected panic follows)\n");
    CHECK_STATUS(flare_package_allocate(pool, MiB, &b), FLARE_STATUS_INTERNAL);
    CHECK(b == sentinel);
    CHECK(last_error_contains("flare_package_allocate: internal error") &&
          last_error_contains("injected by flare_sim_inject_panic") &&
          last_error_contains("poisoned"));
    /* Every later call on the pool is refused and says why. */
    memset(&s, 0, sizeof s);
    s.struct_size = (uint32_t)sizeof s;
    CHECK_STATUS(flare_package_free(pool, a), FLARE_STATUS_INTERNAL);
    CHECK(last_error_contains("flare_package_free: the pool is poisoned"));
    CHECK_STATUS(flare_package_free(pool, NULL), FLARE_STATUS_INTERNAL);
    b = sentinel;
    CHECK_STATUS(flare_package_allocate(pool, 1, &b), FLARE_STATUS_INTERNAL);
    CHECK(b == sentinel);
    CHECK_STATUS(flare_retention_begin(pool), FLARE_STATUS_INTERNAL);
    CHECK_STATUS(flare_retention_finish(pool), FLARE_STATUS_INTERNAL);
    CHECK_STATUS(flare_retention_abort(pool), FLARE_STATUS_INTERNAL);
    CHECK_STATUS(flare_pool_trim(pool), FLARE_STATUS_INTERNAL);
    CHECK_STATUS(flare_pool_snapshot(pool, &s), FLARE_STATUS_INTERNAL);
    CHECK(s.live_count == 0); /* not written */
    CHECK_STATUS(flare_sim_inject_failure(pool, FLARE_CALL_MAP, 1, 999), FLARE_STATUS_INTERNAL);
    CHECK_STATUS(flare_sim_inject_panic(pool), FLARE_STATUS_INTERNAL);
    CHECK(last_error_contains("flare_sim_inject_panic: the pool is poisoned") &&
          last_error_contains("flare_package_allocate: injected by flare_sim_inject_panic"));
    /* Another pool is not affected. */
    OK(flare_package_allocate(other, 1, &c));
    OK(flare_package_free(other, c));
    OK(flare_pool_destroy(other));
    /* Destroy releases both allocations, the one whose pointer was never returned
     * too. */
    OK(flare_pool_destroy_report(pool, &r));
    CHECK(r.live_count == 2 && r.live_requested_bytes == 4 * MiB &&
          r.live_mapped_bytes == 6 * MiB && r.physical_bytes == 6 * MiB);
}

struct worker {
    FlarePool *pool;
    int id;
    int failures;
};

static void *worker_main(void *arg) {
    struct worker *w = (struct worker *)arg;
    void *held[4] = {NULL, NULL, NULL, NULL};
    int i, j;
    for (i = 0; i < 400; i++) {
        size_t size = 1 + (size_t)(((unsigned)i * 7919u + (unsigned)w->id * 104729u) % (9u << 20));
        j = i % 4;
        if (held[j] != NULL) {
            if (flare_package_free(w->pool, held[j]) != FLARE_STATUS_SUCCESS) {
                w->failures++;
            }
            held[j] = NULL;
        }
        if (flare_package_allocate(w->pool, size, &held[j]) != FLARE_STATUS_SUCCESS) {
            w->failures++;
        }
        if (i % 50 == 0) {
            FlareSnapshot s = snap(w->pool);
            if (!snap_consistent(&s)) {
                w->failures++;
            }
        }
    }
    for (j = 0; j < 4; j++) {
        if (flare_package_free(w->pool, held[j]) != FLARE_STATUS_SUCCESS) {
            w->failures++;
        }
    }
    return NULL;
}

static void run_parallel(void *(*fn)(void *), void *args[], int n);

/* Four threads, each allocating and freeing 400 sizes from 1 byte to 9 MiB, four
 * live at a time, with snapshots taken meanwhile: every call succeeds, every
 * snapshot is consistent, and after a trim nothing is held (in segment mode, the
 * segments' reservations but no memory). */
static void test_threads(FlareReusePolicy policy, int in_scope, uint64_t threshold) {
    FlarePool *pool = new_pool(policy, 0, threshold);
    struct worker workers[4];
    void *args[4];
    FlareSnapshot s;
    int i;
    if (in_scope) {
        OK(flare_retention_begin(pool));
    }
    for (i = 0; i < 4; i++) {
        workers[i].pool = pool;
        workers[i].id = i;
        workers[i].failures = 0;
        args[i] = &workers[i];
    }
    run_parallel(worker_main, args, 4);
    for (i = 0; i < 4; i++) {
        CHECK(workers[i].failures == 0);
    }
    s = snap(pool);
    CHECK(s.live_count == 0 && s.allocations == 1600 && s.frees == 1600 && snap_consistent(&s));
    if (in_scope) {
        CHECK(s.reuse_hits > 0);
        OK(flare_retention_finish(pool));
    }
    OK(flare_pool_trim(pool));
    s = snap(pool);
    CHECK(policy == FLARE_REUSE_SEGMENTS ? snap_released(&s) && s.segment_count > 0
                                         : snap_empty(&s));
    OK(flare_pool_destroy(pool));
}

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
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}

#endif /* FLARE_LIFECYCLE_TESTS_H */

/*
 * The C ABI's names and configuration: every status's name, the enums' numbers,
 * the version macros, flare_pool_config_init's defaults and struct_size versioning,
 * and the configurations flare_pool_create accepts and refuses (both backends).
 *
 * Included by lifecycle_tests.h after its helpers (CHECK, OK, snap, new_pool, ...);
 * run_all_tests calls the tests.
 */
#ifndef FLARE_CONFIG_TESTS_H
#define FLARE_CONFIG_TESTS_H

static void test_status_names(void) {
    static const char *const names[] = {
        "FLARE_STATUS_SUCCESS",         "FLARE_STATUS_INVALID_ARGUMENT",
        "FLARE_STATUS_OUT_OF_MEMORY",   "FLARE_STATUS_NOT_SUPPORTED",
        "FLARE_STATUS_UNKNOWN_POINTER", "FLARE_STATUS_SCOPE_STATE",
        "FLARE_STATUS_DRIVER_ERROR",    "FLARE_STATUS_NO_DRIVER",
        "FLARE_STATUS_INTERNAL",        "FLARE_STATUS_REQUEST_TOO_LARGE",
        "FLARE_STATUS_TAG_STATE",       "FLARE_STATUS_STREAM_STATE",
        "FLARE_STATUS_IO",
    };
    int i;
    for (i = 0; i <= 12; i++) {
        const char *n = flare_status_name((FlareStatus)i);
        CHECK(n != NULL && strcmp(n, names[i]) == 0);
    }
    /* 15 is inside the enum's value range in C++ too, but no enumerator. */
    CHECK(strcmp(flare_status_name((FlareStatus)15), "FLARE_STATUS_UNRECOGNIZED") == 0);
    CHECK(strcmp(flare_status_name((FlareStatus)13), "FLARE_STATUS_UNRECOGNIZED") == 0);
    CHECK(FLARE_STATUS_REQUEST_TOO_LARGE == 9 && FLARE_STATUS_INTERNAL == 8 &&
          FLARE_CALL_SYNCHRONIZE == 7 && FLARE_REUSE_SEGMENTS == 3 &&
          FLARE_REUSE_NONE == 2 && FLARE_BACKEND_SIMULATED == 1);
    /* The layouts on a 64-bit target, by hand (lifecycle.c and lifecycle.cpp assert
     * them at compile time): the configuration's u64 segment_whole_threshold_bytes at
     * 72, after 4 bytes of padding behind cross_stream_reuse (64..68), then the u32
     * thread_cache_entries at 80 and, after 4 bytes of padding (84..88), the u64
     * thread_cache_bytes at 88, up to 96, then the pointer record_path at 96, up to
     * 104, then the u64 history_events at 104, up to 112; the snapshot's eight segment counters after
     * stream_call_failures (296..304), up to 368, then the four thread-cache counters,
     * up to 400, then the six sleep counters (issue 15), up to 448, then the two
     * sleeping block counters (segments per tag), up to 464, then the kept host
     * buffer's bytes, up to 472. */
    CHECK(sizeof(FlarePoolConfig) == 112 && offsetof(FlarePoolConfig, record_path) == 96 &&
          offsetof(FlarePoolConfig, history_events) == 104 &&
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
    /* The library's version at run time is the header's (both from Cargo.toml, issue
     * 36): the number, its encoding, the string. */
    {
        char want[32];
        const char *got = flare_package_version_string();
        snprintf(want, sizeof want, "%d.%d.%d", FLARE_PACKAGE_VERSION_MAJOR,
                 FLARE_PACKAGE_VERSION_MINOR, FLARE_PACKAGE_VERSION_PATCH);
        CHECK(FLARE_PACKAGE_VERSION == FLARE_PACKAGE_VERSION_MAJOR * 10000 +
                                           FLARE_PACKAGE_VERSION_MINOR * 100 +
                                           FLARE_PACKAGE_VERSION_PATCH);
        CHECK(flare_package_version() == FLARE_PACKAGE_VERSION);
        CHECK(flare_package_version() / 10000 == FLARE_PACKAGE_VERSION_MAJOR &&
              flare_package_version() / 100 % 100 == FLARE_PACKAGE_VERSION_MINOR &&
              flare_package_version() % 100 == FLARE_PACKAGE_VERSION_PATCH);
        CHECK(got != NULL && strcmp(got, want) == 0);
        CHECK(strcmp(FLARE_PACKAGE_VERSION_STRING, want) == 0);
        CHECK(flare_package_version_string() == got); /* static storage */
    }
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

#endif /* FLARE_CONFIG_TESTS_H */

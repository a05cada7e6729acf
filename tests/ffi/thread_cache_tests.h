/*
 * Thread caches (issue 13) through the C ABI: the configuration's
 * thread_cache_entries (0: the default, 32; FLARE_THREAD_CACHE_OFF: off) and
 * thread_cache_bytes (0: the default, 1 GiB), their versioning by struct_size, and
 * the snapshot's thread-cache counters.
 *
 * Included by lifecycle_tests.h after segment_tests.h (it uses their helpers: CHECK,
 * OK, SNAP, snap, snap_consistent, snap_empty); run_all_tests calls the tests.
 *
 * The figures come from the contract (FlarePoolConfig's and FlareSnapshot's docs): a
 * free on a thread goes to that thread's cache while the cache has room (entries and
 * bytes) and nothing would be released anyway (a retention scope is open); that
 * thread's later allocations take it back from there, each a thread-cache hit and a
 * reuse hit; the end of the scope drains the caches and releases what they held.
 */
#ifndef FLARE_THREAD_CACHE_TESTS_H
#define FLARE_THREAD_CACHE_TESTS_H

/* On one thread, inside a retention scope, on a pool made from `cfg`: 4 MiB
 * allocated, then 100 times freed and allocated again, then freed. One mapping
 * serves every allocation: the first creates it, each of the 100 later ones reuses
 * it (the only idle mapping, of the very size asked for), at the same address.
 *
 * `cached`: whether the configuration gives this thread a cache that holds the
 * mapping (at least one entry and 4 MiB). Then the first free puts the mapping into
 * the thread's cache and every later allocation of that size is served from it: at
 * least 99 of the 100 reuse hits are thread-cache hits (100 once the first free goes
 * to the cache too), and the last free leaves it there (one entry, 4 MiB). Without
 * one, no hit is a thread-cache hit and the cache holds nothing. Either way nothing is
 * freed by another thread (no remote free), and finish drains and releases all. */
static void thread_cache_round_trips(const FlarePoolConfig *cfg, int cached,
                                     const char *what) {
    FlarePool *pool = NULL;
    FlareSnapshot s;
    void *first = NULL, *p = NULL;
    int i, same = 1;

    OK(flare_pool_create(cfg, &pool));
    CHECK(pool != NULL);
    if (pool == NULL) {
        return;
    }
    OK(flare_retention_begin(pool));
    OK(flare_package_allocate(pool, 4 * MiB, &first));
    p = first;
    for (i = 0; i < 100; i++) {
        OK(flare_package_free(pool, p));
        OK(flare_package_allocate(pool, 4 * MiB, &p));
        same &= p == first;
        if (i % 25 == 0) {
            SNAP(s, pool);
        }
    }
    CHECK(same);
    SNAP(s, pool);
    CHECK(s.allocations == 101 && s.frees == 100 && s.live_count == 1 &&
          s.live_mapped_bytes == 4 * MiB && s.physical_bytes == 4 * MiB);
    CHECK(s.mappings_created == 1 && s.reuse_hits == 100);
    CHECK(cached ? s.thread_cache_hits >= 99 : s.thread_cache_hits == 0);
    CHECK(s.remote_frees == 0);
    if (s.mappings_created != 1 || s.reuse_hits != 100 ||
        (cached ? s.thread_cache_hits < 99 : s.thread_cache_hits != 0)) {
        fprintf(stderr,
                "  thread caches, %s: %" PRIu64 " mapping(s) created, %" PRIu64
                " reuse hits, %" PRIu64 " thread-cache hits (expected %s)\n",
                what, s.mappings_created, s.reuse_hits, s.thread_cache_hits,
                cached ? "at least 99" : "0");
    }
    OK(flare_package_free(pool, p));
    SNAP(s, pool);
    CHECK(s.live_count == 0 && s.idle_count == 1 && s.idle_bytes == 4 * MiB &&
          s.physical_bytes == 4 * MiB);
    CHECK(cached ? s.thread_cache_count == 1 && s.thread_cache_bytes == 4 * MiB
                 : s.thread_cache_count == 0 && s.thread_cache_bytes == 0);
    OK(flare_retention_finish(pool));
    SNAP(s, pool);
    CHECK(snap_empty(&s) && s.thread_cache_count == 0 && s.thread_cache_bytes == 0 &&
          s.mappings_released == 1);
    OK(flare_pool_destroy(pool));
}

/* The configuration's thread-cache fields, seen in what a pool does with them. */
static void test_thread_cache_config(void) {
    FlarePoolConfig cfg, c;
    flare_pool_config_init(&cfg, sizeof cfg);
    CHECK(cfg.thread_cache_entries == 32 && cfg.thread_cache_bytes == 1024 * MiB &&
          sizeof cfg.thread_cache_entries == 4 && sizeof cfg.thread_cache_bytes == 8);

    /* The defaults (32 entries, 1 GiB per thread): cached. Also with both fields 0,
     * which means the defaults. */
    thread_cache_round_trips(&cfg, 1, "defaults");
    c = cfg;
    c.thread_cache_entries = 0;
    c.thread_cache_bytes = 0;
    thread_cache_round_trips(&c, 1, "0 entries, 0 bytes (the defaults)");

    /* Off: every free and allocation goes to the shared books, the same 100 reuses. */
    c = cfg;
    c.thread_cache_entries = FLARE_THREAD_CACHE_OFF;
    thread_cache_round_trips(&c, 0, "FLARE_THREAD_CACHE_OFF");

    /* A cache of 2 MiB per thread has no room for a 4 MiB mapping: not cached. */
    c = cfg;
    c.thread_cache_bytes = 2 * MiB;
    thread_cache_round_trips(&c, 0, "2 MiB per thread");

    /* A caller compiled before the fields (struct_size 80, sizeof then): neither is
     * read, so what its struct holds past 80 bytes (here, values that would turn the
     * cache off) is ignored and the pool has the defaults: cached. */
    c = cfg;
    c.struct_size = (uint32_t)offsetof(FlarePoolConfig, thread_cache_entries);
    c.thread_cache_entries = FLARE_THREAD_CACHE_OFF;
    c.thread_cache_bytes = 1;
    CHECK(c.struct_size == 80);
    thread_cache_round_trips(&c, 1, "struct_size 80, the rest not read");

    /* A struct_size covering thread_cache_entries but not thread_cache_bytes (84 up
     * to 95): the entries are read (off), the bytes are not. */
    c = cfg;
    c.struct_size = (uint32_t)offsetof(FlarePoolConfig, thread_cache_bytes);
    c.thread_cache_entries = FLARE_THREAD_CACHE_OFF;
    thread_cache_round_trips(&c, 0, "struct_size 88, entries off");

    /* A caller's snapshot compiled before the thread-cache counters (sizeof 368, up to
     * segment_lent_bytes): the counters up to there are written, the bytes of the
     * four new ones are left as they are. */
    {
        FlarePool *pool = NULL;
        FlareSnapshot old;
        const uint64_t garbage = UINT64_C(0xabababababababab);
        OK(flare_pool_create(&cfg, &pool));
        memset(&old, 0xab, sizeof old);
        old.struct_size = (uint32_t)offsetof(FlareSnapshot, thread_cache_count);
        CHECK(old.struct_size == 368);
        OK(flare_pool_snapshot(pool, &old));
        CHECK(old.struct_size == 368 && old.granularity_bytes == 2 * MiB &&
              old.segment_lent_bytes == 0 && old.reuse_hits == 0);
        CHECK(old.thread_cache_count == garbage && old.thread_cache_bytes == garbage &&
              old.thread_cache_hits == garbage && old.remote_frees == garbage);
        OK(flare_pool_destroy(pool));
    }
}

#endif /* FLARE_THREAD_CACHE_TESTS_H */

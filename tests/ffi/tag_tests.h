/*
 * Tags (issue 15) through the C ABI: flare_package_allocate_tagged, flare_pool_sleep,
 * flare_pool_wake, flare_pool_wake_zeroed (issue 34), flare_pool_tag_census and
 * FLARE_STATUS_TAG_STATE.
 *
 * Included by lifecycle_tests.h after thread_cache_tests.h (it uses their helpers:
 * CHECK, OK, CHECK_STATUS, SNAP, new_pool); run_all_tests calls the tests.
 *
 * The figures come from the contract: a tag other than 0 takes a whole mapping, the
 * request rounded up to the granularity (2 MiB on the simulated device, as on an
 * H200); sleep releases the tag's physical handles and keeps its addresses (the
 * snapshot's physical bytes drop by what the tag held, its sleeping bytes rise by
 * as much), offload keeps each allocation's requested bytes in host memory; wake maps
 * new handles at the same addresses; a wake that does not fit fails with
 * FLARE_STATUS_OUT_OF_MEMORY and leaves the tag asleep.
 */
#ifndef FLARE_TAG_TESTS_H
#define FLARE_TAG_TESTS_H

static FlareTagCensus census(FlarePool *pool, uint32_t tag) {
    FlareTagCensus c;
    memset(&c, 0xff, sizeof c);
    c.struct_size = sizeof c;
    OK(flare_pool_tag_census(pool, tag, &c));
    return c;
}

/* Two tags and untagged memory; tag 1 sleeps (offload) and wakes; tag 2 and the
 * untagged memory are untouched. */
static void test_tags_sleep_and_wake(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    FlareSnapshot s, before;
    FlareTagCensus c;
    void *a = NULL, *b = NULL, *t2 = NULL, *u = NULL, *p = NULL;

    /* 3 MiB maps 4 MiB; 5 MiB maps 6 MiB. */
    OK(flare_package_allocate_tagged(pool, 3 * MiB, NULL, 1, &a));
    OK(flare_package_allocate_tagged(pool, 5 * MiB, NULL, 1, &b));
    OK(flare_package_allocate_tagged(pool, 10 * MiB, NULL, 2, &t2));
    OK(flare_package_allocate(pool, MiB, &u));
    c = census(pool, 1);
    CHECK(c.sleeping == 0 && c.live_count == 2 && c.live_bytes == 10 * MiB &&
          c.peak_live_bytes == 10 * MiB && c.idle_bytes == 0 && c.physical_bytes == 10 * MiB &&
          c.offloaded_bytes == 0);
    c = census(pool, 0);
    CHECK(c.live_count == 1 && c.live_bytes == 2 * MiB && c.physical_bytes == 2 * MiB);
    SNAP(before, pool);
    CHECK(before.physical_bytes == 22 * MiB);

    OK(flare_pool_sleep(pool, 1, FLARE_SLEEP_OFFLOAD));
    SNAP(s, pool);
    CHECK(s.physical_bytes == before.physical_bytes - 10 * MiB);
    CHECK(s.reserved_bytes == before.reserved_bytes);
    CHECK(s.tags_sleeping == 1 && s.sleeping_count == 2 && s.sleeping_bytes == 10 * MiB &&
          s.offloaded_bytes == 8 * MiB);
    c = census(pool, 1);
    CHECK(c.sleeping == 1 && c.live_count == 2 && c.physical_bytes == 0 &&
          c.offloaded_bytes == 8 * MiB);
    CHECK(census(pool, 2).physical_bytes == 10 * MiB);
    /* The sleeping tag refuses allocations, frees and a second sleep; others work. */
    CHECK_STATUS(flare_package_allocate_tagged(pool, MiB, NULL, 1, &p), FLARE_STATUS_TAG_STATE);
    CHECK_STATUS(flare_package_free(pool, a), FLARE_STATUS_TAG_STATE);
    CHECK_STATUS(flare_package_free_async(pool, b, NULL), FLARE_STATUS_TAG_STATE);
    CHECK_STATUS(flare_pool_sleep(pool, 1, FLARE_SLEEP_DISCARD), FLARE_STATUS_TAG_STATE);
    CHECK_STATUS(flare_pool_wake(pool, 2), FLARE_STATUS_TAG_STATE);
    OK(flare_package_allocate_tagged(pool, MiB, NULL, 2, &p));
    OK(flare_package_free(pool, p));

    OK(flare_pool_wake(pool, 1));
    SNAP(s, pool);
    CHECK(s.physical_bytes == before.physical_bytes && s.tags_sleeping == 0 &&
          s.sleeping_bytes == 0 && s.offloaded_bytes == 0);
    c = census(pool, 1);
    CHECK(c.sleeping == 0 && c.physical_bytes == 10 * MiB && c.live_bytes == 10 * MiB);
    CHECK_STATUS(flare_pool_wake(pool, 1), FLARE_STATUS_TAG_STATE);
    OK(flare_package_free(pool, a));
    OK(flare_package_free(pool, b));
    OK(flare_package_free(pool, t2));
    OK(flare_package_free(pool, u));
    SNAP(s, pool);
    CHECK(snap_empty(&s));
    OK(flare_pool_destroy(pool));
}

/* A wake that does not fit fails cleanly, the tag asleep; it succeeds once memory is
 * freed. */
static void test_tags_wake_out_of_memory(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 64 * MiB, 0);
    FlareSnapshot s;
    void *t = NULL, *filler = NULL;

    OK(flare_package_allocate_tagged(pool, 32 * MiB, NULL, 7, &t));
    OK(flare_pool_sleep(pool, 7, FLARE_SLEEP_DISCARD));
    OK(flare_package_allocate(pool, 48 * MiB, &filler));
    CHECK_STATUS(flare_pool_wake(pool, 7), FLARE_STATUS_OUT_OF_MEMORY);
    SNAP(s, pool);
    CHECK(s.physical_bytes == 48 * MiB && s.sleeping_bytes == 32 * MiB);
    CHECK(census(pool, 7).sleeping == 1);
    OK(flare_package_free(pool, filler));
    OK(flare_pool_wake(pool, 7));
    SNAP(s, pool);
    CHECK(s.physical_bytes == 32 * MiB && s.tags_sleeping == 0);
    /* Inside a retention scope, sleep is a scope-state error. */
    OK(flare_retention_begin(pool));
    CHECK_STATUS(flare_pool_sleep(pool, 7, FLARE_SLEEP_DISCARD), FLARE_STATUS_SCOPE_STATE);
    OK(flare_retention_finish(pool));
    OK(flare_package_free(pool, t));
    /* Destroyed asleep: the sleeping allocation is reported live (4 MiB, unmapped,
     * no physical memory), and released. */
    OK(flare_package_allocate_tagged(pool, 3 * MiB, NULL, 7, &t));
    OK(flare_pool_sleep(pool, 7, FLARE_SLEEP_OFFLOAD));
    {
        FlareDestroyReport r;
        memset(&r, 0, sizeof r);
        r.struct_size = sizeof r;
        OK(flare_pool_destroy_report(pool, &r));
        CHECK(r.live_count == 1 && r.live_requested_bytes == 3 * MiB &&
              r.live_mapped_bytes == 4 * MiB && r.physical_bytes == 0);
    }
}

/* NULL and bad arguments: a status, never a crash, nothing written. */
static void test_tags_bad_inputs(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    FlareTagCensus c;
    void *p = NULL;

    CHECK_STATUS(flare_package_allocate_tagged(NULL, MiB, NULL, 1, &p),
                 FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_package_allocate_tagged(pool, MiB, NULL, 1, NULL),
                 FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_package_allocate_tagged(pool, 0, NULL, 1, &p),
                 FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_sleep(NULL, 1, FLARE_SLEEP_DISCARD), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_sleep(pool, 1, (FlareSleepMode)7), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_wake(NULL, 1), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_tag_census(NULL, 1, &c), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_tag_census(pool, 1, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    memset(&c, 0xff, sizeof c);
    c.struct_size = 4;
    CHECK_STATUS(flare_pool_tag_census(pool, 1, &c), FLARE_STATUS_INVALID_ARGUMENT);
    /* An older caller's 8 bytes: only `sleeping` is written. */
    c.struct_size = 8;
    OK(flare_pool_tag_census(pool, 1, &c));
    CHECK(c.struct_size == 8 && c.sleeping == 0 && c.live_count == UINT64_MAX);
    CHECK(strcmp(flare_status_name(FLARE_STATUS_TAG_STATE), "FLARE_STATUS_TAG_STATE") == 0);
    OK(flare_pool_destroy(pool));
}

/* The zeroing wake: refused with nothing done for a NULL pool, a tag that does not
 * sleep (never used, or awake) and a stream that is not live (the tag stays asleep);
 * after a discard sleep it wakes the tag and the census counts one memset per live
 * allocation over its requested bytes (3 MiB + 100 and 1000 bytes: not the 4 MiB and
 * 2 MiB mapped); after an offload sleep it zeroes nothing. A caller of the census
 * built before the zeroing fields (struct_size 56) gets none of them written. */
static void test_tags_wake_zeroed(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    FlareTagCensus c;
    void *a = NULL, *b = NULL;

    CHECK_STATUS(flare_pool_wake_zeroed(NULL, 1, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_wake_zeroed(pool, 9, NULL), FLARE_STATUS_TAG_STATE);
    OK(flare_package_allocate_tagged(pool, 3 * MiB + 100, NULL, 1, &a));
    OK(flare_package_allocate_tagged(pool, 1000, NULL, 1, &b));
    CHECK_STATUS(flare_pool_wake_zeroed(pool, 1, NULL), FLARE_STATUS_TAG_STATE);
    OK(flare_pool_sleep(pool, 1, FLARE_SLEEP_DISCARD));
    CHECK_STATUS(flare_pool_wake_zeroed(pool, 1, (FlareStream)(uintptr_t)0xdead0000u),
                 FLARE_STATUS_DRIVER_ERROR);
    c = census(pool, 1);
    CHECK(c.sleeping == 1 && c.physical_bytes == 0 && c.zeroed_bytes == 0 &&
          c.zero_memsets == 0);
    OK(flare_pool_wake_zeroed(pool, 1, NULL));
    c = census(pool, 1);
    CHECK(c.sleeping == 0 && c.physical_bytes == 6 * MiB &&
          c.zeroed_bytes == 3 * MiB + 100 + 1000 && c.zero_memsets == 2);
    CHECK_STATUS(flare_pool_wake_zeroed(pool, 1, NULL), FLARE_STATUS_TAG_STATE);
    OK(flare_pool_sleep(pool, 1, FLARE_SLEEP_OFFLOAD));
    OK(flare_pool_wake_zeroed(pool, 1, NULL));
    c = census(pool, 1);
    CHECK(c.sleeping == 0 && c.zeroed_bytes == 3 * MiB + 1100 && c.zero_memsets == 2);
    /* An older caller's census ends at offloaded_bytes. */
    memset(&c, 0xff, sizeof c);
    c.struct_size = 56;
    OK(flare_pool_tag_census(pool, 1, &c));
    CHECK(c.struct_size == 56 && c.live_count == 2 && c.offloaded_bytes == 0 &&
          c.zeroed_bytes == UINT64_MAX && c.zero_memsets == UINT64_MAX);
    OK(flare_package_free(pool, a));
    OK(flare_package_free(pool, b));
    OK(flare_pool_destroy(pool));
}

#endif /* FLARE_TAG_TESTS_H */

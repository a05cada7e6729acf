/*
 * What destroy reports (live allocations and bytes released, an open scope), and a
 * pool poisoned by a panic caught at the C boundary, which destroy still releases.
 *
 * Included by lifecycle_tests.h after its helpers (CHECK, OK, snap, new_pool, ...);
 * run_all_tests calls the tests.
 */
#ifndef FLARE_DESTROY_TESTS_H
#define FLARE_DESTROY_TESTS_H

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

#endif /* FLARE_DESTROY_TESTS_H */

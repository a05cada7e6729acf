/*
 * Refusals and failures through the C ABI: every bad input returns its status and
 * changes nothing; an injected failure of each driver call leaves a pool that
 * recovers; a pointer of another pool is refused.
 *
 * Included by lifecycle_tests.h after its helpers (CHECK, OK, snap, new_pool, ...);
 * run_all_tests calls the tests.
 */
#ifndef FLARE_FAILURE_TESTS_H
#define FLARE_FAILURE_TESTS_H

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

#endif /* FLARE_FAILURE_TESTS_H */

/*
 * Segment mode (issue 12) through the C ABI: FLARE_REUSE_SEGMENTS, the configuration's
 * segment_whole_threshold_bytes, the snapshot's segment counters, and the stream
 * functions on a segment-mode pool.
 *
 * Included by lifecycle_tests.h after stream_tests.h (it uses their helpers: CHECK,
 * OK, snap, snap_consistent, snap_released, new_stream, allocate_on, sim_faults);
 * run_all_tests calls the tests. Every snapshot taken here is checked against the
 * snapshot's invariants (SNAP), physical == live_mapped + idle + pending +
 * segment_mapped among them.
 *
 * The figures come from the mode's contract: requests up to 1 MiB go to a heap's small
 * segment, larger ones to its large segment; a block is the request rounded up to
 * 512 bytes; a segment grows at its end by whole handles, the first of a segment just
 * what the request needs rounded to the granularity (2 MiB on the simulated device,
 * as on an H200); freed blocks return to their heap and coalesce; outside a retention
 * scope, with release threshold 0, a handle whose whole range is free is released,
 * and the segment's reservation is kept until destroy.
 */
#ifndef FLARE_SEGMENT_TESTS_H
#define FLARE_SEGMENT_TESTS_H

/* s = snap(pool), and checks its invariants, reporting the caller's line. */
#define SNAP(s, pool)                                                                    \
    do {                                                                                 \
        (s) = snap(pool);                                                                \
        report(snap_consistent(&(s)), __FILE__, __LINE__, "snap_consistent(" #s ")");     \
        if (!snap_consistent(&(s))) {                                                    \
            fprintf(stderr,                                                              \
                    "  physical %" PRIu64 ", live mapped %" PRIu64 ", idle %" PRIu64      \
                    ", pending %" PRIu64 ", segment mapped %" PRIu64                     \
                    ", live blocks %" PRIu64 ", free blocks %" PRIu64 "\n",              \
                    (s).physical_bytes, (s).live_mapped_bytes, (s).idle_bytes,           \
                    (s).pending_bytes, (s).segment_mapped_bytes, (s).block_live_bytes,   \
                    (s).block_free_bytes);                                               \
        }                                                                                \
    } while (0)

/* A simulated segment-mode pool: release threshold `threshold` bytes, whole mappings
 * for requests above `whole_threshold` bytes (0: the default, none), device capacity
 * `capacity` bytes (0: the default, 140 GiB). */
static FlarePool *segments_pool(uint64_t threshold, uint64_t whole_threshold,
                                uint64_t capacity) {
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.reuse_policy = FLARE_REUSE_SEGMENTS;
    cfg.release_threshold_bytes = threshold;
    cfg.segment_whole_threshold_bytes = whole_threshold;
    cfg.sim_capacity_bytes = capacity;
    OK(flare_pool_create(&cfg, &pool));
    CHECK(pool != NULL);
    return pool;
}

/* Whether the `n` ranges [ptrs[i], ptrs[i] + sizes[i]) are 512-byte aligned, non-NULL
 * and pairwise disjoint. */
static int blocks_disjoint(void *const *ptrs, const uint64_t *sizes, int n) {
    int i, j;
    for (i = 0; i < n; i++) {
        uintptr_t a = (uintptr_t)ptrs[i];
        if (a == 0 || a % 512 != 0) {
            return 0;
        }
        for (j = i + 1; j < n; j++) {
            uintptr_t b = (uintptr_t)ptrs[j];
            if (!(a + sizes[i] <= b || b + sizes[j] <= a)) {
                return 0;
            }
        }
    }
    return 1;
}

/* Whether [p, p + size) lies inside [base, base + len). */
static int inside(const void *p, uint64_t size, uintptr_t base, uint64_t len) {
    return (uintptr_t)p >= base && (uintptr_t)p + size <= base + len;
}

/* Small blocks share one handle; freed blocks coalesce; a scope retains the handle;
 * outside one, the handle is released once its whole range is free, the segment's
 * reservation kept (and regrown into) until destroy. */
static void test_segments_small_blocks(void) {
    FlarePool *pool = segments_pool(0, 0, 0);
    FlareSnapshot s, before;
    FlareDestroyReport r;
    void *p[102], *q[3], *m1 = NULL, *m2 = NULL;
    uint64_t sizes[102];
    uintptr_t base = UINTPTR_MAX;
    uint64_t reserved;
    int i;

    OK(flare_retention_begin(pool));
    for (i = 0; i < 100; i++) {
        p[i] = NULL;
        sizes[i] = 4096;
        OK(flare_package_allocate(pool, 4096, &p[i]));
        if ((uintptr_t)p[i] < base) {
            base = (uintptr_t)p[i];
        }
    }
    SNAP(s, pool);
    /* 100 x 4 KiB = 400 KiB: one granule, one handle, in one (small) segment. The
     * first allocation mapped it; the other 99 were carved with no driver call. */
    CHECK(s.physical_bytes == 2 * MiB && s.segment_mapped_bytes == 2 * MiB &&
          s.segment_handles == 1 && s.segment_count == 1 && s.mappings_created == 1);
    CHECK(s.live_count == 100 && s.block_live_count == 100 && s.block_live_bytes == 100 * 4096 &&
          s.live_requested_bytes == 100 * 4096 && s.live_mapped_bytes == 0 &&
          s.block_free_bytes == 2 * MiB - 100 * 4096 && s.idle_bytes == 0 &&
          s.reuse_hits == 99 && s.reserved_bytes >= 2 * MiB);
    CHECK(blocks_disjoint(p, sizes, 100));
    /* All inside the one 2 MiB handle, which the first block starts. */
    for (i = 0; i < 100; i++) {
        CHECK(inside(p[i], 4096, base, 2 * MiB));
    }
    /* Rounding to 512 bytes: 1 byte is a 512-byte block, 513 bytes a 1 KiB one. */
    OK(flare_package_allocate(pool, 1, &p[100]));
    OK(flare_package_allocate(pool, 513, &p[101]));
    sizes[100] = 512;
    sizes[101] = 1024;
    CHECK(blocks_disjoint(p, sizes, 102));
    SNAP(s, pool);
    CHECK(s.block_live_count == 102 && s.block_live_bytes == 100 * 4096 + 512 + 1024 &&
          s.live_requested_bytes == 100 * 4096 + 1 + 513 && s.physical_bytes == 2 * MiB);

    /* Freed in an order that leaves holes between live blocks, then all: inside the
     * scope the handle stays, its whole range free. */
    for (i = 1; i < 102; i += 2) {
        OK(flare_package_free(pool, p[i]));
    }
    SNAP(s, pool);
    CHECK(s.block_live_count == 51 && s.physical_bytes == 2 * MiB);
    for (i = 0; i < 102; i += 2) {
        OK(flare_package_free(pool, p[i]));
    }
    SNAP(s, pool);
    CHECK(s.live_count == 0 && s.block_live_count == 0 && s.block_live_bytes == 0 &&
          s.block_free_bytes == 2 * MiB && s.physical_bytes == 2 * MiB && s.idle_bytes == 0);
    /* Coalesced: two 1 MiB blocks (the small class's largest) fill the handle exactly,
     * with no new handle. Without coalescing, the largest free piece would be the
     * never-used tail (2 MiB - 401.5 KiB), and the second would need a growth. */
    before = s;
    OK(flare_package_allocate(pool, MiB, &m1));
    OK(flare_package_allocate(pool, MiB, &m2));
    SNAP(s, pool);
    CHECK(s.mappings_created == 1 && s.physical_bytes == 2 * MiB && s.block_free_bytes == 0 &&
          s.block_live_bytes == 2 * MiB && s.reuse_hits == before.reuse_hits + 2);
    CHECK(inside(m1, MiB, base, 2 * MiB) && inside(m2, MiB, base, 2 * MiB) && m1 != m2);
    OK(flare_package_free(pool, m1));
    OK(flare_package_free(pool, m2));
    CHECK_STATUS(flare_package_free(pool, m1), FLARE_STATUS_UNKNOWN_POINTER);
    /* Finish releases the handle; the segment's reservation stays. */
    reserved = snap(pool).reserved_bytes;
    OK(flare_retention_finish(pool));
    SNAP(s, pool);
    CHECK(snap_released(&s) && s.segment_count == 1 && s.reserved_bytes == reserved &&
          s.mappings_released == 1 && s.peak_physical_bytes == 2 * MiB);

    /* Outside a scope, threshold 0: the heap regrows into the same reservation, from
     * its start; the handle goes when its last live block does. */
    for (i = 0; i < 3; i++) {
        q[i] = NULL;
        OK(flare_package_allocate(pool, 4096, &q[i]));
    }
    SNAP(s, pool);
    CHECK((uintptr_t)q[0] == base && s.segment_count == 1 && s.reserved_bytes == reserved &&
          s.physical_bytes == 2 * MiB && s.mappings_created == 2);
    OK(flare_package_free(pool, q[0]));
    OK(flare_package_free(pool, q[2]));
    SNAP(s, pool);
    CHECK(s.physical_bytes == 2 * MiB && s.block_live_count == 1 && s.mappings_released == 1);
    OK(flare_package_free(pool, q[1]));
    SNAP(s, pool);
    CHECK(snap_released(&s) && s.segment_count == 1 && s.reserved_bytes == reserved &&
          s.mappings_released == 2);
    /* Destroy gives the reservation back: nothing live, no physical memory. */
    memset(&r, 0xab, sizeof r);
    r.struct_size = (uint32_t)sizeof r;
    OK(flare_pool_destroy_report(pool, &r));
    CHECK(r.live_count == 0 && r.live_mapped_bytes == 0 && r.physical_bytes == 0);
}

/* segment_whole_threshold_bytes: a request of more than it takes a whole mapping
 * (counted in live_mapped_bytes, not as a block), reused best-fit; at most it, a
 * block. 0 (the default) and an older caller's struct (before the field): none. */
static void test_segments_whole_threshold(void) {
    FlarePool *pool = segments_pool(0, MiB, 0);
    FlarePoolConfig cfg;
    FlareSnapshot s, before;
    void *blk = NULL, *edge = NULL, *whole = NULL, *w = NULL, *w2 = NULL;

    OK(flare_package_allocate(pool, 4096, &blk));
    OK(flare_package_allocate(pool, MiB, &edge)); /* not more than 1 MiB: a block */
    SNAP(s, pool);
    CHECK(s.block_live_count == 2 && s.block_live_bytes == 4096 + MiB && s.live_mapped_bytes == 0 &&
          s.physical_bytes == 2 * MiB && s.segment_count == 1 && s.segment_handles == 1);
    before = s;
    OK(flare_package_allocate(pool, MiB + 1, &whole)); /* more: a whole 2 MiB mapping */
    SNAP(s, pool);
    CHECK(s.live_count == 3 && s.block_live_count == 2 && s.live_mapped_bytes == 2 * MiB &&
          s.physical_bytes == 4 * MiB && s.segment_mapped_bytes == 2 * MiB &&
          s.segment_count == 1 && s.live_requested_bytes == 4096 + MiB + MiB + 1 &&
          s.reserved_bytes == before.reserved_bytes + 2 * MiB);
    CHECK((uintptr_t)whole % (2 * MiB) == 0);
    /* Freed outside a scope with threshold 0: released with its reservation. */
    OK(flare_package_free(pool, whole));
    SNAP(s, pool);
    CHECK(s.live_mapped_bytes == 0 && s.physical_bytes == 2 * MiB &&
          s.reserved_bytes == before.reserved_bytes && s.idle_count == 0);
    /* Inside a scope a freed whole mapping is idle and reused best-fit: 3 MiB maps
     * 4 MiB; a later 4 MiB request takes it exactly. */
    OK(flare_retention_begin(pool));
    OK(flare_package_allocate(pool, 3 * MiB, &w));
    OK(flare_package_free(pool, w));
    SNAP(s, pool);
    CHECK(s.idle_count == 1 && s.idle_bytes == 4 * MiB && s.physical_bytes == 6 * MiB &&
          s.segment_mapped_bytes == 2 * MiB);
    before = s;
    OK(flare_package_allocate(pool, 4 * MiB, &w2));
    SNAP(s, pool);
    CHECK(w2 == w && s.reuse_hits == before.reuse_hits + 1 &&
          s.reuse_exact_hits == before.reuse_exact_hits + 1 && s.idle_bytes == 0 &&
          s.live_mapped_bytes == 4 * MiB && s.mappings_created == before.mappings_created);
    OK(flare_package_free(pool, w2));
    OK(flare_retention_finish(pool));
    SNAP(s, pool);
    CHECK(s.idle_bytes == 0 && s.physical_bytes == 2 * MiB && s.block_live_count == 2);
    OK(flare_package_free(pool, blk));
    OK(flare_package_free(pool, edge));
    SNAP(s, pool);
    CHECK(snap_released(&s) && s.segment_count == 1);
    OK(flare_pool_destroy(pool));

    /* The default, 0: no request takes a whole mapping, 64 MiB is a block too (of the
     * large segment). */
    pool = segments_pool(0, 0, 0);
    OK(flare_package_allocate(pool, 64 * MiB, &w));
    SNAP(s, pool);
    CHECK(s.block_live_count == 1 && s.block_live_bytes == 64 * MiB && s.live_mapped_bytes == 0 &&
          s.physical_bytes == 64 * MiB && s.segment_count == 1);
    OK(flare_package_free(pool, w));
    OK(flare_pool_destroy(pool));

    /* A caller compiled before the field (struct_size 72): a threshold in the bytes
     * where it would be is not read, so MiB + 1 is a block (of the large segment: one
     * 2 MiB handle). */
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.reuse_policy = FLARE_REUSE_SEGMENTS;
    cfg.segment_whole_threshold_bytes = MiB;
    cfg.struct_size = (uint32_t)offsetof(FlarePoolConfig, segment_whole_threshold_bytes);
    CHECK(cfg.struct_size == 72);
    pool = NULL;
    OK(flare_pool_create(&cfg, &pool));
    OK(flare_package_allocate(pool, MiB + 1, &w));
    SNAP(s, pool);
    CHECK(s.block_live_count == 1 && s.block_live_bytes == MiB + 512 && s.live_mapped_bytes == 0 &&
          s.physical_bytes == 2 * MiB);
    OK(flare_package_free(pool, w));
    OK(flare_pool_destroy(pool));
}

/* The stream functions in segment mode: a heap per stream; blocks freed on the stream
 * they came from are reused on it at once, work still queued, with no fault. */
static void test_segments_streams(void) {
    FlarePool *pool = segments_pool(0, 0, 0);
    FlareStream s = new_stream(pool), t = new_stream(pool);
    FlareSnapshot st, before;
    void *p[8], *q, *r, *big, *x;
    uint64_t sizes[8];
    uintptr_t base = UINTPTR_MAX;
    int i;

    for (i = 0; i < 8; i++) {
        p[i] = allocate_on(pool, 4096, s);
        sizes[i] = 4096;
        if ((uintptr_t)p[i] < base) {
            base = (uintptr_t)p[i];
        }
    }
    CHECK(blocks_disjoint(p, sizes, 8));
    SNAP(st, pool);
    CHECK(st.physical_bytes == 2 * MiB && st.segment_count == 1 && st.segment_handles == 1 &&
          st.block_live_count == 8 && st.block_live_bytes == 8 * 4096 && st.mappings_created == 1);
    /* Freed on s with s's work on it still queued: back in s's heap at once, and the
     * next 4 KiB on s takes it (the smallest free block that fits, best-fit). */
    OK(flare_sim_launch(pool, s, p[3], 4096));
    OK(flare_package_free_async(pool, p[3], s));
    before = snap(pool);
    q = allocate_on(pool, 4096, s);
    SNAP(st, pool);
    CHECK(q == p[3] && st.reuse_hits == before.reuse_hits + 1 && st.cross_stream_hits == 0 &&
          st.physical_bytes == 2 * MiB && st.mappings_created == 1);
    CHECK(sim_faults(pool) == 0);
    /* Another stream: its own heap, a segment and a handle of its own, away from s's. */
    r = allocate_on(pool, 4096, t);
    SNAP(st, pool);
    CHECK(!inside(r, 4096, base, 2 * MiB) && st.segment_count == 2 && st.segment_handles == 2 &&
          st.physical_bytes == 4 * MiB && st.block_live_count == 9);
    /* A large block on s, freed with s's work queued: t must not get that memory. */
    big = allocate_on(pool, 3 * MiB, s);
    OK(flare_sim_launch(pool, s, big, 3 * MiB));
    OK(flare_package_free_async(pool, big, s));
    x = allocate_on(pool, 3 * MiB, t);
    CHECK(x != big && sim_faults(pool) == 0);
    SNAP(st, pool);
    CHECK(st.segment_count == 4); /* small and large on each stream */
    OK(flare_package_free_async(pool, x, t));
    OK(flare_package_free_async(pool, r, t));
    OK(flare_package_free_async(pool, q, s));
    for (i = 0; i < 8; i++) {
        if (i != 3) {
            OK(flare_package_free_async(pool, p[i], s));
        }
    }
    OK(flare_sim_stream_complete(pool, s));
    OK(flare_sim_stream_complete(pool, t));
    OK(flare_pool_trim(pool));
    SNAP(st, pool);
    CHECK(snap_released(&st) && st.segment_count == 4 && st.live_count == 0);
    CHECK(sim_faults(pool) == 0);
    OK(flare_pool_destroy(pool));
}

/* The invariant physical == live_mapped + idle + pending + segment_mapped (and
 * segment_mapped == live blocks + free blocks) with every term non-zero in turn:
 * whole mappings live and idle beside blocks, and refused release steps leaving
 * memory pending or still mapped. */
static void test_segments_invariant(void) {
    FlarePool *pool = segments_pool(0, MiB, 0);
    FlareSnapshot s, before;
    void *a = NULL, *w = NULL, *i1 = NULL, *b = NULL;
    void *const sentinel = (void *)(uintptr_t)0x5e5e;
    int k;

    /* A block and a live whole mapping: 2 MiB in the segment, 4 MiB live mapped. */
    OK(flare_package_allocate(pool, 4096, &a));
    OK(flare_package_allocate(pool, 3 * MiB, &w));
    SNAP(s, pool);
    CHECK(s.physical_bytes == 6 * MiB && s.live_mapped_bytes == 4 * MiB &&
          s.segment_mapped_bytes == 2 * MiB && s.block_live_bytes == 4096);
    /* The whole mapping's cuMemRelease refused: its 4 MiB pending. */
    OK(flare_sim_inject_failure(pool, FLARE_CALL_RELEASE, 1, 999));
    OK(flare_package_free(pool, w));
    SNAP(s, pool);
    CHECK(s.physical_bytes == 6 * MiB && s.pending_bytes == 4 * MiB && s.pending_count == 1 &&
          s.live_mapped_bytes == 0 && s.segment_mapped_bytes == 2 * MiB &&
          s.release_failures == 1);
    /* The segment handle's cuMemRelease refused too: this free is a release point, so
     * the whole mapping's release is retried (and succeeds), and the handle's 2 MiB
     * are pending, none left in the segment. */
    OK(flare_sim_inject_failure(pool, FLARE_CALL_RELEASE, 1, 999));
    OK(flare_package_free(pool, a));
    SNAP(s, pool);
    CHECK(s.physical_bytes == 2 * MiB && s.pending_bytes == 2 * MiB && s.pending_count == 1 &&
          s.segment_mapped_bytes == 0 && s.segment_handles == 0 && s.release_failures == 2 &&
          s.live_count == 0 && s.segment_count == 1);
    /* Trim retries them. */
    OK(flare_pool_trim(pool));
    SNAP(s, pool);
    CHECK(snap_released(&s) && s.segment_count == 1);

    /* Inside a scope: an idle whole mapping beside a free handle. */
    OK(flare_retention_begin(pool));
    OK(flare_package_allocate(pool, 3 * MiB, &i1));
    OK(flare_package_free(pool, i1));
    OK(flare_package_allocate(pool, 4096, &b));
    SNAP(s, pool);
    CHECK(s.physical_bytes == 6 * MiB && s.idle_bytes == 4 * MiB && s.segment_mapped_bytes == 2 * MiB &&
          s.block_live_bytes == 4096 && s.block_free_bytes == 2 * MiB - 4096);
    OK(flare_package_free(pool, b));
    SNAP(s, pool);
    CHECK(s.physical_bytes == 6 * MiB && s.block_free_bytes == 2 * MiB);
    OK(flare_retention_finish(pool));
    SNAP(s, pool);
    CHECK(snap_released(&s));

    /* A refused cuMemUnmap or cuCtxSynchronize of a segment handle: the free succeeds,
     * the handle stays mapped in its segment, free, and the next trim releases it. */
    for (k = 0; k < 2; k++) {
        FlareDriverCall call = k == 0 ? FLARE_CALL_UNMAP : FLARE_CALL_SYNCHRONIZE;
        before = snap(pool);
        OK(flare_package_allocate(pool, 4096, &b));
        OK(flare_sim_inject_failure(pool, call, 1, 999));
        OK(flare_package_free(pool, b));
        SNAP(s, pool);
        CHECK(s.physical_bytes == 2 * MiB && s.segment_mapped_bytes == 2 * MiB &&
              s.block_free_bytes == 2 * MiB && s.live_count == 0 && s.pending_bytes == 0);
        CHECK(call != FLARE_CALL_UNMAP || s.unmap_failures == before.unmap_failures + 1);
        CHECK(call != FLARE_CALL_SYNCHRONIZE || s.sync_failures == before.sync_failures + 1);
        OK(flare_pool_trim(pool));
        SNAP(s, pool);
        CHECK(snap_released(&s) && s.segment_count == 1);
    }
    OK(flare_pool_destroy(pool));

    /* A refused allocation step (a new segment's reserve, the handle's create, map or
     * set access): an error, nothing live or mapped; the pool works after it. */
    for (k = 0; k < 4; k++) {
        static const FlareDriverCall calls[4] = {FLARE_CALL_RESERVE, FLARE_CALL_CREATE,
                                                 FLARE_CALL_MAP, FLARE_CALL_SET_ACCESS};
        pool = segments_pool(0, 0, 0);
        OK(flare_sim_inject_failure(pool, calls[k], 1, 999));
        b = sentinel;
        CHECK_STATUS(flare_package_allocate(pool, 4096, &b), FLARE_STATUS_DRIVER_ERROR);
        CHECK(b == sentinel);
        SNAP(s, pool);
        CHECK(snap_released(&s) && s.allocations == 0 && s.mappings_created == 0);
        OK(flare_package_allocate(pool, 4096, &b));
        SNAP(s, pool);
        CHECK(s.physical_bytes == 2 * MiB && s.block_live_count == 1 && s.segment_count == 1);
        OK(flare_package_free(pool, b));
        SNAP(s, pool);
        CHECK(snap_released(&s) && s.segment_count == 1);
        CHECK(sim_faults(pool) == 0);
        OK(flare_pool_destroy(pool));
    }
}

#endif /* FLARE_SEGMENT_TESTS_H */

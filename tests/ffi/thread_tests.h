/*
 * Threads through the C ABI: four threads allocating, freeing and taking snapshots
 * on one pool under each reuse policy, inside a scope or not. Declares run_parallel,
 * which the including file defines (pthreads in C, std::thread in C++).
 *
 * Included by lifecycle_tests.h after its helpers (CHECK, OK, snap, new_pool, ...);
 * run_all_tests calls the tests.
 */
#ifndef FLARE_THREAD_TESTS_H
#define FLARE_THREAD_TESTS_H

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

#endif /* FLARE_THREAD_TESTS_H */

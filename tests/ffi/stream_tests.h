/*
 * Stream order (issue 11) through the C ABI: flare_package_allocate_async,
 * flare_package_free_async, flare_package_record_stream, the simulated backend's
 * streams, launches, completions and captures (flare_sim_*), and the configuration's
 * cross_stream_reuse field.
 *
 * Included by lifecycle_tests.h after its helpers (CHECK, OK, snap, run_parallel);
 * run_all_tests calls the tests. The first two check the ABI's shape (NULL arguments,
 * statuses, outputs written only on success, the simulated controls); the others the
 * issue's semantics on the simulated backend, each ending with no contract fault
 * (flare_sim_faults 0) and, after a trim, nothing held.
 */
#ifndef FLARE_STREAM_TESTS_H
#define FLARE_STREAM_TESTS_H

static FlareStream new_stream(FlarePool *pool) {
    FlareStream s = NULL;
    OK(flare_sim_stream_create(pool, &s));
    CHECK(s != NULL);
    return s;
}

/* The contract faults the pool's simulated driver has seen. */
static uint64_t sim_faults(const FlarePool *pool) {
    uint64_t n = UINT64_MAX;
    OK(flare_sim_faults(pool, &n));
    return n;
}

static void *allocate_on(FlarePool *pool, size_t size, FlareStream stream) {
    void *p = NULL;
    OK(flare_package_allocate_async(pool, size, stream, &p));
    CHECK(p != NULL);
    return p;
}

/* A simulated pool with release threshold `threshold` bytes and cross-stream reuse
 * `mode`. */
static FlarePool *stream_pool(uint64_t threshold, FlareCrossStreamReuse mode) {
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.release_threshold_bytes = threshold;
    cfg.cross_stream_reuse = (uint32_t)mode;
    OK(flare_pool_create(&cfg, &pool));
    CHECK(pool != NULL);
    return pool;
}

/* Trims, checks that nothing is held and no contract fault was seen, destroys. */
static void trim_check_destroy(FlarePool *pool, const char *what) {
    FlareSnapshot s;
    uint64_t faults;
    OK(flare_pool_trim(pool));
    s = snap(pool);
    faults = sim_faults(pool);
    CHECK(snap_empty(&s) && snap_consistent(&s));
    CHECK(faults == 0);
    if (!snap_empty(&s) || faults != 0) {
        fprintf(stderr, "  %s: after trim, physical %" PRIu64 ", live %" PRIu64
                        ", contract faults %" PRIu64 "\n",
                what, s.physical_bytes, s.live_count, faults);
    }
    OK(flare_pool_destroy(pool));
}

/* Every bad input to the stream functions returns its status and changes nothing. */
static void test_stream_bad_inputs(void) {
    FlarePool *pool = stream_pool(0, FLARE_CROSS_STREAM_WHEN_COMPLETE);
    FlarePool *const sentinel_pool = (FlarePool *)(uintptr_t)0x5e5e;
    void *const sentinel = (void *)(uintptr_t)0x5e5e;
    FlareStream s = new_stream(pool);
    FlareStream stream_out = sentinel;
    FlareSnapshot before, after;
    FlarePoolConfig cfg;
    FlarePool *other = NULL;
    void *live = allocate_on(pool, MiB, s), *out = sentinel;
    int valid = 7;
    uint64_t n = 77;
    uint32_t bad;

    before = snap(pool);
    /* NULL pool, everywhere. */
    CHECK_STATUS(flare_package_allocate_async(NULL, 1, s, &out), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("pool is NULL"));
    CHECK_STATUS(flare_package_free_async(NULL, live, s), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_package_free_async(NULL, NULL, s), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_package_record_stream(NULL, live, s), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_stream_create(NULL, &stream_out), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_launch(NULL, s, live, 1), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_stream_complete(NULL, s), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_begin_capture(NULL, s), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_end_capture(NULL, s, &valid), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_sim_faults(NULL, &n), FLARE_STATUS_INVALID_ARGUMENT);
    /* NULL outputs. */
    CHECK_STATUS(flare_package_allocate_async(pool, 1, s, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("out_ptr is NULL"));
    CHECK_STATUS(flare_sim_stream_create(pool, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("out_stream is NULL"));
    CHECK_STATUS(flare_sim_end_capture(pool, s, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("out_valid is NULL"));
    CHECK_STATUS(flare_sim_faults(pool, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("out_faults is NULL"));
    /* NULL pointers to free or record: no-ops, as for flare_package_free. NULL
     * streams are the legacy stream, legal everywhere but in a capture. */
    OK(flare_package_free_async(pool, NULL, s));
    OK(flare_package_free_async(pool, NULL, NULL));
    OK(flare_package_record_stream(pool, NULL, s));
    /* Sizes: 0, one that overflows when rounded. */
    CHECK_STATUS(flare_package_allocate_async(pool, 0, s, &out), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("0 bytes"));
    CHECK_STATUS(flare_package_allocate_async(pool, SIZE_MAX, s, &out),
                 FLARE_STATUS_INVALID_ARGUMENT);
    /* Pointers: unknown, interior. */
    CHECK_STATUS(flare_package_free_async(pool, (void *)(uintptr_t)0x1234, s),
                 FLARE_STATUS_UNKNOWN_POINTER);
    CHECK(last_error_contains("unknown pointer 0x1234"));
    CHECK_STATUS(flare_package_free_async(pool, (char *)live + 4096, s),
                 FLARE_STATUS_UNKNOWN_POINTER);
    CHECK_STATUS(flare_package_record_stream(pool, (void *)(uintptr_t)0x1234, s),
                 FLARE_STATUS_UNKNOWN_POINTER);
    CHECK_STATUS(flare_package_record_stream(pool, (char *)live + 4096, NULL),
                 FLARE_STATUS_UNKNOWN_POINTER);
    CHECK(out == sentinel && stream_out == sentinel && valid == 7 && n == 77);
    after = snap(pool);
    CHECK(snap_equal(&before, &after));
    {
        /* A caller compiled before the stream counters (248 bytes, up to
         * reuse_forced_hits): they are not written. */
        FlareSnapshot old;
        memset(&old, 0xab, sizeof old);
        old.struct_size = (uint32_t)offsetof(FlareSnapshot, events_outstanding);
        CHECK(old.struct_size == 248);
        OK(flare_pool_snapshot(pool, &old));
        CHECK(old.live_count == 1 && old.reuse_forced_hits == 0 &&
              old.events_outstanding == UINT64_C(0xabababababababab) &&
              old.stream_call_failures == UINT64_C(0xabababababababab));
    }
    OK(flare_package_record_stream(pool, live, NULL));
    OK(flare_package_free_async(pool, live, s));
    CHECK_STATUS(flare_package_free_async(pool, live, s), FLARE_STATUS_UNKNOWN_POINTER);
    OK(flare_sim_stream_complete(pool, s));
    OK(flare_sim_stream_complete(pool, NULL));
    trim_check_destroy(pool, "stream bad inputs");

    /* The configuration field: config_init writes the default (0), an unknown value
     * is refused, an older caller's struct (sizeof 64, before the field) is not read
     * past its end. */
    flare_pool_config_init(&cfg, sizeof cfg);
    CHECK(cfg.cross_stream_reuse == FLARE_CROSS_STREAM_WHEN_COMPLETE &&
          FLARE_CROSS_STREAM_WHEN_COMPLETE == 0 && FLARE_CROSS_STREAM_NEVER == 1 &&
          FLARE_CROSS_STREAM_WAIT == 2 && sizeof cfg.cross_stream_reuse == 4);
    bad = 3;
    memcpy(&cfg.cross_stream_reuse, &bad, sizeof bad);
    other = sentinel_pool;
    CHECK_STATUS(flare_pool_create(&cfg, &other), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(other == sentinel_pool && last_error_contains("cross_stream_reuse 3"));
    cfg.struct_size = (uint32_t)offsetof(FlarePoolConfig, cross_stream_reuse);
    CHECK(cfg.struct_size == 64);
    other = NULL;
    OK(flare_pool_create(&cfg, &other));
    OK(flare_pool_destroy(other));
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.cross_stream_reuse = FLARE_CROSS_STREAM_WAIT;
    OK(flare_pool_create(&cfg, &other));
    OK(flare_pool_destroy(other));
}

struct end_from_thread {
    FlarePool *pool;
    FlareStream stream;
    FlareStatus status;
    int valid;
    int wrong_thread_said;
};

static void *end_capture_main(void *arg) {
    struct end_from_thread *e = (struct end_from_thread *)arg;
    e->status = flare_sim_end_capture(e->pool, e->stream, &e->valid);
    e->wrong_thread_said = last_error_contains("CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD");
    return NULL;
}

/* The simulated controls: a refusal is FLARE_STATUS_INVALID_ARGUMENT with the
 * CUresult in the message, and changes nothing; a capture ends valid, or invalidated
 * (out_valid 0) when something broke it, which is counted as a contract fault. */
static void test_sim_streams(void) {
    FlarePool *pool = stream_pool(0, FLARE_CROSS_STREAM_WHEN_COMPLETE);
    FlareStream s = new_stream(pool), t = new_stream(pool);
    FlareStream bogus = (FlareStream)(uintptr_t)0xdead0000;
    struct end_from_thread e;
    void *args[1];
    void *p = allocate_on(pool, 2 * MiB, s), *q = NULL;
    int valid = 7;

    CHECK(s != t);
    CHECK_STATUS(flare_sim_launch(pool, bogus, p, 1), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("cuLaunchKernel on stream 0xdead0000: CUDA_ERROR_INVALID_HANDLE"));
    /* One byte past the 2 MiB mapping: not mapped (on a GPU the kernel would fault). */
    CHECK_STATUS(flare_sim_launch(pool, s, p, 2 * MiB + 1), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("CUDA_ERROR_INVALID_VALUE"));
    CHECK_STATUS(flare_sim_stream_complete(pool, bogus), FLARE_STATUS_INVALID_ARGUMENT);
    /* The legacy stream cannot be captured. */
    CHECK_STATUS(flare_sim_begin_capture(pool, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"));
    CHECK_STATUS(flare_sim_end_capture(pool, t, &valid), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(valid == 7 && last_error_contains("CUDA_ERROR_ILLEGAL_STATE"));

    /* A capture with launches (graph nodes) and nothing else ends valid. */
    OK(flare_sim_begin_capture(pool, s));
    CHECK_STATUS(flare_sim_begin_capture(pool, s), FLARE_STATUS_INVALID_ARGUMENT);
    OK(flare_sim_launch(pool, s, p, 2 * MiB));
    /* Global mode: only the thread that began it ends it. */
    e.pool = pool;
    e.stream = s;
    e.status = FLARE_STATUS_SUCCESS;
    e.valid = 7;
    e.wrong_thread_said = 0;
    args[0] = &e;
    run_parallel(end_capture_main, args, 1);
    CHECK(e.status == FLARE_STATUS_INVALID_ARGUMENT && e.valid == 7 && e.wrong_thread_said);
    OK(flare_sim_end_capture(pool, s, &valid));
    CHECK(valid == 1);
    CHECK(sim_faults(pool) == 0);
    /* Outside a capture: queued work, completed by its stream. */
    OK(flare_sim_launch(pool, s, p, MiB));
    OK(flare_sim_launch(pool, NULL, p, 0));
    OK(flare_sim_stream_complete(pool, s));
    OK(flare_sim_stream_complete(pool, NULL));
    OK(flare_package_free_async(pool, p, s));
    trim_check_destroy(pool, "simulated streams");

    /* A capture broken by a device synchronize: the stream-less free outside a scope
     * synchronizes before it releases (issue 11 leaves that path as it was), which
     * invalidates any open capture (docs/vmm-semantics.md, "Stream capture"). The
     * capture ends invalidated (out_valid 0, a success of the call) and the fault is
     * counted: this pool's only one, on purpose. */
    pool = stream_pool(0, FLARE_CROSS_STREAM_WHEN_COMPLETE);
    s = new_stream(pool);
    OK(flare_package_allocate(pool, 2 * MiB, &q));
    OK(flare_sim_begin_capture(pool, s));
    OK(flare_package_free(pool, q));
    CHECK(sim_faults(pool) == 1);
    valid = 7;
    OK(flare_sim_end_capture(pool, s, &valid));
    CHECK(valid == 0);
    CHECK_STATUS(flare_sim_end_capture(pool, s, &valid), FLARE_STATUS_INVALID_ARGUMENT);
    OK(flare_pool_trim(pool));
    CHECK(snap(pool).physical_bytes == 0 && sim_faults(pool) == 1);
    OK(flare_pool_destroy(pool));
}

/* Issue 11: memory whose last free was on S is handed out on S at once, with S's
 * work on it still queued and the default release threshold (0): no host
 * synchronization, no release, no fault. */
static void test_stream_same_stream_reuse(void) {
    FlarePool *pool = stream_pool(0, FLARE_CROSS_STREAM_WHEN_COMPLETE);
    FlareStream s = new_stream(pool);
    FlareSnapshot st;
    void *p = allocate_on(pool, 3 * MiB, s), *q = NULL;
    OK(flare_sim_launch(pool, s, p, 3 * MiB));
    OK(flare_package_free_async(pool, p, s));
    st = snap(pool);
    CHECK(st.live_count == 0 && st.idle_bytes == 4 * MiB && st.physical_bytes == 4 * MiB);
    CHECK(st.event_wait_bytes == 4 * MiB);
    q = allocate_on(pool, 3 * MiB, s);
    CHECK(q == p);
    st = snap(pool);
    CHECK(st.reuse_hits == 1 && st.cross_stream_hits == 0 && snap_consistent(&st));
    CHECK(sim_faults(pool) == 0);
    OK(flare_package_free_async(pool, q, s));
    OK(flare_sim_stream_complete(pool, s));
    trim_check_destroy(pool, "same-stream reuse");
}

/* Issue 11, cross_stream_reuse WHEN_COMPLETE (the default): memory freed on S goes to
 * another stream T only once S's work up to the free has completed. A release
 * threshold keeps the completed memory cached so that T can get it. */
static void test_stream_cross_stream(void) {
    FlarePool *pool = stream_pool(64 * MiB, FLARE_CROSS_STREAM_WHEN_COMPLETE);
    FlareStream s = new_stream(pool), t = new_stream(pool);
    FlareSnapshot st;
    void *p = allocate_on(pool, 2 * MiB, s), *r = NULL, *u = NULL;
    OK(flare_sim_launch(pool, s, p, 2 * MiB));
    OK(flare_package_free_async(pool, p, s));
    r = allocate_on(pool, 2 * MiB, t);
    CHECK(r != p); /* S's queued work still touches p */
    CHECK(sim_faults(pool) == 0 && snap(pool).cross_stream_hits == 0);
    OK(flare_sim_stream_complete(pool, s));
    u = allocate_on(pool, 2 * MiB, t);
    CHECK(u == p);
    st = snap(pool);
    CHECK(st.cross_stream_hits == 1 && st.cross_stream_waits == 0);
    CHECK(sim_faults(pool) == 0);
    OK(flare_package_free_async(pool, r, t));
    OK(flare_package_free_async(pool, u, t));
    trim_check_destroy(pool, "cross-stream reuse");

    /* WAIT: handed to T at once, T made to wait on S's fence, no fault. */
    pool = stream_pool(0, FLARE_CROSS_STREAM_WAIT);
    s = new_stream(pool);
    t = new_stream(pool);
    p = allocate_on(pool, 2 * MiB, s);
    OK(flare_sim_launch(pool, s, p, 2 * MiB));
    OK(flare_package_free_async(pool, p, s));
    r = allocate_on(pool, 2 * MiB, t);
    CHECK(r == p);
    st = snap(pool);
    CHECK(st.cross_stream_hits == 1 && st.cross_stream_waits == 1);
    CHECK(sim_faults(pool) == 0);
    OK(flare_package_free_async(pool, r, t));
    OK(flare_sim_stream_complete(pool, t));
    trim_check_destroy(pool, "cross-stream wait");
}

/* Issue 11: a free_async during a capture, with no retention scope, never breaks the
 * capture; what it freed is reused only inside that capture, then kept until trim. */
static void test_stream_capture(void) {
    FlarePool *pool = stream_pool(0, FLARE_CROSS_STREAM_WHEN_COMPLETE);
    FlareStream s = new_stream(pool), t = new_stream(pool);
    FlareSnapshot st;
    void *before = allocate_on(pool, 2 * MiB, s), *inside = NULL, *again = NULL;
    void *on_t = NULL, *on_s = NULL;
    int valid = 7;
    OK(flare_sim_begin_capture(pool, s));
    inside = allocate_on(pool, 2 * MiB, s);
    OK(flare_sim_launch(pool, s, inside, 2 * MiB));
    OK(flare_package_free_async(pool, inside, s));
    OK(flare_package_free_async(pool, before, s));
    again = allocate_on(pool, 2 * MiB, s);
    OK(flare_package_free_async(pool, again, s));
    CHECK(sim_faults(pool) == 0);
    OK(flare_sim_end_capture(pool, s, &valid));
    CHECK(valid == 1);
    st = snap(pool);
    CHECK(st.live_count == 0 && st.physical_bytes >= 4 * MiB &&
          st.capture_held_bytes == st.physical_bytes && st.captures_seen >= 1);
    /* Kept for the graph: neither another stream nor the capturing one gets it. */
    on_t = allocate_on(pool, 2 * MiB, t);
    on_s = allocate_on(pool, 2 * MiB, s);
    CHECK(on_t != before && on_t != inside && on_t != again);
    CHECK(on_s != before && on_s != inside && on_s != again);
    OK(flare_package_free_async(pool, on_t, t));
    OK(flare_package_free_async(pool, on_s, s));
    CHECK(sim_faults(pool) == 0);
    trim_check_destroy(pool, "capture"); /* no scope: trim releases what it held */
}

/* Issue 11: after record_stream(p, T), a free of p on S waits for T's work too: p is
 * not handed back, even on S, while T's queued work touches it. */
static void test_stream_record(void) {
    FlarePool *pool = stream_pool(64 * MiB, FLARE_CROSS_STREAM_WHEN_COMPLETE);
    FlareStream s = new_stream(pool), t = new_stream(pool);
    void *p = allocate_on(pool, 2 * MiB, s), *q = NULL;
    OK(flare_package_record_stream(pool, p, t));
    OK(flare_sim_launch(pool, t, p, 2 * MiB));
    OK(flare_package_free_async(pool, p, s));
    q = allocate_on(pool, 2 * MiB, s);
    CHECK(q != p);
    CHECK(sim_faults(pool) == 0);
    OK(flare_sim_stream_complete(pool, t));
    OK(flare_package_free_async(pool, q, s));
    trim_check_destroy(pool, "record_stream");
}

/* Issue 34: the simulated driver hands a destroyed stream's handle to the next
 * stream created. Forgotten first (flare_pool_forget_stream), the old stream's memory,
 * which its kernel still uses, is not handed to the new stream with the same handle.
 * The default streams are refused, a second forget and an unknown stream do nothing,
 * a capturing stream is refused with nothing changed. */
static void test_stream_forget(void) {
    FlarePool *pool = stream_pool(0, FLARE_CROSS_STREAM_WHEN_COMPLETE);
    FlareStream s = new_stream(pool), t;
    void *p = allocate_on(pool, 2 * MiB, s), *q;
    FlareSnapshot before, after;
    int valid = 0;

    CHECK_STATUS(flare_pool_forget_stream(NULL, s), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_forget_stream(pool, NULL), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(last_error_contains("never destroyed"));
    CHECK_STATUS(flare_pool_forget_stream(pool, (FlareStream)(uintptr_t)1),
                 FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_forget_stream(pool, (FlareStream)(uintptr_t)2),
                 FLARE_STATUS_INVALID_ARGUMENT);
    OK(flare_pool_forget_stream(pool, (FlareStream)(uintptr_t)0x1234));
    OK(flare_sim_launch(pool, s, p, 2 * MiB));
    OK(flare_package_free_async(pool, p, s));
    /* Capturing: refused, nothing changed, the capture stays valid. */
    OK(flare_sim_begin_capture(pool, s));
    before = snap(pool);
    CHECK_STATUS(flare_pool_forget_stream(pool, s), FLARE_STATUS_STREAM_STATE);
    CHECK(last_error_contains("being captured"));
    CHECK_STATUS(flare_sim_stream_destroy(pool, s), FLARE_STATUS_INVALID_ARGUMENT);
    after = snap(pool);
    CHECK(snap_equal(&before, &after));
    OK(flare_sim_end_capture(pool, s, &valid));
    CHECK(valid == 1);
    OK(flare_pool_forget_stream(pool, s));
    OK(flare_pool_forget_stream(pool, s)); /* twice: nothing to forget */
    OK(flare_sim_stream_destroy(pool, s));
    CHECK_STATUS(flare_sim_stream_destroy(pool, s), FLARE_STATUS_INVALID_ARGUMENT);
    t = new_stream(pool);
    CHECK(t == s); /* the handle is handed out again */
    q = allocate_on(pool, 2 * MiB, t);
    CHECK(q != p);
    CHECK(sim_faults(pool) == 0);
    OK(flare_package_free_async(pool, q, t));
    trim_check_destroy(pool, "forget_stream");
}

#endif /* FLARE_STREAM_TESTS_H */

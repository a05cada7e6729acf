/* Recording (issue 17): FlarePoolConfig.record_path. Included by lifecycle_tests.h
 * (C11 and C++17). */

/* A pool recording to a file: the file starts with the format line and the
 * configuration header, and has one line per call (a stream-ordered allocation
 * with its stream). */
static void test_record(void) {
    char path[256];
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    FlareStream s = NULL;
    void *a = NULL, *b = NULL;
    char text[4096];
    size_t n;
    FILE *f;
    snprintf(path, sizeof path, "/tmp/flare-c-record-%ld.trace", (long)rand());
    flare_pool_config_init(&cfg, sizeof cfg);
    CHECK(cfg.record_path == NULL);
    cfg.backend = FLARE_BACKEND_SIMULATED;
    cfg.record_path = path;
    OK(flare_pool_create(&cfg, &pool));
    OK(flare_sim_stream_create(pool, &s));
    OK(flare_retention_begin(pool));
    OK(flare_package_allocate(pool, 3 * MiB, &a));
    OK(flare_package_allocate_async(pool, 4096, s, &b));
    OK(flare_package_free(pool, a));
    OK(flare_package_free_async(pool, b, s));
    OK(flare_retention_finish(pool));
    OK(flare_pool_trim(pool));
    OK(flare_pool_destroy(pool)); /* writes the rest */
    f = fopen(path, "rb");
    CHECK(f != NULL);
    if (f == NULL) {
        return;
    }
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    remove(path);
    text[n] = '\0';
    CHECK(strncmp(text, "# flare-trace v1\n", 17) == 0);
    CHECK(strstr(text, "\n# flare-pool policy=best-fit granularity=2097152 ") != NULL);
    CHECK(strstr(text, "\nbegin\na 0x") != NULL);
    CHECK(strstr(text, " 3145728\n") != NULL);
    CHECK(strstr(text, " 4096 0 0x") != NULL); /* stream-ordered: tag 0, the stream */
    /* finish waits on the stream's fence: a done line may follow it. */
    CHECK(strstr(text, "\nfinish\n") != NULL && strstr(text, "\ntrim\n") != NULL);
}

/* A path in a missing directory: the pool is created and serves calls; the error
 * goes to standard error once (not checked here) and is kept
 * (flare_pool_record_error), no call fails. An empty path is a mistake the header
 * says flare_pool_create refuses: INVALID_ARGUMENT, no pool written. */
static void test_record_unwritable(void) {
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    void *a = NULL;
    char err[256];
    int i;
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.backend = FLARE_BACKEND_SIMULATED;
    cfg.record_path = "/nonexistent-flare-dir/x.trace";
    OK(flare_pool_create(&cfg, &pool));
    for (i = 0; i < 10; i++) {
        OK(flare_package_allocate(pool, MiB, &a));
        OK(flare_package_free(pool, a));
    }
    CHECK(flare_pool_record_error(pool, err, sizeof err) > 0);
    CHECK(strstr(err, "/nonexistent-flare-dir/x.trace") != NULL);
    OK(flare_pool_destroy(pool));
    /* An empty path is refused and nothing is written to the output; an older
     * caller's struct_size leaves it NULL. */
    cfg.record_path = "";
    pool = NULL;
    CHECK_STATUS(flare_pool_create(&cfg, &pool), FLARE_STATUS_INVALID_ARGUMENT);
    CHECK(pool == NULL);
    CHECK(last_error_contains("record_path is empty"));
    cfg.struct_size = 96;
    OK(flare_pool_create(&cfg, &pool));
    OK(flare_pool_destroy(pool));
}

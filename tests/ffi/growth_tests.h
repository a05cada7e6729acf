/* The growth report (issue 38): flare_pool_mark_step, flare_pool_growth_report.
 * Included by lifecycle_tests.h (C11 and C++17). */

/* 40 marked steps keeping a 1 MiB allocation each: the report names the 1 MiB group
 * growing at 1 allocation and 1 MiB per step (39 gained over the 39 steps after its
 * first); the length comes first (buf NULL), then the text; JSON on request; a NULL
 * out_len is refused. */
static void test_growth_report(void) {
    FlarePool *pool = new_pool(FLARE_REUSE_BEST_FIT, 0, 0);
    void *kept[40];
    size_t n = 0, m = 0;
    char *text;
    int i;
    for (i = 0; i < 40; i++) {
        void *t = NULL;
        OK(flare_pool_mark_step(pool));
        OK(flare_package_allocate(pool, 1 * MiB, &kept[i]));
        OK(flare_package_allocate(pool, 3 * MiB, &t));
        OK(flare_package_free(pool, t));
    }
    OK(flare_pool_growth_report(pool, 0, 0, 0, NULL, 0, &n));
    CHECK(n > 0);
    text = (char *)malloc(n + 1);
    CHECK(text != NULL);
    if (text == NULL) {
        return;
    }
    OK(flare_pool_growth_report(pool, 0, 0, 0, text, n + 1, &m));
    CHECK(m == n && strlen(text) == n);
    CHECK(strstr(text, "; 1 grows\n") != NULL);
    CHECK(strstr(text, "steps: 41, one per step marker (40 written;") != NULL);
    CHECK(strstr(text, "\n  tag 0, 1.0 MiB (1048576 B) each: 1 allocation and 1.0 MiB per step\n"
                       "      40 live, 40.0 MiB, made in steps 1 to 40 (40 distinct)\n") != NULL);
    /* Truncated to len - 1 bytes, the full length returned. */
    OK(flare_pool_growth_report(pool, 0, 0, 0, text, 8, &m));
    CHECK(m == n && strlen(text) == 7 && strncmp(text, "growth ", 7) == 0);
    free(text);
    text = (char *)malloc(1 << 16);
    CHECK(text != NULL);
    if (text == NULL) {
        return;
    }
    OK(flare_pool_growth_report(pool, 0, 41, 1, text, 1 << 16, &m));
    CHECK(strstr(text, "\"step_kind\":\"markers\"") != NULL);
    CHECK(strstr(text, "\"min_steps\":41") != NULL && strstr(text, "\"growing\":0") != NULL);
    CHECK_STATUS(flare_pool_growth_report(pool, 0, 0, 0, text, 1 << 16, NULL),
                 FLARE_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(flare_pool_mark_step(NULL), FLARE_STATUS_INVALID_ARGUMENT);
    free(text);
    for (i = 0; i < 40; i++) {
        OK(flare_package_free(pool, kept[i]));
    }
    OK(flare_pool_destroy(pool));
}

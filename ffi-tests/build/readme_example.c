#include <stdio.h>
#include "flare_package.h"

/* Whether a call succeeded; prints the detail when it did not. */
static int ok(FlareStatus status, const char *call) {
    char msg[512];
    if (status == FLARE_STATUS_SUCCESS) return 1;
    flare_last_error_message(msg, sizeof msg);
    fprintf(stderr, "%s: %s: %s\n", call, flare_status_name(status), msg);
    return 0;
}

int main(void) {
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    FlareSnapshot s = {.struct_size = sizeof s};
    int good, i;

    flare_pool_config_init(&cfg, sizeof cfg); /* the simulated H200: runs anywhere */
    /* cfg.backend = FLARE_BACKEND_CUDA;         real memory on GPU cfg.device */
    if (!ok(flare_pool_create(&cfg, &pool), "flare_pool_create")) return 1;

    good = ok(flare_retention_begin(pool), "begin"); /* around warmup and capture */
    for (i = 0; i < 12 && good; i++) {
        void *p = NULL;
        good = ok(flare_package_allocate(pool, (size_t)1 << 30, &p), "allocate") /* 1 GiB */
            && ok(flare_package_free(pool, p), "free"); /* retained; the next one reuses it */
    }
    good = good && ok(flare_retention_finish(pool), "finish"); /* synchronize, release */
    good = good && ok(flare_pool_snapshot(pool, &s), "snapshot");
    printf("12 transients of 1 GiB held at most %llu bytes\n",
           (unsigned long long)s.peak_physical_bytes);
    good = ok(flare_pool_destroy(pool), "destroy") && good;
    return good && s.peak_physical_bytes == (1ull << 30) ? 0 : 1;
}

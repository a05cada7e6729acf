/* A forward's warm-up, as an inference engine does it: the weights stay, and each of
 * 12 warm-up forwards (one per batch shape, say) allocates a 1 GiB transient and
 * frees it. Inside a retention scope nothing freed is released (queued or captured
 * GPU work may still touch it), and the next transient reuses the freed mapping:
 * the pool holds 4 + 1 GiB, not 4 + 12.
 *
 * Runs anywhere: the pool is on the simulated H200 (no GPU). On a GPU, set
 * cfg.backend = FLARE_BACKEND_CUDA and cfg.device. Build from the checkout:
 *
 *   cargo clib
 *   cc -std=c11 -I include examples/c/warmup.c target/release/libflare_package.a \
 *      -lpthread -ldl -lm -o warmup && ./warmup
 */
#include <stdio.h>
#include "flare_package.h"

#define GIB ((size_t)1 << 30)

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
    void *weights = NULL;
    int good, i;

    flare_pool_config_init(&cfg, sizeof cfg); /* the simulated H200: runs anywhere */
    /* cfg.backend = FLARE_BACKEND_CUDA;         real memory on GPU cfg.device */
    if (!ok(flare_pool_create(&cfg, &pool), "flare_pool_create")) return 1;

    good = ok(flare_package_allocate(pool, 4 * GIB, &weights), "allocate weights");
    good = good && ok(flare_retention_begin(pool), "begin"); /* around warm-up and capture */
    for (i = 0; i < 12 && good; i++) {
        void *t = NULL;
        good = ok(flare_package_allocate(pool, GIB, &t), "allocate") /* 1 GiB transient */
            && ok(flare_package_free(pool, t), "free"); /* retained; the next one reuses it */
    }
    good = good && ok(flare_retention_finish(pool), "finish"); /* synchronize, release idle */
    good = good && ok(flare_pool_snapshot(pool, &s), "snapshot");
    printf("peak %llu GiB, %llu mappings created, %llu reuse hits, %llu GiB held after the scope\n",
           (unsigned long long)(s.peak_physical_bytes / GIB),
           (unsigned long long)s.mappings_created, (unsigned long long)s.reuse_hits,
           (unsigned long long)(s.physical_bytes / GIB));
    good = good && s.peak_physical_bytes == 5 * GIB && s.reuse_hits == 11
        && s.physical_bytes == 4 * GIB;

    if (weights) good = ok(flare_package_free(pool, weights), "free weights") && good;
    good = ok(flare_pool_destroy(pool), "destroy") && good;
    return good ? 0 : 1;
}

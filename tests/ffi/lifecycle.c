/* The C ABI from C11: see lifecycle_tests.h for the checks. Threads: pthreads. */
#include "lifecycle_tests.h"

#include <pthread.h>

/* The layouts on a 64-bit target, at compile time (lifecycle.cpp has the same). */
_Static_assert(sizeof(FlarePoolConfig) == 112, "FlarePoolConfig layout");
_Static_assert(offsetof(FlarePoolConfig, record_path) == 96, "FlarePoolConfig layout");
_Static_assert(offsetof(FlarePoolConfig, segment_whole_threshold_bytes) == 72,
               "FlarePoolConfig layout");
_Static_assert(offsetof(FlarePoolConfig, thread_cache_entries) == 80, "FlarePoolConfig layout");
_Static_assert(offsetof(FlarePoolConfig, thread_cache_bytes) == 88, "FlarePoolConfig layout");
_Static_assert(sizeof(FlareSnapshot) == 472, "FlareSnapshot layout");
_Static_assert(offsetof(FlareSnapshot, segment_count) == 304, "FlareSnapshot layout");
_Static_assert(offsetof(FlareSnapshot, segment_lent_bytes) == 360, "FlareSnapshot layout");
_Static_assert(offsetof(FlareSnapshot, thread_cache_count) == 368, "FlareSnapshot layout");
_Static_assert(offsetof(FlareSnapshot, thread_cache_bytes) == 376, "FlareSnapshot layout");
_Static_assert(offsetof(FlareSnapshot, thread_cache_hits) == 384, "FlareSnapshot layout");
_Static_assert(offsetof(FlareSnapshot, remote_frees) == 392, "FlareSnapshot layout");
_Static_assert(FLARE_THREAD_CACHE_OFF == UINT32_MAX, "FLARE_THREAD_CACHE_OFF");
_Static_assert(FLARE_REUSE_SEGMENTS == 3, "FlareReusePolicy numbers");

static void run_parallel(void *(*fn)(void *), void *args[], int n) {
    pthread_t threads[16];
    int i, started = 0;
    for (i = 0; i < n && i < 16; i++) {
        if (pthread_create(&threads[i], NULL, fn, args[i]) != 0) {
            report(0, __FILE__, __LINE__, "pthread_create");
            break;
        }
        started++;
    }
    for (i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
    }
}

int main(void) {
    return run_all_tests("C11");
}

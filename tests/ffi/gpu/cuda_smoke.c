/*
 * The C ABI on the real CUDA backend: allocate, write with cuMemsetD8, read back with
 * cuMemcpyDtoH, free, and reuse inside a retention scope (the retained mapping keeps
 * its bytes). Needs a GPU and libcuda.so.1; prints "N passed, N failed" last.
 *
 *   tests/ffi/gpu/run.sh [path/to/libflare_package.a] [device]
 *
 * The CUDA driver API is loaded with dlopen, so building needs no CUDA toolkit. The
 * test's own driver calls need a current context: it retains the device's primary
 * context (the one the pool uses) and makes it current.
 */
#define _POSIX_C_SOURCE 200809L
#include "flare_package.h"
#include "flare_package_sim.h" /* flare_sim_inject_failure */

#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit_)(unsigned int);
static CUresult (*cuDeviceGet_)(CUdevice *, int);
static CUresult (*cuDevicePrimaryCtxRetain_)(CUcontext *, CUdevice);
static CUresult (*cuDevicePrimaryCtxRelease_)(CUdevice);
static CUresult (*cuCtxSetCurrent_)(CUcontext);
static CUresult (*cuCtxSynchronize_)(void);
static CUresult (*cuMemsetD8_)(CUdeviceptr, unsigned char, size_t);
static CUresult (*cuMemcpyDtoH_)(void *, CUdeviceptr, size_t);

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static int passed, failed;

static void check(int ok, int line, const char *what) {
    if (ok) {
        passed++;
        printf("ok   %s\n", what);
    } else {
        char msg[512];
        failed++;
        flare_last_error_message(msg, sizeof msg);
        printf("FAIL line %d: %s (last flare error: %s)\n", line, what, msg);
    }
}
#define CHECK(c) check((c) ? 1 : 0, __LINE__, #c)
#define CU(call) check((call) == 0, __LINE__, #call)

/* Loads one symbol; the memcpy is the ISO C way to turn dlsym's object pointer into a
 * function pointer. */
static int load(void *lib, const char *name, void *fn, size_t fn_size) {
    void *sym = dlsym(lib, name);
    if (sym == NULL) {
        printf("FAIL: %s not found in libcuda.so.1\n", name);
        return 0;
    }
    memcpy(fn, &sym, fn_size);
    return 1;
}
#define LOAD(lib, var, name) load((lib), (name), (void *)&(var), sizeof(var))

static FlareSnapshot snap(const FlarePool *pool) {
    FlareSnapshot s;
    memset(&s, 0, sizeof s);
    s.struct_size = (uint32_t)sizeof s;
    CHECK(flare_pool_snapshot(pool, &s) == FLARE_STATUS_SUCCESS);
    return s;
}

/* Whether the bytes at offsets 0, size/2 and size-1 of the allocation all read `want`
 * (4 KiB read at each place). */
static int reads_back(void *ptr, size_t size, unsigned char want) {
    static unsigned char host[4096];
    size_t offsets[3];
    size_t i, j;
    offsets[0] = 0;
    offsets[1] = size / 2;
    offsets[2] = size - sizeof host;
    for (i = 0; i < 3; i++) {
        memset(host, (unsigned char)~want, sizeof host);
        if (cuMemcpyDtoH_(host, (CUdeviceptr)(uintptr_t)ptr + offsets[i], sizeof host) != 0) {
            return 0;
        }
        for (j = 0; j < sizeof host; j++) {
            if (host[j] != want) {
                printf("     byte %zu of %zu is 0x%02x, expected 0x%02x\n", offsets[i] + j, size,
                       host[j], want);
                return 0;
            }
        }
    }
    return 1;
}

int main(int argc, char **argv) {
    int device = argc > 1 ? atoi(argv[1]) : 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    FlarePoolConfig cfg;
    FlarePool *pool = NULL;
    FlareSnapshot s;
    void *a = NULL, *b = NULL, *big = NULL;
    FlareStatus st;

    printf("flare-package %d.%d.%d: CUDA smoke test on device %d\n", FLARE_PACKAGE_VERSION_MAJOR,
           FLARE_PACKAGE_VERSION_MINOR, FLARE_PACKAGE_VERSION_PATCH, device);
    if (lib == NULL) {
        printf("FAIL: dlopen(libcuda.so.1): %s\n0 passed, 1 failed\n", dlerror());
        return 1;
    }
    if (!LOAD(lib, cuInit_, "cuInit") || !LOAD(lib, cuDeviceGet_, "cuDeviceGet") ||
        !LOAD(lib, cuDevicePrimaryCtxRetain_, "cuDevicePrimaryCtxRetain") ||
        !LOAD(lib, cuDevicePrimaryCtxRelease_, "cuDevicePrimaryCtxRelease_v2") ||
        !LOAD(lib, cuCtxSetCurrent_, "cuCtxSetCurrent") ||
        !LOAD(lib, cuCtxSynchronize_, "cuCtxSynchronize") ||
        !LOAD(lib, cuMemsetD8_, "cuMemsetD8_v2") || !LOAD(lib, cuMemcpyDtoH_, "cuMemcpyDtoH_v2")) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    CU(cuInit_(0));
    CU(cuDeviceGet_(&dev, device));
    CU(cuDevicePrimaryCtxRetain_(&ctx, dev));
    CU(cuCtxSetCurrent_(ctx));

    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.backend = FLARE_BACKEND_CUDA;
    cfg.device = device;
    st = flare_pool_create(&cfg, &pool);
    CHECK(st == FLARE_STATUS_SUCCESS);
    if (st != FLARE_STATUS_SUCCESS) {
        printf("flare_pool_create: %s\n%d passed, %d failed\n", flare_status_name(st), passed,
               failed);
        return 1;
    }
    s = snap(pool);
    printf("     granularity %" PRIu64 " bytes\n", s.granularity_bytes);
    CHECK(s.granularity_bytes > 0);
    CHECK(flare_sim_inject_failure(pool, FLARE_CALL_MAP, 1, 999) == FLARE_STATUS_NOT_SUPPORTED);

    /* Allocate, write, read back, free. */
    CHECK(flare_package_allocate(pool, 3 * MiB, &a) == FLARE_STATUS_SUCCESS && a != NULL);
    CU(cuMemsetD8_((CUdeviceptr)(uintptr_t)a, 0xab, 3 * MiB));
    CU(cuCtxSynchronize_());
    CHECK(reads_back(a, 3 * MiB, 0xab));
    s = snap(pool);
    CHECK(s.live_count == 1 && s.live_requested_bytes == 3 * MiB && s.physical_bytes >= 3 * MiB);
    CHECK(flare_package_free(pool, a) == FLARE_STATUS_SUCCESS);
    s = snap(pool);
    CHECK(s.physical_bytes == 0 && s.reserved_bytes == 0);

    /* 1 GiB, the whole of it written. */
    CHECK(flare_package_allocate(pool, GiB, &big) == FLARE_STATUS_SUCCESS);
    CU(cuMemsetD8_((CUdeviceptr)(uintptr_t)big, 0x11, GiB));
    CU(cuCtxSynchronize_());
    CHECK(reads_back(big, GiB, 0x11));
    CHECK(flare_package_free(pool, big) == FLARE_STATUS_SUCCESS);

    /* Reuse inside a scope: the retained mapping comes back with its bytes. */
    CHECK(flare_retention_begin(pool) == FLARE_STATUS_SUCCESS);
    CHECK(flare_package_allocate(pool, 8 * MiB, &a) == FLARE_STATUS_SUCCESS);
    CU(cuMemsetD8_((CUdeviceptr)(uintptr_t)a, 0x5a, 8 * MiB));
    CU(cuCtxSynchronize_());
    CHECK(flare_package_free(pool, a) == FLARE_STATUS_SUCCESS);
    CHECK(flare_package_allocate(pool, 8 * MiB, &b) == FLARE_STATUS_SUCCESS);
    CHECK(a == b);
    CHECK(reads_back(b, 8 * MiB, 0x5a));
    CU(cuMemsetD8_((CUdeviceptr)(uintptr_t)b, 0xc3, 8 * MiB));
    CU(cuCtxSynchronize_());
    CHECK(reads_back(b, 8 * MiB, 0xc3));
    s = snap(pool);
    CHECK(s.reuse_hits == 1 && s.scope_open == 1 && s.physical_bytes == 8 * MiB);
    CHECK(flare_package_free(pool, b) == FLARE_STATUS_SUCCESS);
    CHECK(flare_retention_finish(pool) == FLARE_STATUS_SUCCESS);
    s = snap(pool);
    CHECK(s.physical_bytes == 0 && s.reserved_bytes == 0 && s.pending_count == 0);
    printf("     peak physical %" PRIu64 " bytes, %" PRIu64 " mappings created, %" PRIu64
           " released\n",
           s.peak_physical_bytes, s.mappings_created, s.mappings_released);

    /* Bad input on the CUDA backend too. */
    CHECK(flare_package_free(pool, (char *)b + 1) == FLARE_STATUS_UNKNOWN_POINTER);

    CHECK(flare_pool_destroy(pool) == FLARE_STATUS_SUCCESS);
    CU(cuDevicePrimaryCtxRelease_(dev));
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

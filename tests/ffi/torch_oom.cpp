/* Issue 34: a failed flare_torch_alloc raises through PyTorch's own torchCheckFail
 * found in the process, with no handler set (the pair loaded as PyTorch's
 * documentation shows, without the Python package), instead of returning NULL, which
 * PyTorch wraps in a tensor at address 0 (pytorch #133280). The handler set with
 * flare_torch_set_oom_handler comes first; FLARE_TORCH_OOM=null, or no such function
 * in the process, returns NULL.
 *
 *   torch_oom throws|null [LIBRARY]
 *
 * "throws": a failure must throw the stand-in's exception (fake_c10.cpp, linked into
 * this program or dlopened RTLD_LOCAL from LIBRARY); "null": it must return NULL.
 * run.sh runs the four cases. Prints "N passed, M failed". */
#include "flare_package_torch.h" // PyTorch's entry points (includes flare_package.h)
#include "flare_package_sim.h"   // flare_torch_use_simulated

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace {

int g_passed = 0;
int g_failed = 0;

void report(bool ok, int line, const char *what, const std::string &detail) {
    if (ok) {
        g_passed++;
    } else {
        g_failed++;
        std::fprintf(stderr, "FAIL torch_oom.cpp:%d: %s (%s)\n", line, what, detail.c_str());
    }
}

#define CHECK(cond, detail) report((cond), __LINE__, #cond, (detail))

std::string last_error() {
    char msg[1024];
    flare_last_error_message(msg, sizeof msg);
    return msg;
}

std::string stats() {
    char buf[1 << 14];
    flare_torch_stats(0, buf, sizeof buf);
    return buf;
}

/* What a flare_torch_alloc call did. */
struct Outcome {
    void *ptr = nullptr;
    bool threw = false;
    std::string message; /* the exception's */
};

Outcome alloc(size_t size) {
    Outcome o;
    try {
        o.ptr = flare_torch_alloc(size, 0, nullptr);
    } catch (const std::exception &e) {
        o.threw = true;
        o.message = e.what();
    }
    return o;
}

[[noreturn]] void explicit_handler(const char *func, const char *, uint32_t, const char *msg) {
    throw std::logic_error(std::string("explicit: ") + func + ": " + msg);
}

bool starts_with(const std::string &s, const std::string &prefix) {
    return s.compare(0, prefix.size(), prefix) == 0;
}

} // namespace

int main(int argc, char **argv) {
    const bool throws = argc > 1 && std::strcmp(argv[1], "throws") == 0;
    if (argc < 2 || (!throws && std::strcmp(argv[1], "null") != 0)) {
        std::fprintf(stderr, "usage: torch_oom throws|null [LIBRARY]\n");
        return 2;
    }
    if (argc > 2) {
        /* As Python imports PyTorch: local, so not in the global scope. */
        void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        const char *why = lib == nullptr ? dlerror() : nullptr;
        CHECK(lib != nullptr, why != nullptr ? why : "");
    }
    const uint64_t capacity = UINT64_C(64) << 20;
    CHECK(flare_torch_use_simulated(capacity, 1) == FLARE_STATUS_SUCCESS, last_error());

    void *held = flare_torch_alloc(4096, 0, nullptr);
    CHECK(held != nullptr, last_error());
    const std::string before = stats();
    /* A request twice the device: it fails (request too large). */
    const size_t big = 2 * capacity;
    const std::string request = "flare_torch_alloc: request of " + std::to_string(big) +
                                " bytes on device 0 failed: ";
    Outcome o = alloc(big);
    if (throws) {
        CHECK(o.threw, "returned " + std::to_string(reinterpret_cast<uintptr_t>(o.ptr)));
        CHECK(starts_with(o.message, "fake c10: flare_torch_alloc: " + request), o.message);
    } else {
        CHECK(!o.threw && o.ptr == nullptr, o.message);
    }
    /* Either way the thread's last error holds the message; the pool is unchanged
     * (one live block of 4096 bytes) and serves the next request. */
    CHECK(starts_with(last_error(), request), last_error());
    CHECK(stats() == before, stats() + " != " + before);
    CHECK(stats().find("\"block_live_bytes\":4096,") != std::string::npos, stats());
    Outcome next = alloc(1 << 20);
    CHECK(!next.threw && next.ptr != nullptr && next.ptr != held, next.message + last_error());

    /* 0 bytes: NULL, no handler called. */
    Outcome zero = alloc(0);
    CHECK(!zero.threw && zero.ptr == nullptr, zero.message);

    /* The handler set comes first, whatever the process holds. */
    flare_torch_set_oom_handler(explicit_handler);
    o = alloc(big);
    CHECK(o.threw && starts_with(o.message, "explicit: flare_torch_alloc: " + request),
          o.message);
    /* NULL sets none: back to the process's function (or NULL). */
    flare_torch_set_oom_handler(nullptr);
    o = alloc(big);
    if (throws) {
        CHECK(o.threw && starts_with(o.message, "fake c10: "), o.message);
    } else {
        CHECK(!o.threw && o.ptr == nullptr, o.message);
    }

    flare_torch_free(next.ptr, 1 << 20, 0, nullptr);
    flare_torch_free(held, 4096, 0, nullptr);
    CHECK(flare_torch_hook_failures() == 0, last_error());
    CHECK(stats().find("\"block_live_bytes\":0,") != std::string::npos, stats());
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}

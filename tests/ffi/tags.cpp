// Tags (issue 15) from C++17 on the simulated driver: tagged allocation (whole
// mappings, and blocks of the tag's own heap in segment mode), the census, sleep and
// wake in FLARE_SLEEP_DISCARD and FLARE_SLEEP_OFFLOAD, a wake that does not fit
// (FLARE_STATUS_OUT_OF_MEMORY, rolled back, the tag asleep, woken later), an injected
// driver failure during sleep and wake, and the error statuses. What a C++ engine
// does: RAII ownership of the pool, a tag per model, std::vector of pointers.
//
// The figures come from the contract (docs/ARCHITECTURE.md, "Tags: sleep and wake"),
// not from the library's output: the simulated device has a 2 MiB granularity; a
// whole mapping is the request rounded up to it; a block is the request rounded up to
// 512 bytes, carved from the tag's own heap, which grows by whole handles (the need
// rounded to the granularity); sleep releases every handle the tag holds and keeps
// its addresses; offload keeps each live allocation's requested bytes in host memory
// (the snapshot's offloaded_bytes); wake maps new handles at the same addresses.
//
// The last line printed is "N passed, 0 failed" (tests/ffi/run.sh checks it).
#include "flare_package.h"
#include "flare_package_sim.h" // flare_sim_inject_failure

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

int passed = 0;
int failed = 0;

void check(bool ok, const char *what, int line) {
    if (ok) {
        passed++;
    } else {
        failed++;
        std::fprintf(stderr, "tags.cpp:%d: check failed: %s\n", line, what);
    }
}

#define CHECK(x) check((x), #x, __LINE__)
#define STATUS(call, want) check((call) == (want), #call " == " #want, __LINE__)
#define OK(call) STATUS(call, FLARE_STATUS_SUCCESS)

constexpr uint64_t MiB = 1024 * 1024;

struct PoolDeleter {
    void operator()(FlarePool *pool) const noexcept { flare_pool_destroy(pool); }
};
using PoolPtr = std::unique_ptr<FlarePool, PoolDeleter>;

PoolPtr make_pool(FlareReusePolicy policy, uint64_t capacity) {
    FlarePoolConfig cfg;
    flare_pool_config_init(&cfg, sizeof cfg);
    cfg.backend = FLARE_BACKEND_SIMULATED;
    cfg.reuse_policy = static_cast<uint32_t>(policy);
    cfg.sim_capacity_bytes = capacity;
    FlarePool *raw = nullptr;
    OK(flare_pool_create(&cfg, &raw));
    return PoolPtr(raw);
}

FlareSnapshot snapshot(FlarePool *pool) {
    FlareSnapshot s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    OK(flare_pool_snapshot(pool, &s));
    return s;
}

FlareTagCensus census(FlarePool *pool, uint32_t tag) {
    FlareTagCensus c;
    std::memset(&c, 0xff, sizeof c);
    c.struct_size = sizeof c;
    OK(flare_pool_tag_census(pool, tag, &c));
    return c;
}

std::string last_error() {
    std::string msg(flare_last_error_message(nullptr, 0), '\0');
    flare_last_error_message(&msg[0], msg.size() + 1);
    return msg;
}

// Whole mappings (best fit): two models, tagged 1 and 2; model 1 sleeps with each
// mode and wakes; model 2 and the untagged memory never change.
void test_whole_mappings() {
    PoolPtr pool = make_pool(FLARE_REUSE_BEST_FIT, 0);
    std::vector<void *> weights(3, nullptr);
    // 3 MiB maps 4 MiB each: 12 MiB for tag 1.
    for (auto &p : weights) {
        OK(flare_package_allocate_tagged(pool.get(), 3 * MiB, nullptr, 1, &p));
    }
    void *other = nullptr;
    void *untagged = nullptr;
    OK(flare_package_allocate_tagged(pool.get(), 10 * MiB, nullptr, 2, &other));
    OK(flare_package_allocate(pool.get(), MiB, &untagged));
    FlareTagCensus c = census(pool.get(), 1);
    CHECK(c.sleeping == 0 && c.live_count == 3 && c.live_bytes == 12 * MiB &&
          c.physical_bytes == 12 * MiB && c.idle_bytes == 0 && c.offloaded_bytes == 0);
    CHECK(census(pool.get(), 0).physical_bytes == 2 * MiB);
    const FlareSnapshot before = snapshot(pool.get());
    CHECK(before.physical_bytes == 24 * MiB);

    for (FlareSleepMode mode : {FLARE_SLEEP_DISCARD, FLARE_SLEEP_OFFLOAD}) {
        OK(flare_pool_sleep(pool.get(), 1, mode));
        FlareSnapshot s = snapshot(pool.get());
        CHECK(s.physical_bytes == 12 * MiB && s.reserved_bytes == before.reserved_bytes);
        CHECK(s.tags_sleeping == 1 && s.sleeping_count == 3 && s.sleeping_bytes == 12 * MiB);
        CHECK(s.offloaded_bytes == (mode == FLARE_SLEEP_OFFLOAD ? 9 * MiB : 0));
        c = census(pool.get(), 1);
        CHECK(c.sleeping == 1 && c.live_count == 3 && c.physical_bytes == 0);
        CHECK(census(pool.get(), 2).physical_bytes == 10 * MiB);
        // The sleeping tag refuses allocations, frees and a second sleep.
        void *p = nullptr;
        STATUS(flare_package_allocate_tagged(pool.get(), MiB, nullptr, 1, &p),
               FLARE_STATUS_TAG_STATE);
        STATUS(flare_package_free(pool.get(), weights[0]), FLARE_STATUS_TAG_STATE);
        STATUS(flare_pool_sleep(pool.get(), 1, FLARE_SLEEP_DISCARD), FLARE_STATUS_TAG_STATE);
        CHECK(last_error().find("tag 1") != std::string::npos);
        OK(flare_pool_wake(pool.get(), 1));
        s = snapshot(pool.get());
        CHECK(s.physical_bytes == before.physical_bytes && s.tags_sleeping == 0 &&
              s.sleeping_bytes == 0 && s.offloaded_bytes == 0);
    }
    // Waking a tag that does not sleep.
    STATUS(flare_pool_wake(pool.get(), 1), FLARE_STATUS_TAG_STATE);
    for (void *p : weights) {
        OK(flare_package_free(pool.get(), p));
    }
    OK(flare_package_free(pool.get(), other));
    OK(flare_package_free(pool.get(), untagged));
    CHECK(snapshot(pool.get()).physical_bytes == 0);
}

// Segment mode: the tag's blocks come from its own heap (flare_package_allocate_tagged
// is stream-ordered: NULL is the legacy stream); tag 0 sleeps too.
void test_segments() {
    PoolPtr pool = make_pool(FLARE_REUSE_SEGMENTS, 0);
    std::vector<void *> blocks(8, nullptr);
    // 1000 bytes round up to 1024: eight blocks in one 2 MiB handle of tag 3's heap.
    for (auto &p : blocks) {
        OK(flare_package_allocate_tagged(pool.get(), 1000, nullptr, 3, &p));
        CHECK(reinterpret_cast<uintptr_t>(p) % 512 == 0);
    }
    void *untagged = nullptr;
    OK(flare_package_allocate(pool.get(), 1000, &untagged));
    FlareTagCensus c = census(pool.get(), 3);
    CHECK(c.live_count == 8 && c.live_bytes == 8 * 1024 && c.physical_bytes == 2 * MiB &&
          c.idle_bytes == 2 * MiB - 8 * 1024);
    c = census(pool.get(), 0);
    CHECK(c.live_count == 1 && c.live_bytes == 1024 && c.physical_bytes == 2 * MiB);
    FlareSnapshot s = snapshot(pool.get());
    CHECK(s.segment_handles == 2 && s.block_live_count == 9 && s.physical_bytes == 4 * MiB);

    OK(flare_pool_sleep(pool.get(), 3, FLARE_SLEEP_OFFLOAD));
    s = snapshot(pool.get());
    // Only the live blocks' requested bytes are offloaded, not the free space.
    CHECK(s.physical_bytes == 2 * MiB && s.offloaded_bytes == 8 * 1000);
    CHECK(s.sleeping_count == 8 && s.sleeping_block_count == 8 &&
          s.sleeping_block_bytes == 8 * 1024 && s.segment_handles == 1);
    CHECK(census(pool.get(), 3).physical_bytes == 0);
    OK(flare_pool_wake(pool.get(), 3));
    // Tag 0 sleeps in segment mode (its blocks' handles are its own).
    OK(flare_pool_sleep(pool.get(), 0, FLARE_SLEEP_DISCARD));
    s = snapshot(pool.get());
    CHECK(s.physical_bytes == 2 * MiB && s.sleeping_count == 1 && s.offloaded_bytes == 0);
    void *p = nullptr;
    STATUS(flare_package_allocate(pool.get(), 1000, &p), FLARE_STATUS_TAG_STATE);
    OK(flare_package_allocate_tagged(pool.get(), 1000, nullptr, 3, &p));
    OK(flare_package_free(pool.get(), p));
    OK(flare_pool_wake(pool.get(), 0));
    s = snapshot(pool.get());
    CHECK(s.physical_bytes == 4 * MiB && s.tags_sleeping == 0 && s.sleeping_count == 0);
    // Freed synchronously and on the legacy stream: both stay the tag's.
    for (size_t i = 0; i < blocks.size(); i++) {
        if (i % 2 == 0) {
            OK(flare_package_free(pool.get(), blocks[i]));
        } else {
            OK(flare_package_free_async(pool.get(), blocks[i], nullptr));
        }
    }
    OK(flare_package_free(pool.get(), untagged));
    OK(flare_pool_trim(pool.get()));
    CHECK(snapshot(pool.get()).physical_bytes == 0);
}

// A wake that does not fit: FLARE_STATUS_OUT_OF_MEMORY, what it mapped rolled back,
// the tag asleep with its host copy; woken once memory is freed.
void test_wake_out_of_memory() {
    for (FlareReusePolicy policy : {FLARE_REUSE_BEST_FIT, FLARE_REUSE_SEGMENTS}) {
        PoolPtr pool = make_pool(policy, 64 * MiB);
        std::vector<void *> kv(4, nullptr);
        // 8 MiB each: four whole mappings, or four 8 MiB handles of the tag's heap
        // (a growth maps the need while an eighth of what is mapped is less).
        for (auto &p : kv) {
            OK(flare_package_allocate_tagged(pool.get(), 8 * MiB, nullptr, 9, &p));
        }
        OK(flare_pool_sleep(pool.get(), 9, FLARE_SLEEP_OFFLOAD));
        void *filler = nullptr;
        // 48 of the 64 MiB: 16 left, 32 needed.
        OK(flare_package_allocate_tagged(pool.get(), 48 * MiB, nullptr, 10, &filler));
        STATUS(flare_pool_wake(pool.get(), 9), FLARE_STATUS_OUT_OF_MEMORY);
        FlareSnapshot s = snapshot(pool.get());
        CHECK(s.physical_bytes == 48 * MiB && s.sleeping_bytes == 32 * MiB &&
              s.offloaded_bytes == 32 * MiB && s.tags_sleeping == 1);
        CHECK(census(pool.get(), 9).sleeping == 1);
        OK(flare_package_free(pool.get(), filler));
        OK(flare_pool_trim(pool.get()));
        OK(flare_pool_wake(pool.get(), 9));
        s = snapshot(pool.get());
        CHECK(s.physical_bytes == 32 * MiB && s.tags_sleeping == 0 && s.offloaded_bytes == 0);
        for (void *p : kv) {
            OK(flare_package_free(pool.get(), p));
        }
    }
}

// A driver call refused during sleep (an unmap) and during wake (a map): the sleep
// fails with the tag awake and usable; the wake fails with the tag asleep; both
// succeed when tried again.
void test_injected_failures() {
    for (FlareReusePolicy policy : {FLARE_REUSE_BEST_FIT, FLARE_REUSE_SEGMENTS}) {
        PoolPtr pool = make_pool(policy, 0);
        std::vector<void *> ptrs(3, nullptr);
        for (auto &p : ptrs) {
            OK(flare_package_allocate_tagged(pool.get(), 2 * MiB, nullptr, 4, &p));
        }
        OK(flare_sim_inject_failure(pool.get(), FLARE_CALL_UNMAP, 2, 999));
        STATUS(flare_pool_sleep(pool.get(), 4, FLARE_SLEEP_OFFLOAD), FLARE_STATUS_DRIVER_ERROR);
        FlareSnapshot s = snapshot(pool.get());
        CHECK(census(pool.get(), 4).sleeping == 0 && s.physical_bytes == 6 * MiB &&
              s.unmap_failures == 1 && s.offloaded_bytes == 0);
        void *p = nullptr;
        OK(flare_package_allocate_tagged(pool.get(), MiB, nullptr, 4, &p));
        OK(flare_package_free(pool.get(), p));
        OK(flare_pool_sleep(pool.get(), 4, FLARE_SLEEP_OFFLOAD));
        OK(flare_sim_inject_failure(pool.get(), FLARE_CALL_MAP, 2, 999));
        STATUS(flare_pool_wake(pool.get(), 4), FLARE_STATUS_DRIVER_ERROR);
        s = snapshot(pool.get());
        CHECK(census(pool.get(), 4).sleeping == 1 && s.map_failures == 1 &&
              s.physical_bytes == 0 && s.offloaded_bytes == 6 * MiB);
        OK(flare_pool_wake(pool.get(), 4));
        CHECK(snapshot(pool.get()).physical_bytes >= 6 * MiB);
        for (void *q : ptrs) {
            OK(flare_package_free(pool.get(), q));
        }
    }
}

// Bad arguments and states: a status, never a crash.
void test_errors() {
    PoolPtr pool = make_pool(FLARE_REUSE_BEST_FIT, 0);
    void *p = nullptr;
    STATUS(flare_package_allocate_tagged(nullptr, MiB, nullptr, 1, &p),
           FLARE_STATUS_INVALID_ARGUMENT);
    STATUS(flare_package_allocate_tagged(pool.get(), 0, nullptr, 1, &p),
           FLARE_STATUS_INVALID_ARGUMENT);
    STATUS(flare_pool_sleep(pool.get(), 1, static_cast<FlareSleepMode>(7)),
           FLARE_STATUS_INVALID_ARGUMENT);
    STATUS(flare_pool_wake(nullptr, 1), FLARE_STATUS_INVALID_ARGUMENT);
    STATUS(flare_pool_wake(pool.get(), 1), FLARE_STATUS_TAG_STATE);
    STATUS(flare_pool_tag_census(pool.get(), 1, nullptr), FLARE_STATUS_INVALID_ARGUMENT);
    // Inside a retention scope, sleep is a scope-state error.
    OK(flare_package_allocate_tagged(pool.get(), MiB, nullptr, 1, &p));
    OK(flare_retention_begin(pool.get()));
    STATUS(flare_pool_sleep(pool.get(), 1, FLARE_SLEEP_DISCARD), FLARE_STATUS_SCOPE_STATE);
    OK(flare_retention_finish(pool.get()));
    CHECK(census(pool.get(), 1).sleeping == 0);
    // A tag never used reads zeros.
    FlareTagCensus c = census(pool.get(), 77);
    CHECK(c.sleeping == 0 && c.live_count == 0 && c.physical_bytes == 0);
    // Destroyed asleep: the report counts the sleeping allocation live, no physical.
    OK(flare_pool_sleep(pool.get(), 1, FLARE_SLEEP_OFFLOAD));
    FlareDestroyReport r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    OK(flare_pool_destroy_report(pool.release(), &r));
    CHECK(r.live_count == 1 && r.live_requested_bytes == MiB && r.live_mapped_bytes == 2 * MiB &&
          r.physical_bytes == 0);
}

}  // namespace

int main() {
    std::fprintf(stderr, "flare-package tag tests (C++17)\n");
    test_whole_mappings();
    test_segments();
    test_wake_out_of_memory();
    test_injected_failures();
    test_errors();
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}

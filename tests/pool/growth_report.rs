//! `Pool::growth_report` on the simulated driver (issue 38): known calls give the
//! report their stamps imply, for every policy; allocations live through a thread
//! cache are counted with the step they were made in; the planted leak's calls on a
//! live pool give the report of its trace.

use crate::common::per_shape_leak::{self as leak, Op, CALLS};
use flare_package::growth::{GroupSize, GrowthOptions, StepKind};
use flare_package::{trace, Pool, PoolConfig, ReusePolicy, SimConfig};

const MIB: u64 = 1 << 20;

fn sim_pool(policy: ReusePolicy) -> Pool {
    Pool::new(PoolConfig::simulated(SimConfig::default()).with_policy(policy)).unwrap()
}

/// No markers, no scopes: steps of `step_events` allocations, counted exactly (no
/// thread cache serves outside a scope at the default release threshold). Every
/// third allocation of 40 (1 MiB each) is kept, the others freed: the kept ones
/// are allocations 0, 3, ..., 39 (14), in steps `i / 4` of 4 allocations: every
/// step from 0 to 9, two of them in steps 0, 3, 6 and 9.
#[test]
fn steps_of_n_allocations_are_exact_in_one_thread() {
    for policy in ReusePolicy::ALL {
        let pool = sim_pool(policy);
        let mut kept = Vec::new();
        for i in 0..40u64 {
            let p = pool.allocate_raw(MIB).unwrap();
            if i % 3 == 0 {
                kept.push(p);
            } else {
                pool.free_raw(p).unwrap();
            }
        }
        let options = GrowthOptions {
            step_events: 4,
            min_steps: 10,
        };
        let r = pool.growth_report(&options);
        assert_eq!(r.step_kind, StepKind::Events(4), "{policy:?}");
        assert_eq!((r.counts.allocations, r.steps), (40, 10), "{policy:?}");
        assert_eq!((r.live_count, r.live_bytes), (14, 14 * MIB), "{policy:?}");
        assert_eq!(r.groups.len(), 1);
        let g = r.groups[0];
        let steps: std::collections::BTreeSet<u64> =
            (0..40u64).filter(|i| i % 3 == 0).map(|i| i / 4).collect();
        assert_eq!(g.distinct_steps, steps.len() as u64);
        assert_eq!((g.size, g.count), (GroupSize::Bytes(MIB), 14));
        assert_eq!((g.first_step, g.last_step), (0, 9));
        // Allocations 0 and 3 in step 0: 12 gained over the 9 steps after it.
        assert_eq!((g.added_count, g.steps_after_first), (12, 9));
        // Steps 0 to 9: the last quarter is steps 7 to 9 (ceil(10 / 4) = 3).
        assert_eq!(r.final_quarter_from, 7);
        assert!(g.grows, "{policy:?}: {r}");
        for p in kept {
            pool.free_raw(p).unwrap();
        }
        assert_eq!(pool.growth_report(&options).live_count, 0);
    }
}

/// Scope begins make the steps when no marker was written; tags are groups of their
/// own.
#[test]
fn scopes_make_the_steps_and_tags_their_groups() {
    let pool = sim_pool(ReusePolicy::BestFit);
    for i in 0..5u64 {
        pool.retention_begin().unwrap();
        pool.allocate_tagged_raw(2 * MIB, None, 7).unwrap();
        let t = pool.allocate_raw(3 * MIB).unwrap();
        pool.free_raw(t).unwrap();
        if i == 4 {
            pool.allocate_raw(5 * MIB).unwrap();
        }
        pool.retention_finish().unwrap();
    }
    let r = pool.growth_report(&GrowthOptions {
        step_events: 1000,
        min_steps: 5,
    });
    assert_eq!((r.step_kind, r.steps), (StepKind::Scopes, 6));
    assert_eq!(r.counts.scopes, 5);
    let got: Vec<_> = r
        .groups
        .iter()
        .map(|g| (g.tag, g.size, g.count, g.first_step, g.last_step, g.grows))
        .collect();
    assert_eq!(
        got,
        vec![
            // Tag 7, one per scope, in steps 1 to 5: 5 distinct, the last in the
            // last quarter (step 5 of 0 to 5: ceil(6 / 4) = 2, from step 4).
            (7, GroupSize::Bytes(2 * MIB), 5, 1, 5, true),
            (0, GroupSize::NewEachStep { sizes: 1 }, 1, 5, 5, false),
        ]
    );
}

/// Memory handed out by a thread cache (a scope open: caches hold what is freed)
/// is in the report with the step it was made in, and keeps it when a scope's end
/// hands it to the books.
#[test]
fn allocations_live_through_a_thread_cache_keep_their_steps() {
    let pool = sim_pool(ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    let mut kept = Vec::new();
    // Made in step 0, from the books (then live through this thread's cache).
    let mut t = pool.allocate_raw(4 * MIB).unwrap();
    for _ in 0..40 {
        pool.mark_step();
        // Freed into this thread's cache, made in the step before: the next
        // allocation takes it back from the cache, stamped with this step.
        pool.free_raw(t).unwrap();
        kept.push(pool.allocate_raw(4 * MIB).unwrap());
        t = pool.allocate_raw(4 * MIB).unwrap();
    }
    pool.free_raw(t).unwrap();
    // A size the cache does not hold: made by the books, live through the cache.
    kept.push(pool.allocate_raw(8 * MIB).unwrap());
    let s = pool.snapshot();
    assert!(s.thread_cache_hits >= 39, "{s:?}");
    let check = |r: &flare_package::growth::GrowthReport| {
        assert_eq!(
            (r.step_kind, r.steps, r.live_count),
            (StepKind::Markers, 41, 41)
        );
        let g = r.groups[0];
        assert_eq!((g.size, g.count), (GroupSize::Bytes(4 * MIB), 40));
        assert_eq!((g.first_step, g.last_step, g.distinct_steps), (1, 40, 40));
        assert!(g.grows, "{r}");
        let g = r.groups[1];
        assert_eq!((g.size, g.count), (GroupSize::NewEachStep { sizes: 1 }, 1));
        assert_eq!((g.first_step, g.bytes), (40, 8 * MIB));
    };
    let open = pool.growth_report(&GrowthOptions::default());
    check(&open);
    pool.retention_finish().unwrap();
    let closed = pool.growth_report(&GrowthOptions::default());
    check(&closed);
    assert_eq!(open.groups, closed.groups);
    for p in kept {
        pool.free_raw(p).unwrap();
    }
}

/// The planted leak's calls on a live pool give exactly its trace's report, under
/// every policy (the report groups what callers asked for, whatever the pool made
/// of it).
#[test]
fn the_planted_leak_on_a_live_pool_is_its_traces_report() {
    let t = trace::parse_str("leak", &leak::trace_text()).unwrap();
    let options = GrowthOptions::default();
    let want = t.growth_report(&options);
    assert_eq!(want.growing().count(), 1);
    for policy in ReusePolicy::ALL {
        let pool = sim_pool(policy);
        let mut ptrs = std::collections::HashMap::new();
        for op in leak::workload() {
            match op {
                Op::Alloc(id, bytes) => {
                    ptrs.insert(id, pool.allocate_raw(bytes).unwrap());
                }
                Op::Free(id) => pool.free_raw(ptrs.remove(&id).unwrap()).unwrap(),
                Op::Step => pool.mark_step(),
            }
        }
        let got = pool.growth_report(&options);
        assert_eq!(got, want, "{policy:?}:\n{got}\n{want}");
        let g = got.growing().next().unwrap();
        assert_eq!(g.allocations_per_step(), 6.0);
        assert_eq!(g.steps_after_first, CALLS);
    }
}

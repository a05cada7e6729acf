//! The trace parser (`flare_package::trace::parse_reader`, what `flare-replay` runs
//! on a file or standard input) on arbitrary bytes: it parses or refuses, never
//! panics; a refusal is a one-line message of bounded length
//! (`docs/trace-format.md`: "a 100 MB line gives a one-line message"); a parsed
//! trace's figures hold together, and its growth report is made.
#![no_main]

use flare_package::trace::{parse_reader, Event};
use libfuzzer_sys::fuzz_target;

/// The longest refusal message taken as "clear", bytes: the file name, the line, the
/// problem and a quoted token of at most 40 characters.
const MAX_MESSAGE_BYTES: usize = 1024;

fuzz_target!(|data: &[u8]| {
    match parse_reader("fuzz.trace", data) {
        Ok(trace) => {
            assert_eq!(trace.lines().len(), trace.len(), "a line number per event");
            assert!(
                trace.lines().windows(2).all(|w| w[0] < w[1]),
                "events are in line order"
            );
            let allocations = trace
                .events()
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        Event::Alloc { .. } | Event::AllocTagged { .. } | Event::AllocAsync { .. }
                    )
                })
                .count();
            assert_eq!(trace.allocations(), allocations);
            // Every figure of a parsed trace is defined (none overflows).
            let granule = 2 << 20;
            assert!(trace.lower_bound_bytes(granule) <= trace.no_reuse_bytes(granule));
            let _ = trace.tags();
            // The growth report of any parsed trace is made (no overflow, no panic),
            // its text and JSON too.
            let report = trace.growth_report(&Default::default());
            assert!(report.live_count <= trace.allocations() as u64);
            let _ = (report.to_string(), report.to_json());
        }
        Err(e) => {
            let message = e.to_string();
            assert!(!message.contains('\n'), "a one-line message: {message:?}");
            assert!(
                message.len() <= MAX_MESSAGE_BYTES,
                "a message of {} bytes: {:?}...",
                message.len(),
                &message[..message.floor_char_boundary(200)]
            );
            assert!(
                e.line().is_some(),
                "a parse error names its line: {message}"
            );
        }
    }
});

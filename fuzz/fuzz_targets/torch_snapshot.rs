//! The PyTorch snapshot importer (`flare_tools::torch_snapshot::import`, what
//! `flare-replay` runs on a pickle) on arbitrary bytes, at both levels and with the
//! device chosen or not: it imports or refuses, never panics; a refusal is a
//! one-line message of bounded length; an import's trace parses
//! (`flare_package::trace::parse_str`) and has the `a` and `f` lines its summary
//! counts.
#![no_main]

use flare_tools::torch_snapshot::{import, Level, Options};
use libfuzzer_sys::fuzz_target;

/// The longest refusal message taken as "clear", bytes.
const MAX_MESSAGE_BYTES: usize = 1024;

fuzz_target!(|data: &[u8]| {
    for (level, device) in [
        (Level::Tensor, None),
        (Level::Segment, None),
        (Level::Tensor, Some(0)),
        (Level::Segment, Some(1)),
    ] {
        let options = Options { level, device };
        match import("fuzz.pickle", data, &options) {
            Ok(imported) => {
                let summary = &imported.summary;
                let trace = flare_package::trace::parse_str("imported", &imported.text)
                    .unwrap_or_else(|e| panic!("{options:?}: the imported trace: {e}"));
                let a = imported
                    .text
                    .lines()
                    .filter(|l| l.starts_with("a "))
                    .count();
                let f = imported
                    .text
                    .lines()
                    .filter(|l| l.starts_with("f "))
                    .count();
                assert_eq!(a as u64, summary.allocations, "{options:?}");
                assert_eq!(f as u64, summary.frees, "{options:?}");
                assert_eq!(trace.allocations() as u64, summary.allocations);
                assert!(summary.device < summary.devices, "{options:?}");
                assert!(summary.rounded_blocks <= summary.allocations, "{options:?}");
                // The peak is the trace's, every size taken as is (granularity 1).
                assert_eq!(trace.lower_bound_bytes(1), summary.peak_live_bytes);
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
            }
        }
    }
});

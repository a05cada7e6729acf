//! `--as-recorded`: a recorded trace replayed with its header's configuration, other
//! settings refused.

use crate::cli::{flare_replay, stderr, stdout};
use crate::{s, scratch};

/// `--as-recorded` replays with the header's configuration, and refuses the
/// options that would change it.
#[test]
fn as_recorded_uses_the_header_and_refuses_other_settings() {
    let recorded = scratch("recorded.trace", crate::RECORDED_EXACT);
    let o = flare_replay(&["--as-recorded", "--json", s(&recorded)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let row: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(row["policy"], "exact");
    // 3 MiB rounds up to two 2 MiB granules, live with the 2 MiB one: 6 MiB; the
    // 1 MiB comes after the 3 MiB's free (no scope: released), a handle of its own.
    assert_eq!(row["peak_physical_bytes"], 6 << 20);
    assert_eq!(row["mappings_created"], 3);
    for other in [
        &["--policy", "best-fit"][..],
        &["--capacity", "1GiB"],
        &["--backend", "sim"],
        &["--best-fit-waste-percent", "10"],
        &["--convert", "-"],
    ] {
        let mut args = vec!["--as-recorded"];
        args.extend_from_slice(other);
        args.push(s(&recorded));
        let o = flare_replay(&args);
        assert_eq!(o.status.code(), Some(2), "{other:?}");
        assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
        assert!(stdout(&o).is_empty());
    }
    // A trace without the header among recorded ones: refused before any replays
    // (no row of the first on the output).
    let plain = scratch(
        "plain.trace",
        "# flare-trace v1
a x 512
",
    );
    let o = flare_replay(&["--as-recorded", "--json", s(&recorded), s(&plain)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no `# flare-pool` header"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}

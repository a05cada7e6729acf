//! One list, many uses (issue 10): an enum's rows are written once, and the Rust
//! enum, the C ABI's enum and their name tables are generated from them; each
//! generator checks here, when the crate is built, that the rows are numbered in
//! order.

/// Whether `numbers` is `0, 1, 2, ...`: the rows of an enum's list (issue 10, "one
/// list, many uses") must be numbered in order from 0, because their `ALL` arrays are
/// indexed by number. Checked when the crate is built (`const _: () = assert!(..)`).
pub(crate) const fn numbered_from_zero(numbers: &[usize]) -> bool {
    let mut i = 0;
    while i < numbers.len() {
        if numbers[i] != i {
            return false;
        }
        i += 1;
    }
    true
}

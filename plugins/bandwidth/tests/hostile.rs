//! Hostile input for bandwidth, against the debug build. The table is `cni_tests::hostile::bandwidth`
//! (tests/src/hostile/bandwidth.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn bandwidth_refuses_hostile_input() {
    hostile::bandwidth::refuses_hostile_input(&bin_dir());
}

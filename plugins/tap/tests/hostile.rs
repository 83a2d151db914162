//! Hostile input for tap, against the debug build. The table is `cni_tests::hostile::tap`
//! (tests/src/hostile/tap.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn tap_refuses_hostile_input() {
    hostile::tap::refuses_hostile_input(&bin_dir());
}

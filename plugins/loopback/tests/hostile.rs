//! Hostile input for loopback, against the debug build. The table is `cni_tests::hostile::loopback`
//! (tests/src/hostile/loopback.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn loopback_refuses_hostile_input() {
    hostile::loopback::refuses_hostile_input(&bin_dir());
}

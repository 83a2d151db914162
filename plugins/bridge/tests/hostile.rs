//! Hostile input for bridge, against the debug build. The table is `cni_tests::hostile::bridge`
//! (tests/src/hostile/bridge.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn bridge_refuses_hostile_input() {
    hostile::bridge::refuses_hostile_input(&bin_dir());
}

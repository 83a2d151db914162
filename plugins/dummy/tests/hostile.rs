//! Hostile input for dummy, against the debug build. The table is `cni_tests::hostile::dummy`
//! (tests/src/hostile/dummy.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn dummy_refuses_hostile_input() {
    hostile::dummy::refuses_hostile_input(&bin_dir());
}

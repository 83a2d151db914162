//! Hostile input for tuning, against the debug build. The table is `cni_tests::hostile::tuning`
//! (tests/src/hostile/tuning.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn tuning_refuses_hostile_input() {
    hostile::tuning::refuses_hostile_input(&bin_dir());
}

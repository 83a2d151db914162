//! Hostile input for sbr, against the debug build. The table is `cni_tests::hostile::sbr`
//! (tests/src/hostile/sbr.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn sbr_refuses_hostile_input() {
    hostile::sbr::refuses_hostile_input(&bin_dir());
}

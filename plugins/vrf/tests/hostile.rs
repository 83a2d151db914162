//! Hostile input for vrf, against the debug build. The table is `cni_tests::hostile::vrf`
//! (tests/src/hostile/vrf.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn vrf_refuses_hostile_input() {
    hostile::vrf::refuses_hostile_input(&bin_dir());
}

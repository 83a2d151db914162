//! Hostile input for ipvlan, against the debug build. The table is `cni_tests::hostile::ipvlan`
//! (tests/src/hostile/ipvlan.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn ipvlan_refuses_hostile_input() {
    hostile::ipvlan::refuses_hostile_input(&bin_dir());
}

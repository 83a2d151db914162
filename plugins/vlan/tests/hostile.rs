//! Hostile input for vlan, against the debug build. The table is `cni_tests::hostile::vlan`
//! (tests/src/hostile/vlan.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn vlan_refuses_hostile_input() {
    hostile::vlan::refuses_hostile_input(&bin_dir());
}

//! Hostile input for macvlan, against the debug build. The table is `cni_tests::hostile::macvlan`
//! (tests/src/hostile/macvlan.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn macvlan_refuses_hostile_input() {
    hostile::macvlan::refuses_hostile_input(&bin_dir());
}

//! Hostile input for firewall, against the debug build. The table is `cni_tests::hostile::firewall`
//! (tests/src/hostile/firewall.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn firewall_refuses_hostile_input() {
    hostile::firewall::refuses_hostile_input(&bin_dir());
}

//! Hostile input for dhcp, against the debug build. The table is `cni_tests::hostile::dhcp`
//! (tests/src/hostile/dhcp.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn dhcp_refuses_hostile_input() {
    hostile::dhcp::refuses_hostile_input(&bin_dir());
}

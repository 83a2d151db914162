//! Hostile input for host-local, against the debug build. The table is `cni_tests::hostile::host_local`
//! (tests/src/hostile/host_local.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn host_local_refuses_hostile_input() {
    hostile::host_local::refuses_hostile_input(&bin_dir());
}

#[test]
fn host_local_never_follows_a_link_in_its_data_directory() {
    hostile::host_local::never_follows_a_link_in_its_data_directory(&bin_dir());
}

//! Hostile input for portmap, against the debug build. The table is `cni_tests::hostile::portmap`
//! (tests/src/hostile/portmap.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn portmap_refuses_hostile_input() {
    hostile::portmap::refuses_hostile_input(&bin_dir());
}

#[test]
fn portmap_refuses_a_held_host_port() {
    hostile::portmap::refuses_a_held_host_port(&bin_dir());
}

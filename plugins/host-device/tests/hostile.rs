//! Hostile input for host-device, against the debug build. The table is `cni_tests::hostile::host_device`
//! (tests/src/hostile/host_device.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn host_device_refuses_hostile_input() {
    hostile::host_device::refuses_hostile_input(&bin_dir());
}

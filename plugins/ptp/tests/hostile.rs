//! Hostile input for ptp, against the debug build. The table is `cni_tests::hostile::ptp`
//! (tests/src/hostile/ptp.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn ptp_refuses_hostile_input() {
    hostile::ptp::refuses_hostile_input(&bin_dir());
}

//! Hostile input for static, against the debug build. The table is `cni_tests::hostile::r#static`
//! (tests/src/hostile/static.rs), where `tests/tests/hostile.rs` runs it against the shipped static binary too.

use cni_tests::{bin_dir, hostile};

#[test]
fn static_refuses_hostile_input() {
    hostile::r#static::refuses_hostile_input(&bin_dir());
}

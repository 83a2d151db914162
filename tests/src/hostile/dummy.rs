//! dummy's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/dummy/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, netns_cases, run_table, with, without, Case, Fixture, CONFIG};
use serde_json::json;
use std::path::Path;

/// The rows of dummy's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("dummy");
    vec![
        case("no ipam", without(&b, "ipam"), CONFIG),
        case("ipam without a type", with(&b, "ipam", json!({})), CONFIG),
        case("ipam.type empty", with(&b, "ipam", json!({ "type": "" })), CONFIG),
        case("ipam.type a path", with(&b, "ipam", json!({ "type": "../host-local" })), CONFIG),
    ]
}

/// Every row of dummy's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "dummy");
    cases.extend(netns_cases(&f, "dummy"));
    cases.extend(rows(&f));
    run_table(&f, "dummy", &cases);
}

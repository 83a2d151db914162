//! ptp's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/ptp/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, netns_cases, run_table, with, without, Case, Fixture, CONFIG};
use serde_json::json;
use std::path::Path;

/// The rows of ptp's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("ptp");
    vec![
        case("mtu 40", with(&b, "mtu", json!(40)), CONFIG),
        case("mtu 70000", with(&b, "mtu", json!(70000)), CONFIG),
        case("mtu negative", with(&b, "mtu", json!(-1)), CONFIG),
        case("mtu a string", with(&b, "mtu", json!("1500")), CONFIG),
        case("ipMasq a number", with(&b, "ipMasq", json!(1)), CONFIG),
        case("ipMasqBackend unknown", with(&b, "ipMasqBackend", json!("pf")), CONFIG),
        case("ipMasqBackend a number", with(&b, "ipMasqBackend", json!(1)), CONFIG),
        case("no ipam", without(&b, "ipam"), CONFIG),
        case("ipam without a type", with(&b, "ipam", json!({ "dataDir": f.data_dir() })), CONFIG),
        case("ipam.type a path", with(&b, "ipam", json!({ "type": "../../bin/sh" })), CONFIG),
        case("ipam.type a main plugin", with(&b, "ipam", json!({ "type": "ptp" })), CONFIG),
        case("ipam.type not in CNI_PATH", with(&b, "ipam", json!({ "type": "no-such-ipam" })), CONFIG),
    ]
}

/// Every row of ptp's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "ptp");
    cases.extend(netns_cases(&f, "ptp"));
    cases.extend(rows(&f));
    run_table(&f, "ptp", &cases);
}

//! ipvlan's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/ipvlan/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, sublink, with, without, Case, Fixture, CONFIG};
use serde_json::json;
use std::path::Path;

/// The rows of ipvlan's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("ipvlan");
    let mut cases = sublink::rows(f, "ipvlan");
    cases.extend([
        case("mode l2 in upper case", with(&b, "mode", json!("L2")), CONFIG),
        case("no ipam and no prevResult", without(&b, "ipam"), CONFIG),
        case(
            "no master and a prevResult with two interfaces",
            {
                let mut v = b.clone();
                v.as_object_mut().unwrap().remove("master");
                v["prevResult"] = json!({ "cniVersion": "1.0.0", "interfaces": [{ "name": "a" }, { "name": "b" }] });
                v.to_string().into_bytes()
            },
            CONFIG,
        ),
        case(
            "no master and prevResult's interface not a valid name",
            {
                let mut v = b.clone();
                v.as_object_mut().unwrap().remove("master");
                v["prevResult"] = json!({ "cniVersion": "1.0.0", "interfaces": [{ "name": "../x" }] });
                v.to_string().into_bytes()
            },
            CONFIG,
        ),
    ]);
    cases
}

/// Every row of ipvlan's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    sublink::table(bins, "ipvlan", rows);
}

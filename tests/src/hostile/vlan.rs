//! vlan's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/vlan/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, netns_cases, run_table, with, without, Case, Fixture, CONFIG};
use serde_json::json;
use std::path::Path;

/// The rows of vlan's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("vlan");
    let mut cases = vec![
        case("no master", without(&b, "master"), CONFIG),
        case("master names no interface", with(&b, "master", json!("nosuch0")), CONFIG),
        case("no ipam", without(&b, "ipam"), CONFIG),
        case("ipam.type a path", with(&b, "ipam", json!({ "type": "../host-local" })), CONFIG),
    ];
    for (key, bad) in [
        ("master", json!("")),
        ("master", json!(5)),
        ("master", json!("a/b")),
        ("master", json!("0123456789abcdef")),
        ("vlanId", json!(-1)),
        ("vlanId", json!(4095)),
        ("vlanId", json!("10")),
        ("vlanId", json!(1.5)),
        ("mtu", json!(-1)),
        ("mtu", json!(67)),
        ("mtu", json!(70000)),
        ("mtu", json!("1500")),
        ("linkInContainer", json!(1)),
        ("linkInContainer", json!("yes")),
    ] {
        cases.push(case(format!("{key} {bad}"), with(&b, key, bad), CONFIG));
    }
    cases
}

/// Every row of vlan's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "vlan");
    cases.extend(netns_cases(&f, "vlan"));
    cases.extend(rows(&f));
    run_table(&f, "vlan", &cases);
}

//! vrf's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/vrf/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, netns_cases, run_table, with, without, Case, Fixture, CONFIG, VERSION};
use serde_json::json;
use std::path::Path;

/// The rows of vrf's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("vrf");
    let mut cases = vec![
        case("no vrfname", without(&b, "vrfname"), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
        case("cniVersion 0.3.0 (vrf speaks 0.3.1 and later)", with(&b, "cniVersion", json!("0.3.0")), VERSION),
    ];
    for (key, bad) in [
        ("vrfname", json!("")),
        ("vrfname", json!(5)),
        ("vrfname", json!("a/b")),
        ("vrfname", json!("0123456789abcdef")),
        ("table", json!(-1)),
        ("table", json!(254)),
        ("table", json!(255)),
        ("table", json!(4_294_967_296u64)),
        ("table", json!("10")),
    ] {
        cases.push(case(format!("{key} {bad}"), with(&b, key, bad), CONFIG));
    }
    cases
}

/// Every row of vrf's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "vrf");
    cases.extend(netns_cases(&f, "vrf"));
    cases.extend(rows(&f));
    run_table(&f, "vrf", &cases);
}

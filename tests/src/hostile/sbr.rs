//! sbr's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/sbr/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, netns_cases, run_table, with, without, Case, Fixture, CONFIG};
use serde_json::json;
use std::path::Path;

/// The rows of sbr's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("sbr");
    vec![
        case("table 0", with(&b, "table", json!(0)), CONFIG),
        case("table 254 (main)", with(&b, "table", json!(254)), CONFIG),
        case("table 255 (local)", with(&b, "table", json!(255)), CONFIG),
        case("table -1", with(&b, "table", json!(-1)), CONFIG),
        case("table 2^32", with(&b, "table", json!(4_294_967_296u64)), CONFIG),
        case("table a string", with(&b, "table", json!("100")), CONFIG),
        case("gateways a string", with(&b, "gateways", json!("10.210.3.1")), CONFIG),
        case("gateways not IPs", with(&b, "gateways", json!(["gw.example.com"])), CONFIG),
        case("gateways two IPv4", with(&b, "gateways", json!(["10.210.3.1", "10.210.3.254"])), CONFIG),
        case("gateways three", with(&b, "gateways", json!(["10.210.3.1", "fd00::1", "fd00::2"])), CONFIG),
        case("addSourceHints a number", with(&b, "addSourceHints", json!(1)), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
        case(
            "prevResult without addresses for the interface",
            with(
                &b,
                "prevResult",
                json!({ "cniVersion": "1.0.0", "interfaces": [{ "name": "eth9" }],
                        "ips": [{ "address": "10.210.3.2/24", "interface": 0 }] }),
            ),
            CONFIG,
        ),
    ]
}

/// Every row of sbr's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "sbr");
    cases.extend(netns_cases(&f, "sbr"));
    cases.extend(rows(&f));
    run_table(&f, "sbr", &cases);
    let rules = String::from_utf8_lossy(&f.pod.exec("ip", &["rule"]).stdout).into_owned();
    assert!(!rules.contains("10.210.3.2"), "sbr left a rule in the pod:\n{rules}");
}

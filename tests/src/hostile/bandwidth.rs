//! bandwidth's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/bandwidth/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, run_table, with, without, without_keys, Case, Fixture, CONFIG, VERSION};
use crate::run;
use serde_json::json;
use serde_json::Value;
use std::path::Path;

/// The rows of bandwidth's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("bandwidth");
    let rt = |v: Value| {
        with(
            &without_keys(&b, &["ingressRate", "ingressBurst", "egressRate", "egressBurst"]),
            "runtimeConfig",
            json!({ "bandwidth": v }),
        )
    };
    vec![
        case("ingressRate without ingressBurst", with(&b, "ingressBurst", json!(0)), CONFIG),
        case("egressBurst without egressRate", with(&b, "egressRate", json!(0)), CONFIG),
        case("ingressRate negative", with(&b, "ingressRate", json!(-8000)), CONFIG),
        case("ingressRate a string", with(&b, "ingressRate", json!("8Mbit")), CONFIG),
        case("ingressRate a float", with(&b, "ingressRate", json!(8.5)), CONFIG),
        case("ingressRate beyond u64", with(&b, "ingressRate", json!(1e30)), CONFIG),
        case("egressBurst of 4 GB", with(&b, "egressBurst", json!(40_000_000_000u64)), CONFIG),
        case("egressRate below 8 bits/s", with(&b, "egressRate", json!(7)), CONFIG),
        case("a bucket longer than the kernel's ticks", with(&b, "egressRate", json!(8)), CONFIG),
        case("unshapedSubnets (reverted upstream)", with(&b, "unshapedSubnets", json!(["10.0.0.0/8"])), CONFIG),
        case("shapedSubnets a string", with(&b, "shapedSubnets", json!("10.0.0.0/8")), CONFIG),
        case("runtimeConfig.bandwidth a string", rt(json!("8Mbit")), CONFIG),
        case("runtimeConfig.bandwidth rate without burst", rt(json!({ "IngressRate": 8000 })), CONFIG),
        case("runtimeConfig.bandwidth negative", rt(json!({ "egressRate": -1, "egressBurst": 8 })), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
        case(
            "cniVersion 0.2.0 (the reference starts at 0.3.0)",
            with(&without_keys(&b, &["prevResult"]), "cniVersion", json!("0.2.0")),
            VERSION,
        ),
    ]
}

/// Every row of bandwidth's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "bandwidth");
    cases.extend(rows(&f));
    run_table(&f, "bandwidth", &cases);
    let links = String::from_utf8_lossy(&run("ip", &["-o", "-d", "link", "show", "type", "ifb"]).stdout).into_owned();
    assert!(!links.contains(&f.network), "bandwidth left an ifb of the network:\n{links}");
}

//! tap's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/tap/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, env_case, netns_cases, run_table, with, Case, Fixture, CONFIG};
use serde_json::json;
use std::path::Path;

/// The rows of tap's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("tap");
    let mut cases = vec![
        case("bridge names no bridge in the pod", with(&b, "bridge", json!("nosuch0")), CONFIG),
        case("ipam.type a path", with(&b, "ipam", json!({ "type": "../host-local" })), CONFIG),
        case("runtimeConfig.mac not a MAC", with(&b, "runtimeConfig", json!({ "mac": "nope" })), CONFIG),
        case("runtimeConfig.mac a number", with(&b, "runtimeConfig", json!({ "mac": 5 })), CONFIG),
        env_case("CNI_ARGS MAC not a MAC", &b, vec![("CNI_ARGS", Some("MAC=zz".to_string()))], CONFIG),
    ];
    for (key, bad) in [
        ("mac", json!("0a:58")),
        ("mac", json!("01:00:5e:00:00:01")),
        ("mac", json!(5)),
        ("mtu", json!(-1)),
        ("mtu", json!(67)),
        ("mtu", json!(70000)),
        ("mtu", json!("1500")),
        ("multiQueue", json!(1)),
        ("owner", json!(-1)),
        ("owner", json!("root")),
        ("group", json!(4_294_967_296u64)),
        ("bridge", json!("a/b")),
        ("bridge", json!(5)),
        ("selinuxContext", json!(5)),
    ] {
        cases.push(case(format!("{key} {bad}"), with(&b, key, bad), CONFIG));
    }
    cases
}

/// Every row of tap's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "tap");
    cases.extend(netns_cases(&f, "tap"));
    cases.extend(rows(&f));
    run_table(&f, "tap", &cases);
}

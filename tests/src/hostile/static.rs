//! static's hostile-input table: its rows and the test that runs them, against the debug build in
//! `ipam/static/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, env_case, env_for, exec, run_table, with, with_value, Case, Fixture, CONFIG, ENV};
use serde_json::json;
use serde_json::Value;
use std::path::Path;

/// The rows of static's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("static");
    let addr = |a: Value| with(&b, "ipam", json!({ "type": "static", "addresses": [a] }));
    let ipam = |k: &str, v: Value| with(&b, &format!("ipam.{k}"), v);
    let args_env = |v: &str| vec![("CNI_ARGS", Some(v.to_string()))];
    vec![
        case("address without a prefix", addr(json!({ "address": "10.210.5.2" })), CONFIG),
        case("address not an IP", addr(json!({ "address": "banana/24" })), CONFIG),
        case("address prefix 33", addr(json!({ "address": "10.210.5.2/33" })), CONFIG),
        case("address a number", addr(json!({ "address": 5 })), CONFIG),
        case("address missing", addr(json!({ "gateway": "10.210.5.1" })), CONFIG),
        case("gateway not an IP", addr(json!({ "address": "10.210.5.2/24", "gateway": "x" })), CONFIG),
        case("gateway of the other family", addr(json!({ "address": "10.210.5.2/24", "gateway": "fd00::1" })), CONFIG),
        case(
            "the same address twice",
            ipam("addresses", json!([{ "address": "10.210.5.2/24" }, { "address": "10.210.5.2/16" }])),
            CONFIG,
        ),
        case("addresses an object", ipam("addresses", json!({ "address": "10.210.5.2/24" })), CONFIG),
        case("routes a string", ipam("routes", json!("0.0.0.0/0")), CONFIG),
        case("route dst not a CIDR", ipam("routes", json!([{ "dst": "banana" }])), CONFIG),
        case("route gw not an IP", ipam("routes", json!([{ "dst": "0.0.0.0/0", "gw": "x" }])), CONFIG),
        case("ipam.dns a number", ipam("dns", json!(5)), CONFIG),
        case("runtimeConfig.ips not CIDRs", with(&b, "runtimeConfig", json!({ "ips": ["10.210.5.9"] })), CONFIG),
        case("runtimeConfig.ips a string", with(&b, "runtimeConfig", json!({ "ips": "10.210.5.9/24" })), CONFIG),
        case("args.cni.ips of numbers", with(&b, "args", json!({ "cni": { "ips": [5] } })), CONFIG),
        case(
            "two IPv4 addresses on 0.2.0",
            with(
                &with_value(&b, "cniVersion", json!("0.2.0")),
                "ipam.addresses",
                json!([{ "address": "10.210.5.2/24" }, { "address": "10.210.6.2/24" }]),
            ),
            CONFIG,
        ),
        env_case("CNI_ARGS IP without a prefix", &b, args_env("IP=10.210.5.9"), ENV),
        env_case("CNI_ARGS GATEWAY not an IP", &b, args_env("IP=10.210.5.9/24;GATEWAY=x"), ENV),
    ]
}

/// Every row of static's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "static");
    cases.extend(rows(&f));
    run_table(&f, "static", &cases);
    // DEL has nothing to release: it succeeds on every row that names an attachment.
    let mut failures = Vec::new();
    for c in rows(&f) {
        let ran = exec(&f.bins.join("static"), &[], &env_for(&f, &c, "DEL"), &c.stdin);
        if ran.exit != Some(0) {
            failures.push(format!("static DEL: {}: {} {}", c.label, ran.stdout, ran.stderr));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

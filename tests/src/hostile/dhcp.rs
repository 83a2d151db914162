//! dhcp's hostile-input table: its rows and the test that runs them, against the debug build in
//! `ipam/dhcp/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{
    case, check_error, common_cases, env_case, env_for, exec, run_table, with, with_value, Case, Fixture, CONFIG, ENV,
};
use serde_json::json;
use serde_json::Value;
use std::path::Path;

/// The rows of dhcp's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("dhcp");
    let ipam = |k: &str, v: Value| with(&b, &format!("ipam.{k}"), v);
    vec![
        case("daemonSocketPath relative", ipam("daemonSocketPath", json!("run/dhcp.sock")), CONFIG),
        case("daemonSocketPath a number", ipam("daemonSocketPath", json!(5)), CONFIG),
        case("request a string", ipam("request", json!("routers")), CONFIG),
        case("request an object", ipam("request", json!({ "option": "routers" })), CONFIG),
        case("request option unknown", ipam("request", json!([{ "option": "nosuch-option" }])), CONFIG),
        case("request option 256", ipam("request", json!([{ "option": "256" }])), CONFIG),
        case("request option -1", ipam("request", json!([{ "option": "-1" }])), CONFIG),
        case("request option a number", ipam("request", json!([{ "option": 3 }])), CONFIG),
        case("request skipDefault a string", ipam("request", json!([{ "skipDefault": "true" }])), CONFIG),
        case("provide without option", ipam("provide", json!([{ "value": "x" }])), CONFIG),
        case(
            "provide value of 256 bytes",
            ipam("provide", json!([{ "option": "host-name", "value": "x".repeat(256) }])),
            CONFIG,
        ),
        case("provide value a number", ipam("provide", json!([{ "option": "host-name", "value": 5 }])), CONFIG),
        case("provide fromArg a list", ipam("provide", json!([{ "option": "host-name", "fromArg": ["A"] }])), CONFIG),
        env_case(
            "provide fromArg naming a CNI_ARGS value of 256 bytes",
            &with_value(&b, "ipam", json!({ "type": "dhcp", "provide": [{ "option": "12", "fromArg": "HOST" }] })),
            vec![("CNI_ARGS", Some(format!("HOST={}", "h".repeat(256))))],
            ENV,
        ),
        case("suppress unknown", ipam("suppress", json!(["dns"])), CONFIG),
        case("suppress a string", ipam("suppress", json!("gateway")), CONFIG),
    ]
}

/// Every row of dhcp's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "dhcp");
    cases.extend(rows(&f));
    run_table(&f, "dhcp", &cases);
    // DEL releases through the daemon; with none running nothing is held, and DEL succeeds on
    // every row that names an attachment.
    let mut failures = Vec::new();
    for c in rows(&f) {
        let ran = exec(&f.bins.join("dhcp"), &[], &env_for(&f, &c, "DEL"), &c.stdin);
        if ran.exit != Some(0) {
            failures.push(format!("dhcp DEL: {}: {} {}", c.label, ran.stdout, ran.stderr));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // STATUS without a daemon: code 50, naming the socket.
    let status = with_value(&f.base("dhcp"), "cniVersion", json!("1.1.0"));
    let ran = exec(&f.bins.join("dhcp"), &[], &f.env("STATUS"), status.to_string().as_bytes());
    check_error(&ran, 50).unwrap();
    assert!(ran.stdout.contains("no-daemon.sock"), "{}", ran.stdout);
}

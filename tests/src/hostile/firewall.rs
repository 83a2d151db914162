//! firewall's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/firewall/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{
    case, check_error, common_cases, env_for, exec, with, with_value, without, Case, Fixture, CONFIG, VERSION,
};
use crate::Netns;
use serde_json::json;
use std::path::Path;

/// The rows of firewall's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("firewall");
    let bridge_named = |name: &str| {
        let mut prev = f.prev_result();
        prev["interfaces"] = json!([{ "name": name }, { "name": "eth0", "sandbox": f.pod.path }]);
        prev["ips"][0]["interface"] = json!(1);
        with(&with_value(&b, "ingressPolicy", json!("same-bridge")), "prevResult", prev)
    };
    vec![
        case("backend firewalld (not built)", with(&b, "backend", json!("firewalld")), CONFIG),
        case("backend unknown", with(&b, "backend", json!("pf")), CONFIG),
        case("backend a number", with(&b, "backend", json!(1)), CONFIG),
        case("iptablesAdminChainName with shell text", with(&b, "iptablesAdminChainName", json!("X;reboot")), CONFIG),
        case(
            "iptablesAdminChainName a restore line",
            with(&b, "iptablesAdminChainName", json!("X\n-F FORWARD")),
            CONFIG,
        ),
        case("iptablesAdminChainName an option", with(&b, "iptablesAdminChainName", json!("-j")), CONFIG),
        case("iptablesAdminChainName FORWARD", with(&b, "iptablesAdminChainName", json!("FORWARD")), CONFIG),
        case("iptablesAdminChainName PREROUTING", with(&b, "iptablesAdminChainName", json!("PREROUTING")), CONFIG),
        case("iptablesAdminChainName a verdict", with(&b, "iptablesAdminChainName", json!("QUEUE")), CONFIG),
        case("iptablesAdminChainName a target", with(&b, "iptablesAdminChainName", json!("REJECT")), CONFIG),
        case("iptablesAdminChainName NFQUEUE", with(&b, "iptablesAdminChainName", json!("NFQUEUE")), CONFIG),
        case("iptablesAdminChainName an IPv6 target", with(&b, "iptablesAdminChainName", json!("HL")), CONFIG),
        case(
            "iptablesAdminChainName the plugin's own chain",
            with(&b, "iptablesAdminChainName", json!("CNI-ISOLATION-STAGE-1")),
            CONFIG,
        ),
        case("iptablesAdminChainName starting with '!'", with(&b, "iptablesAdminChainName", json!("!X")), CONFIG),
        case("iptablesAdminChainName 29 characters", with(&b, "iptablesAdminChainName", json!("A".repeat(29))), CONFIG),
        case("iptablesAdminChainName a number", with(&b, "iptablesAdminChainName", json!(5)), CONFIG),
        case("ingressPolicy unknown", with(&b, "ingressPolicy", json!("closed")), CONFIG),
        case("ingressPolicy a boolean", with(&b, "ingressPolicy", json!(true)), CONFIG),
        case(
            "same-bridge with no interface",
            {
                let mut prev = f.prev_result();
                prev["interfaces"] = json!([]);
                prev["ips"][0].as_object_mut().expect("ip").remove("interface");
                with(&with_value(&b, "ingressPolicy", json!("same-bridge")), "prevResult", prev)
            },
            CONFIG,
        ),
        case("same-bridge with a bridge name holding rule text", bridge_named("br0 -j ACCEPT"), CONFIG),
        case("same-bridge with a bridge name of 16 bytes", bridge_named("b123456789abcdef"), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
        case(
            "cniVersion 0.3.1 (the reference speaks 0.4.0 and later)",
            with(&b, "cniVersion", json!("0.3.1")),
            VERSION,
        ),
    ]
}

/// firewall's rows run in a namespace standing in for the node, so a row that wrongly succeeded
/// would not touch the host's FORWARD chain; none may leave a rule there either. DEL with keys that
/// no longer validate still succeeds.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let node = Netns::new("cnhf");
    let bin = f.bins.join("firewall").display().to_string();
    let mut cases = common_cases(&f, "firewall");
    cases.extend(rows(&f));
    let mut failures = Vec::new();
    for c in &cases {
        let ran = exec(Path::new("ip"), &["netns", "exec", &node.name, &bin], &env_for(&f, c, "ADD"), &c.stdin);
        if let Err(why) = check_error(&ran, c.want) {
            failures.push(format!("firewall: {}: {why}", c.label));
        }
    }
    let base = f.base("firewall");
    for (label, stdin) in [
        ("backend unknown", with(&base, "backend", json!("pf"))),
        ("ingressPolicy unknown", with(&base, "ingressPolicy", json!("closed"))),
        ("iptablesAdminChainName with shell text", with(&base, "iptablesAdminChainName", json!("X;reboot"))),
        ("no prevResult", without(&base, "prevResult")),
    ] {
        let c = case(label, stdin, 0);
        let ran = exec(Path::new("ip"), &["netns", "exec", &node.name, &bin], &env_for(&f, &c, "DEL"), &c.stdin);
        if ran.exit != Some(0) {
            failures.push(format!("firewall DEL: {label}: failed: {} {}", ran.stdout, ran.stderr));
        }
    }
    let rules = node.sh("iptables-save", &[]);
    assert!(!rules.contains("10.210.3.2"), "firewall left a rule for the pod:\n{rules}");
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

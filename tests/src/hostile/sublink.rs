//! The keys macvlan and ipvlan share, and the run of their tables with a master made for it.

use super::{case, common_cases, netns_cases, run_table, with, Case, Fixture, CONFIG};
use crate::{run, LinkGuard};
use serde_json::json;
use std::path::Path;

/// The keys macvlan and ipvlan share (`master`, `mode`, `mtu`, `linkInContainer`), with a real
/// master of MTU 1500 in the base config.
pub fn rows(f: &Fixture, plugin: &str) -> Vec<Case> {
    let b = f.base(plugin);
    vec![
        case("mode unknown", with(&b, "mode", json!("l4-bridge")), CONFIG),
        case("mode in upper case", with(&b, "mode", json!("BRIDGE")), CONFIG),
        case("mode a number", with(&b, "mode", json!(1)), CONFIG),
        case("master with /", with(&b, "master", json!("a/b")), CONFIG),
        case("master over 15 bytes", with(&b, "master", json!("0123456789abcdef")), CONFIG),
        case("master with a space", with(&b, "master", json!("eth 0")), CONFIG),
        case("master a number", with(&b, "master", json!(5)), CONFIG),
        case("master that does not exist", with(&b, "master", json!("nosuchmaster0")), CONFIG),
        case("mtu -1", with(&b, "mtu", json!(-1)), CONFIG),
        case("mtu 67", with(&b, "mtu", json!(67)), CONFIG),
        case("mtu 65536", with(&b, "mtu", json!(65536)), CONFIG),
        case("mtu a string", with(&b, "mtu", json!("1500")), CONFIG),
        case("mtu above the master's 1500", with(&b, "mtu", json!(9000)), CONFIG),
        case("linkInContainer a number", with(&b, "linkInContainer", json!(1)), CONFIG),
        case("linkInContainer with the master on the host", with(&b, "linkInContainer", json!(true)), CONFIG),
    ]
}

/// Runs the macvlan or ipvlan table with its master made for it.
pub fn table(bins: &Path, plugin: &str, rows: fn(&Fixture) -> Vec<Case>) {
    let f = Fixture::new(bins);
    let master = f.master();
    let peer = format!("{master}p");
    let out = run("ip", &["link", "add", &master, "type", "veth", "peer", "name", &peer]);
    assert!(out.status.success(), "create master {master}: {}", String::from_utf8_lossy(&out.stderr));
    let _master = LinkGuard(master.clone());
    for l in [&master, &peer] {
        assert!(run("ip", &["link", "set", l, "up"]).status.success());
    }
    let mut all = common_cases(&f, plugin);
    all.extend(netns_cases(&f, plugin));
    all.extend(rows(&f));
    run_table(&f, plugin, &all);
    let uppers = String::from_utf8_lossy(&run("ip", &["-o", "link", "show", "type", plugin]).stdout).into_owned();
    assert!(!uppers.contains(&format!("@{master}")), "{plugin} left a link on the master:\n{uppers}");
}

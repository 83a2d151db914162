//! portmap's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/portmap/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, check_error, common_cases, exec, run_table, with, without, Case, Fixture, CONFIG};
use crate::{run, Netns};
use serde_json::json;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// The rows of portmap's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("portmap");
    let maps = |m: Value| with(&b, "runtimeConfig", json!({ "portMappings": m }));
    let one = |k: &str, v: Value| {
        let mut m = json!({ "hostPort": 18080, "containerPort": 80, "protocol": "tcp" });
        m[k] = v;
        maps(json!([m]))
    };
    vec![
        case("hostPort 0", one("hostPort", json!(0)), CONFIG),
        case("hostPort 65536", one("hostPort", json!(65536)), CONFIG),
        case("hostPort -1", one("hostPort", json!(-1)), CONFIG),
        case("hostPort huge", one("hostPort", json!(1e20)), CONFIG),
        case("hostPort a string", one("hostPort", json!("80")), CONFIG),
        case("containerPort 0", one("containerPort", json!(0)), CONFIG),
        case("containerPort 70000", one("containerPort", json!(70000)), CONFIG),
        case("protocol unknown", one("protocol", json!("icmp")), CONFIG),
        case("protocol with shell text", one("protocol", json!("tcp;reboot")), CONFIG),
        case("protocol a number", one("protocol", json!(6)), CONFIG),
        case("hostIP not an IP", one("hostIP", json!("example.com")), CONFIG),
        case("hostIP a number", one("hostIP", json!(5)), CONFIG),
        case("portMappings a string", maps(json!("8080:80")), CONFIG),
        case("portMappings of numbers", maps(json!([8080])), CONFIG),
        case("a mapping as an array of its fields", maps(json!([[18080, 80, "tcp", ""]])), CONFIG),
        case("snat a number", with(&b, "snat", json!(2)), CONFIG),
        case("masqAll a string", with(&b, "masqAll", json!("yes")), CONFIG),
        case("markMasqBit 32", with(&b, "markMasqBit", json!(32)), CONFIG),
        case("markMasqBit -1", with(&b, "markMasqBit", json!(-1)), CONFIG),
        case("markMasqBit a string", with(&b, "markMasqBit", json!("13")), CONFIG),
        case("backend unknown", with(&b, "backend", json!("pf")), CONFIG),
        case("backend a number", with(&b, "backend", json!(5)), CONFIG),
        case("externalSetMarkChain a number", with(&b, "externalSetMarkChain", json!(5)), CONFIG),
        case("conditionsV4 a string", with(&b, "conditionsV4", json!("ip saddr 1.2.3.4")), CONFIG),
        case("conditionsV4 with ;", with(&b, "conditionsV4", json!(["ip saddr 1.2.3.4; flush ruleset"])), CONFIG),
        case("conditionsV6 with a newline", with(&b, "conditionsV6", json!(["ip6 saddr ::1\nflush ruleset"])), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
    ]
}

/// Every row of portmap's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "portmap");
    cases.extend(rows(&f));
    run_table(&f, "portmap", &cases);
    let nft = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
    assert!(!nft.contains("10.210.3.2"), "portmap left a rule for the pod:\n{nft}");
}

/// A host port another container holds is refused on both backends: code 100 naming the port,
/// and the refused ADD adds no rule. The plugin runs in a namespace of its own (the "node"), so
/// the host's rulesets are not touched.
pub fn refuses_a_held_host_port(bins: &Path) {
    let f = Fixture::new(bins);
    let node = Netns::new("cnhn");
    let ruleset = || {
        let out = run("sh", &["-c", &format!("ip netns exec {} nft -s list ruleset", node.name)]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for backend in ["nftables", "iptables"] {
        let mut conf = f.base("portmap");
        conf["backend"] = json!(backend);
        let conf = conf.to_string();
        let (holder, other) = (f.env("ADD"), f.env("ADD"));
        let portmap = f.bins.join("portmap").display().to_string();
        let in_node = |env: &BTreeMap<String, String>| {
            exec(Path::new("ip"), &["netns", "exec", &node.name, &portmap], env, conf.as_bytes())
        };
        let ran = in_node(&holder);
        assert_eq!(ran.exit, Some(0), "{backend}: the holder's ADD: {} {}", ran.stdout, ran.stderr);
        let before = ruleset();
        let ran = in_node(&other);
        if let Err(why) = check_error(&ran, 100) {
            panic!("{backend}: a held host port: {why}");
        }
        assert!(ran.stdout.contains("host port 18080/tcp"), "{backend}: {}", ran.stdout);
        assert_eq!(ruleset(), before, "{backend}: the refused ADD left rules");
        let mut del = holder.clone();
        del.insert("CNI_COMMAND".into(), "DEL".into());
        let ran = in_node(&del);
        assert_eq!(ran.exit, Some(0), "{backend}: the holder's DEL: {} {}", ran.stdout, ran.stderr);
    }
}

//! tuning's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/tuning/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, env_case, netns_cases, run_table, with, without, Case, Fixture, CONFIG};
use serde_json::json;
use std::path::Path;

/// The rows of tuning's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("tuning");
    let sysctl = |k: &str| with(&b, "sysctl", json!({ k: "1" }));
    let mut cases = vec![
        case("sysctl kernel.hostname", sysctl("kernel.hostname"), CONFIG),
        case("sysctl kernel/core_pattern", sysctl("kernel/core_pattern"), CONFIG),
        case("sysctl net/../kernel/hostname", sysctl("net/../kernel/hostname"), CONFIG),
        case("sysctl net.ipv4.conf.IFNAME.../../../..", sysctl("net.ipv4.conf.IFNAME.../../../.."), CONFIG),
        case("sysctl net/core/../../vm/swappiness", sysctl("net/core/../../vm/swappiness"), CONFIG),
        case("sysctl /proc/sys/net/core/somaxconn", sysctl("/proc/sys/net/core/somaxconn"), CONFIG),
        case("sysctl net//core", sysctl("net//core"), CONFIG),
        case("sysctl net alone", sysctl("net"), CONFIG),
        case("sysctl empty key", sysctl(""), CONFIG),
        case("sysctl key with NUL", sysctl("net.core\u{0}x"), CONFIG),
        case("sysctl value a number", with(&b, "sysctl", json!({ "net.core.somaxconn": 5 })), CONFIG),
        case("sysctl value with NUL", with(&b, "sysctl", json!({ "net.core.somaxconn": "5\u{0}1" })), CONFIG),
        case("sysctl an array", with(&b, "sysctl", json!(["net.core.somaxconn=5"])), CONFIG),
        case(
            "sysctl key given twice",
            format!(
                r#"{{"cniVersion":"1.0.0","name":"{}","type":"tuning","dataDir":"{}","sysctl":{{"net.core.somaxconn":"1","net.core.somaxconn":"2"}},"prevResult":{}}}"#,
                f.network,
                f.data_dir(),
                f.prev_result()
            ),
            CONFIG,
        ),
        case(
            "args.cni.sysctl kernel.hostname",
            with(&b, "args", json!({ "cni": { "sysctl": { "kernel.hostname": "x" } } })),
            CONFIG,
        ),
        case("mtu -1", with(&b, "mtu", json!(-1)), CONFIG),
        case("mtu 2^32", with(&b, "mtu", json!(4_294_967_296u64)), CONFIG),
        case("mtu a string", with(&b, "mtu", json!("1400")), CONFIG),
        case("txQLen -1", with(&b, "txQLen", json!(-1)), CONFIG),
        case("txQLen a string", with(&b, "txQLen", json!("5")), CONFIG),
        case("mac not a MAC", with(&b, "mac", json!("zz:zz:zz:zz:zz:zz")), CONFIG),
        case("mac multicast", with(&b, "mac", json!("01:00:5e:00:00:01")), CONFIG),
        case("runtimeConfig.mac a number", with(&b, "runtimeConfig", json!({ "mac": 5 })), CONFIG),
        case("args.cni.mac garbage", with(&b, "args", json!({ "cni": { "mac": "x;reboot" } })), CONFIG),
        case("promisc a string", with(&b, "promisc", json!("yes")), CONFIG),
        case("allmulti a number", with(&b, "allmulti", json!(1)), CONFIG),
        case("dataDir relative", with(&b, "dataDir", json!("../escape")), CONFIG),
        case("dataDir a number", with(&b, "dataDir", json!(5)), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
    ];
    cases.push(env_case("CNI_ARGS MAC not a MAC", &b, vec![("CNI_ARGS", Some("MAC=zz".into()))], CONFIG));
    cases
}

/// Every row of tuning's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let mut cases = common_cases(&f, "tuning");
    cases.extend(netns_cases(&f, "tuning"));
    cases.extend(rows(&f));
    run_table(&f, "tuning", &cases);
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname"), hostname);
    let arp_ignore = f.pod.sh("cat", &["/proc/sys/net/ipv4/conf/all/arp_ignore"]);
    assert_eq!(arp_ignore.trim(), "0", "a refused ADD wrote a sysctl in the pod");
}

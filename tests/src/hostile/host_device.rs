//! host-device's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/host-device/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, common_cases, netns_cases, run_table, with, without_keys, Case, Fixture, CONFIG};
use serde_json::json;
use serde_json::Value;
use std::path::Path;

/// The rows of host-device's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = without_keys(&f.base("host-device"), &["device"]);
    let set = |k: &str, v: Value| with(&b, k, v);
    vec![
        case("no device key of any kind", b.to_string(), CONFIG),
        case("device a number", set("device", json!(5)), CONFIG),
        case("device with /", set("device", json!("a/b")), CONFIG),
        case("device ..", set("device", json!("..")), CONFIG),
        case("device 16 bytes", set("device", json!("eth0123456789abc")), CONFIG),
        case("hwaddr malformed", set("hwaddr", json!("zz:zz")), CONFIG),
        case("hwaddr a number", set("hwaddr", json!(5)), CONFIG),
        case("kernelpath outside /sys/devices", set("kernelpath", json!("/etc")), CONFIG),
        case("kernelpath escaping with ..", set("kernelpath", json!("/sys/devices/../../etc")), CONFIG),
        case("kernelpath relative", set("kernelpath", json!("sys/devices/pci0000:00")), CONFIG),
        case("pciBusID a path", set("pciBusID", json!("../../../../etc")), CONFIG),
        case("pciBusID function 8", set("pciBusID", json!("0000:03:00.8")), CONFIG),
        case("runtimeConfig.deviceID a path", set("runtimeConfig", json!({ "deviceID": "../x/y" })), CONFIG),
        case("runtimeConfig.deviceID a number", set("runtimeConfig", json!({ "deviceID": 7 })), CONFIG),
        case("ipam.type a path", with(&f.base("host-device"), "ipam", json!({ "type": "/bin/sh" })), CONFIG),
        // A device the host does not have: nothing moved, no address taken.
        case("device not on the host", f.base("host-device").to_string(), 100),
        case("dataDir relative", with(&f.base("host-device"), "dataDir", json!("run/hd")), CONFIG),
        case("dataDir a number", with(&f.base("host-device"), "dataDir", json!(5)), CONFIG),
    ]
}

/// Every row of host-device's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "host-device");
    cases.extend(netns_cases(&f, "host-device"));
    cases.extend(rows(&f));
    run_table(&f, "host-device", &cases);
}

//! macvlan's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/macvlan/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{case, env_case, sublink, with, Case, Fixture, CONFIG, VERSION};
use serde_json::json;
use std::path::Path;

/// The rows of macvlan's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("macvlan");
    let mut cases = sublink::rows(f, "macvlan");
    cases.extend([
        case(
            "mode passthrough (the kernel's word, not the reference's)",
            with(&b, "mode", json!("passthrough")),
            CONFIG,
        ),
        case("bcqueuelen -1", with(&b, "bcqueuelen", json!(-1)), CONFIG),
        case("bcqueuelen 2^32", with(&b, "bcqueuelen", json!(4_294_967_296u64)), CONFIG),
        case("bcqueuelen a string", with(&b, "bcqueuelen", json!("10")), CONFIG),
        case("mac malformed", with(&b, "mac", json!("0a:58:0a")), CONFIG),
        case("mac multicast", with(&b, "mac", json!("01:00:5e:00:00:01")), CONFIG),
        case("mac a number", with(&b, "mac", json!(5)), CONFIG),
        case("runtimeConfig.mac malformed", with(&b, "runtimeConfig", json!({ "mac": "zz" })), CONFIG),
        case("runtimeConfig.mac a number", with(&b, "runtimeConfig", json!({ "mac": 5 })), CONFIG),
        env_case("CNI_ARGS MAC malformed", &b, vec![("CNI_ARGS", Some("MAC=0a:58".into()))], CONFIG),
        case(
            "no ipam on 0.2.0 (a result without addresses)",
            {
                let mut v = b.clone();
                v.as_object_mut().unwrap().remove("ipam");
                v["cniVersion"] = json!("0.2.0");
                v.to_string().into_bytes()
            },
            VERSION,
        ),
    ]);
    cases
}

/// Every row of macvlan's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    sublink::table(bins, "macvlan", rows);
}

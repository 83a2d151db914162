//! Every plugin binary answers VERSION with all seven versions and gates verbs by version.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::bin_dir;
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Stdio};

/// The plugins of the multi-call binary that speak every version from 0.1.0: bandwidth (from
/// 0.3.0), vrf (0.3.1) and firewall (0.4.0) start later, as their references do.
fn plugins() -> impl Iterator<Item = &'static str> {
    libcni::registry::NAMES.into_iter().filter(|p| !["bandwidth", "firewall", "vrf"].contains(p))
}

fn call(plugin: &str, command: &str, stdin: &str) -> (i32, Value) {
    let mut child = Command::new(bin_dir().join(plugin))
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "versions-test")
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", bin_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn plugin");
    // A plugin may answer before reading all of stdin; the pipe may already be closed.
    let _ = child.stdin.take().expect("stdin").write_all(stdin.as_bytes());
    let out = child.wait_with_output().expect("wait");
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

#[test]
fn version_lists_all_seven() {
    for p in plugins() {
        let (rc, v) = call(p, "VERSION", r#"{"cniVersion":"1.1.0"}"#);
        assert_eq!(rc, 0, "{p}");
        assert_eq!(v["cniVersion"], "1.1.0", "{p}");
        assert_eq!(
            v["supportedVersions"],
            serde_json::json!(["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]),
            "{p}"
        );
    }
}

#[test]
fn verbs_are_gated_by_version() {
    for p in plugins() {
        let conf = |v: &str| format!(r#"{{"cniVersion":"{v}","name":"gate","type":"{p}"}}"#);
        for (command, version) in [("CHECK", "0.3.1"), ("GC", "1.0.0"), ("STATUS", "0.4.0")] {
            let (rc, v) = call(p, command, &conf(version));
            assert_eq!((rc, v["code"].as_u64()), (1, Some(1)), "{p} {command} at {version}: {v}");
            assert!(v["msg"].as_str().unwrap().contains(command), "{p}: {v}");
        }
        let (rc, v) = call(p, "ADD", &conf("9.9.9"));
        assert_eq!((rc, v["code"].as_u64()), (1, Some(1)), "{p}: {v}");
        let (rc, v) = call(p, "ADD", r#"{"cniVersion":"1.0.0","name":"#);
        assert_eq!((rc, v["code"].as_u64()), (1, Some(6)), "{p}: {v}");
    }
}

/// The spec: VERSION's output carries the request's cniVersion when it is given and supported.
#[test]
fn version_answers_in_the_requested_version() {
    for p in plugins() {
        for (asked, answered) in [("0.4.0", "0.4.0"), ("1.0.0", "1.0.0"), ("0.1.0", "0.1.0"), ("9.9.9", "1.1.0")] {
            let (rc, v) = call(p, "VERSION", &format!(r#"{{"cniVersion":"{asked}"}}"#));
            assert_eq!((rc, v["cniVersion"].as_str()), (0, Some(answered)), "{p} asked {asked}: {v}");
        }
        let (rc, v) = call(p, "VERSION", "");
        assert_eq!((rc, v["cniVersion"].as_str()), (0, Some("1.1.0")), "{p} with no stdin: {v}");
    }
}

/// STATUS needs no CNI_PATH (the spec makes it optional); loopback has nothing to delegate to.
#[test]
fn status_without_cni_path() {
    let mut child = Command::new(bin_dir().join("loopback"))
        .env_clear()
        .env("CNI_COMMAND", "STATUS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn loopback");
    let _ = child.stdin.take().expect("stdin").write_all(br#"{"cniVersion":"1.1.0","name":"st","type":"loopback"}"#);
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

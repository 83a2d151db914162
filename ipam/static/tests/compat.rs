//! Our static answers as Debian's reference static (`/usr/lib/cni/static`, 1.1.1) does for the same
//! input: the same result JSON for each address source and its precedence, CNI_ARGS IP/GATEWAY,
//! routes and dns, on every version both speak; and both refuse what one refuses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::bin_dir;
use cni_tests::exec::{json_of, Call};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};

const REFERENCE: &str = "/usr/lib/cni/static";

fn add(bin: &Path, conf: &Value, cni_args: &str) -> (bool, Value) {
    let mut cmd = Command::new(bin);
    cmd.env_clear();
    let out = Call::new("ADD", "ctr-compat", "/proc/self/ns/net").path(bin_dir()).args(cni_args).run(cmd, conf);
    (out.status.success(), json_of(&out.stdout))
}

/// The versions the reference binary speaks (1.1.1 stops before 1.1.0).
fn reference_versions() -> Vec<String> {
    let out = Command::new(REFERENCE).env_clear().env("CNI_COMMAND", "VERSION").stdin(Stdio::null()).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["supportedVersions"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

#[test]
fn results_equal_the_reference_static() {
    assert!(Path::new(REFERENCE).is_file(), "{REFERENCE} missing: tests/setup.sh installs containernetworking-plugins");
    let ipam = json!({"type": "static",
        "addresses": [{"address": "10.249.0.5/24", "gateway": "10.249.0.1"}, {"address": "fd49::5/64"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.99.0.0/16", "gw": "10.249.0.254"}, {"dst": "::/0", "gw": "fd49::1"}],
        "dns": {"nameservers": ["10.249.0.53"], "domain": "example.com", "search": ["a.example.com"], "options": ["ndots:2"]}});
    let single = json!({"type": "static", "addresses": [{"address": "10.249.0.5/24", "gateway": "10.249.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}]});
    // (label, extra top-level keys, ipam, CNI_ARGS)
    let cases = [
        ("config only", json!({}), ipam.clone(), "IgnoreUnknown=1"),
        (
            "config + CNI_ARGS IP/GATEWAY",
            json!({}),
            ipam.clone(),
            "IgnoreUnknown=1;IP=10.249.1.5/24;GATEWAY=10.249.1.1",
        ),
        ("CNI_ARGS GATEWAY over a configured one", json!({}), ipam.clone(), "IgnoreUnknown=1;GATEWAY=10.249.0.254"),
        (
            "args.cni.ips replaces",
            json!({"args": {"cni": {"ips": ["10.249.2.5/24"]}}}),
            ipam.clone(),
            "IgnoreUnknown=1;IP=10.249.1.5/24",
        ),
        (
            "runtimeConfig.ips beats args.cni.ips",
            json!({"args": {"cni": {"ips": ["10.249.2.5/24"]}}, "runtimeConfig": {"ips": ["10.249.3.5/24", "fd49:3::5/64"]}}),
            ipam.clone(),
            "IgnoreUnknown=1",
        ),
        (
            "empty lists do not replace",
            json!({"args": {"cni": {"ips": []}}, "runtimeConfig": {"ips": []}}),
            ipam,
            "IgnoreUnknown=1",
        ),
        ("one address", json!({}), single.clone(), "IgnoreUnknown=1"),
        ("no addresses", json!({}), json!({"type": "static"}), "IgnoreUnknown=1"),
        (
            "bad address",
            json!({}),
            json!({"type": "static", "addresses": [{"address": "10.249.0.5"}]}),
            "IgnoreUnknown=1",
        ),
        ("bad CNI_ARGS IP", json!({}), single, "IgnoreUnknown=1;IP=10.249.1.5"),
    ];
    let mut differences = Vec::new();
    for version in reference_versions() {
        for (label, extra, ipam, cni_args) in &cases {
            let mut conf = json!({"cniVersion": version, "name": "compat", "type": "bridge", "ipam": ipam});
            for (k, v) in extra.as_object().unwrap() {
                conf[k] = v.clone();
            }
            let (ours_ok, mut ours) = add(&bin_dir().join("static"), &conf, cni_args);
            let (theirs_ok, mut theirs) = add(Path::new(REFERENCE), &conf, cni_args);
            // An empty dns is rendered by libcni's result conversion (shared by every plugin),
            // which leaves out what Go prints as `"dns":{}` for 1.0.0: the same empty value.
            for r in [&mut ours, &mut theirs] {
                if r.get("dns") == Some(&json!({})) {
                    r.as_object_mut().unwrap().remove("dns");
                }
            }
            if ours_ok != theirs_ok || (ours_ok && ours != theirs) {
                differences.push(format!("{version} {label}:\n  ours      {ours}\n  reference {theirs}"));
            }
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

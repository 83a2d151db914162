#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The DNS an interface plugin's ADD returns when IPAM gives some and the configuration's `dns`
//! is absent, empty, or sets a field, for ours and the reference binaries in /usr/lib/cni, each run
//! on a test node (a namespace of its own) with static IPAM handing out a nameserver.
//!
//! The configuration's `dns` replaces IPAM's exactly when Go's decoder leaves it set (the
//! reference's `dnsConfSet`): a list present, even empty, or a non-empty domain. The reference ptp
//! (and bridge from upstream 1.2.0) do that; the reference bridge 1.1.1, macvlan and host-device
//! replace it always, dropping IPAM's DNS when the configuration sets none, which ours keeps.
//! Privileged: makes its own namespaces, removed even when an assertion fails.

use cni_tests::exec::{exec_in, Out};
use cni_tests::{bin_dir, require_root, unique, Netns};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const REFERENCE: &str = "/usr/lib/cni";
const IPAM_NAMESERVER: &str = "192.0.2.53";

/// The DNS of an ADD result as (nameservers, domain, search, options), empty where absent.
fn dns_of(out: &Out) -> (Vec<String>, String, Vec<String>, Vec<String>) {
    let dns = &out.ok()["dns"];
    let list = |key: &str| -> Vec<String> {
        dns[key].as_array().map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect()).unwrap_or_default()
    };
    (list("nameservers"), dns["domain"].as_str().unwrap_or_default().to_string(), list("search"), list("options"))
}

/// A plugin under test: its type, its own keys, and what its node needs before each ADD.
struct Plugin {
    name: &'static str,
    keys: Value,
    setup: fn(&Netns),
    /// The reference replaces IPAM's DNS even when the configuration sets none.
    reference_always_replaces: bool,
}

/// A veth pair on `node`, unless a DEL moved `name` back there already.
fn veth_pair(node: &Netns, name: &str, peer: &str) {
    if node.exec("ip", &["link", "show", name]).status.success() {
        return;
    }
    node.ip(&["link", "add", name, "type", "veth", "peer", "name", peer]);
    node.ip(&["link", "set", name, "up"]);
    node.ip(&["link", "set", peer, "up"]);
}

fn no_setup(_: &Netns) {}

/// ADD then DEL of `plugin` from `dir` on `node` for a fresh pod; the ADD's output.
fn add_del(dir: &Path, plugin: &Plugin, node: &Netns, dns: Option<&Value>) -> Out {
    (plugin.setup)(node);
    let pod = Netns::new("cndp");
    let mut conf = json!({
        "cniVersion": "1.0.0", "name": unique("dnsnet"), "type": plugin.name,
        "ipam": { "type": "static", "addresses": [{ "address": "10.203.0.5/24", "gateway": "10.203.0.1" }],
                  "dns": { "nameservers": [IPAM_NAMESERVER] } }
    });
    for (k, v) in plugin.keys.as_object().unwrap() {
        conf[k] = v.clone();
    }
    if let Some(dns) = dns {
        conf["dns"] = dns.clone();
    }
    let bin = dir.join(plugin.name);
    let cid = unique("ctr");
    let out = exec_in(&node.name, &bin, "ADD", &conf, &cid, &pod.path, dir);
    let del = exec_in(&node.name, &bin, "DEL", &conf, &cid, &pod.path, dir);
    assert_eq!(del.rc, 0, "{} DEL: {}", bin.display(), del.stdout);
    out
}

#[test]
fn config_dns_replaces_ipams_when_go_sees_it_set() {
    require_root();
    let plugins = [
        Plugin { name: "ptp", keys: json!({}), setup: no_setup, reference_always_replaces: false },
        Plugin { name: "bridge", keys: json!({ "bridge": "cni0" }), setup: no_setup, reference_always_replaces: true },
        Plugin {
            name: "macvlan",
            keys: json!({ "master": "m0" }),
            setup: |node| veth_pair(node, "m0", "m1"),
            reference_always_replaces: true,
        },
        Plugin {
            name: "host-device",
            keys: json!({ "device": "hd0" }),
            setup: |node| veth_pair(node, "hd0", "hd1"),
            reference_always_replaces: true,
        },
        // Not in the reference 1.1.1; upstream's replaces always, like macvlan.
        Plugin { name: "tap", keys: json!({}), setup: no_setup, reference_always_replaces: true },
    ];
    let ipams = (vec![IPAM_NAMESERVER.to_string()], String::new(), Vec::new(), Vec::new());
    let none = (Vec::new(), String::new(), Vec::new(), Vec::new());
    let search = (Vec::new(), String::new(), vec!["svc.local".to_string()], Vec::new());
    let domain = (Vec::new(), "pods.local".to_string(), Vec::new(), Vec::new());
    // (the configuration's dns, what Go decodes as set or not, the DNS that ADD returns then)
    let cases = [
        (None, false, &ipams),
        (Some(json!({})), false, &ipams),
        (Some(json!({ "domain": "", "nameservers": null })), false, &ipams),
        (Some(json!({ "nameservers": [] })), true, &none),
        (Some(json!({ "search": [], "options": [] })), true, &none),
        (Some(json!({ "search": ["svc.local"] })), true, &search),
        (Some(json!({ "domain": "pods.local" })), true, &domain),
    ];
    for plugin in &plugins {
        let node = Netns::new("cndn");
        for (dns, set, want) in &cases {
            let what =
                format!("{} with dns {}", plugin.name, dns.as_ref().map_or("absent".to_string(), Value::to_string));
            let ours = add_del(&bin_dir(), plugin, &node, dns.as_ref());
            assert_eq!(&dns_of(&ours), *want, "ours: {what}");
            let reference = PathBuf::from(REFERENCE).join(plugin.name);
            if !reference.is_file() {
                continue;
            }
            let theirs = add_del(Path::new(REFERENCE), plugin, &node, dns.as_ref());
            let want_theirs = if !set && plugin.reference_always_replaces { &none } else { *want };
            assert_eq!(&dns_of(&theirs), want_theirs, "reference: {what}");
        }
    }
}

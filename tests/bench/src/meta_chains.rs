//! The chains of the meta plugins, as users run them, in the latency rotation beside the base
//! conflist: the seed-style `bridge` + `portmap` (snat) + `bandwidth` with the `portMappings` and
//! `bandwidth` capabilities (conf/bandwidth.conflist), and podman's default `bridge` + `portmap` +
//! `firewall` + `tuning` (conf/podman-firewall.conflist). Each side runs the file's conflist with
//! only its names, addresses and state directory replaced, so both sides run the same shape.

use crate::{Latency, Res, Side};
use serde_json::{json, Map, Value};
use std::path::Path;

/// The plugins the chains use beyond the base conflist's (linked into ours' installed set).
pub const PLUGINS: [&str; 3] = ["bandwidth", "firewall", "tuning"];

/// The newest CNI version the reference (containernetworking-plugins 1.1.1) accepts.
const REFERENCE_MAX_VERSION: &str = "1.0.0";

/// One chain: the conflist file it comes from, and the tags and subnets of its two sides.
struct Shape {
    key: &'static str,
    title: &'static str,
    file: &'static str,
    text: &'static str,
    /// (ours, reference): the sides' keys (network `cnib-<key>`, state under /run/cni-bench/<key>).
    keys: (&'static str, &'static str),
    /// (ours, reference): pod name tags (`cnib-<tag>-N`, bridge `cnib-<tag>0`) and the second octet
    /// of their /16 (10.<octet>.0.0/16), none of them used by the base conflist's sides or the floor.
    tags: (char, char),
    octets: (u8, u8),
    /// The pods' `bandwidth` capability, when the chain has it.
    bandwidth: bool,
}

const SHAPES: [Shape; 2] = [
    Shape {
        key: "bandwidth",
        title: "bridge + portmap (snat) + bandwidth",
        file: "conf/bandwidth.conflist",
        text: include_str!("../../../conf/bandwidth.conflist"),
        keys: ("bandwidth-ours", "bandwidth-reference"),
        tags: ('w', 'x'),
        octets: (240, 241),
        bandwidth: true,
    },
    Shape {
        key: "podman",
        title: "bridge + portmap + firewall + tuning",
        file: "conf/podman-firewall.conflist",
        text: include_str!("../../../conf/podman-firewall.conflist"),
        keys: ("podman-ours", "podman-reference"),
        tags: ('y', 'z'),
        octets: (242, 243),
        bandwidth: false,
    },
];

/// A chain's two sides.
pub struct Chain {
    pub key: &'static str,
    pub title: &'static str,
    pub file: &'static str,
    pub ours: Side,
    pub reference: Side,
}

/// A chain's per-pod latency on both sides, for the report.
#[derive(Debug, Clone)]
pub struct ChainLatency {
    pub key: &'static str,
    pub title: &'static str,
    pub file: &'static str,
    pub ours: Latency,
    pub reference: Latency,
}

/// `text` (a conflist) for one side: its own network name, bridge, subnet (gateway .1 where the
/// file names one) and IPAM directory, the CNI version capped at what the reference accepts; every
/// other key as the file has it.
fn side_conf(text: &str, key: &str, bridge: &str, octet: u8) -> Res<Value> {
    let mut conf: Value = serde_json::from_str(text).map_err(|e| format!("{key}: {e}"))?;
    let version = conf["cniVersion"].as_str().unwrap_or(REFERENCE_MAX_VERSION);
    if version != REFERENCE_MAX_VERSION && libcni::version::at_least(version, REFERENCE_MAX_VERSION) {
        conf["cniVersion"] = json!(REFERENCE_MAX_VERSION);
    }
    conf["name"] = json!(format!("{}{key}", crate::PREFIX));
    let first = &mut conf["plugins"][0];
    if first["type"] != "bridge" {
        return Err(format!("{key}: the chain's first plugin is not bridge"));
    }
    first["bridge"] = json!(bridge);
    let ipam = &mut first["ipam"];
    ipam["dataDir"] = json!(Side::state_dir(key).join("ipam"));
    let Some(ranges) = ipam["ranges"].as_array_mut() else { return Err(format!("{key}: ipam has no ranges")) };
    for range in ranges.iter_mut().filter_map(Value::as_array_mut).flatten() {
        range["subnet"] = json!(format!("10.{octet}.0.0/16"));
        if range.get("gateway").is_some() {
            range["gateway"] = json!(format!("10.{octet}.0.1"));
        }
    }
    Ok(conf)
}

/// Both chains, ours from `ours_bin` and the reference from `reference_bin`.
pub fn chains(ours_bin: &Path, reference_bin: &Path) -> Res<Vec<Chain>> {
    for (dir, what) in [(ours_bin, "ours"), (reference_bin, "reference")] {
        if let Some(p) = PLUGINS.iter().find(|p| !dir.join(p).is_file()) {
            return Err(format!("{} has no {p} ({what}), which the chains need", dir.display()));
        }
    }
    // 100 Mbit/s each way with 1 Mbit bursts: shaping set up, not reached by an idle pod.
    let limits = json!({"ingressRate": 100_000_000u64, "ingressBurst": 1_000_000u64,
                        "egressRate": 100_000_000u64, "egressBurst": 1_000_000u64});
    SHAPES
        .iter()
        .map(|s| {
            let caps: Map<String, Value> = if s.bandwidth {
                [("bandwidth".to_string(), limits.clone())].into_iter().collect()
            } else {
                Map::new()
            };
            let side = |key: &'static str, label, tag, bin: &Path, octet, port_base| -> Res<Side> {
                let conf = side_conf(s.text, key, &Side::bridge_name(tag), octet)?;
                Side::with_conf(key, label, tag, bin, octet, port_base, &conf, caps.clone())
            };
            Ok(Chain {
                key: s.key,
                title: s.title,
                file: s.file,
                ours: side(s.keys.0, "cni-rs", s.tags.0, ours_bin, s.octets.0, 20000)?,
                reference: side(s.keys.1, "reference (Go)", s.tags.1, reference_bin, s.octets.1, 40000)?,
            })
        })
        .collect()
}

//! The chains of the meta plugins, as users run them, in the latency rotation beside the base
//! conflist: the seed-style `bridge` + `portmap` (snat) + `bandwidth` with the `portMappings` and
//! `bandwidth` capabilities (conf/bandwidth.conflist), and podman's default `bridge` + `portmap` +
//! `firewall` + `tuning` (conf/podman-firewall.conflist). Each side runs the file's conflist with
//! only its names, addresses and state directory replaced, so both sides run the same shape.

use crate::{Latency, Res, Side, SideSpec};
use serde_json::{json, Map, Value};
use std::path::Path;

/// The plugins the chains use beyond the base conflist's (linked into ours' installed set).
pub const PLUGINS: [&str; 3] = ["bandwidth", "firewall", "tuning"];

/// The newest CNI version the reference (containernetworking-plugins 1.1.1) accepts.
const REFERENCE_MAX_VERSION: &str = "1.0.0";

/// One chain: its key (`--chain` name, CSV key, and the sides' `<key>-ours` and `<key>-reference`:
/// network `cnib-<side key>`, state under /run/cni-bench/<side key>), title, the sides' pod name
/// tags (`cnib-<tag>-N`, bridge `cnib-<tag>0`) and the second octet of ours' /16 (the reference's
/// is the next). Every tag and /16 is unused by the base conflist's sides and the floors.
struct Shape {
    key: &'static str,
    title: &'static str,
    tags: [char; 2],
    octet: u8,
}

const SHAPES: [Shape; 2] = [
    Shape { key: "bandwidth", title: "bridge + portmap (snat) + bandwidth", tags: ['w', 'x'], octet: 240 },
    Shape { key: "podman", title: "bridge + portmap + firewall + tuning", tags: ['y', 'z'], octet: 242 },
];

/// The conflist a chain runs: its file in the repository and its text.
fn conflist(key: &str) -> (&'static str, &'static str) {
    match key {
        "bandwidth" => ("conf/bandwidth.conflist", include_str!("../../../conf/bandwidth.conflist")),
        _ => ("conf/podman-firewall.conflist", include_str!("../../../conf/podman-firewall.conflist")),
    }
}

/// A side's key, `<chain key>-<side>`; it names the side's network and directories for the whole
/// run (hence leaked: two short strings per chain, once).
fn side_key(key: &str, side: &str) -> &'static str {
    Box::leak(format!("{key}-{side}").into_boxed_str())
}

/// Whether a plugin of conflist `conf` takes the `bandwidth` capability (then every pod gets it).
fn wants_bandwidth(conf: &Value) -> bool {
    let plugins = conf["plugins"].as_array().map(Vec::as_slice).unwrap_or_default();
    plugins.iter().any(|p| p["capabilities"]["bandwidth"] == json!(true))
}

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
    /// `cni-floor` doing the chain's link work (the bandwidth chain's: its ifb and qdiscs too).
    pub floor: Latency,
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
            let (file, text) = conflist(s.key);
            let keys = [side_key(s.key, "ours"), side_key(s.key, "reference")];
            let [o, r] = SideSpec::pair(keys, s.tags, ours_bin, reference_bin, s.octet);
            let side = |spec: SideSpec| -> Res<Side> {
                let conf = side_conf(text, spec.key, &Side::bridge_name(spec.tag), spec.octet)?;
                let caps: Map<String, Value> = if wants_bandwidth(&conf) {
                    [("bandwidth".to_string(), limits.clone())].into_iter().collect()
                } else {
                    Map::new()
                };
                Side::with_conf(spec, &conf, caps)
            };
            Ok(Chain { key: s.key, title: s.title, file, ours: side(o)?, reference: side(r)? })
        })
        .collect()
}

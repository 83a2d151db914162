//! The fuzz properties, shared by the cargo-fuzz targets (`fuzz_targets/`) and the stable, bounded
//! mutation run in the workspace's tests (`tests/tests/fuzz_smoke.rs` includes this file).
//!
//! A property fails by panicking: a panic anywhere in parsing, validation or conversion, an error
//! with a code outside the set that input class may produce, or a conversion whose output does
//! not parse back.
#![allow(clippy::panic)]

use libcni::args::CniArgs;
use libcni::conflist::NetworkConfigList;
use libcni::skel::{Command, Request};
use libcni::types::{self, CniResult};
use libcni::version::SUPPORTED;
use libcni::Error;
use serde_json::Value;

fn expect_code(what: &str, e: &Error, allowed: &[u32]) {
    if !allowed.contains(&e.code) {
        panic!("{what}: code {} not in {allowed:?}: {}", e.code, e.msg);
    }
    if e.msg.is_empty() {
        panic!("{what}: code {} with an empty message", e.code);
    }
}

/// Netconf bytes through libcni's parser, then every plugin's own config parser; also as a conflist.
pub fn netconf(data: &[u8]) {
    if let Err(e) = NetworkConfigList::from_bytes(data) {
        expect_code("conflist", &e, &[1, 6, 7]);
    }
    if let Err(e) = NetworkConfigList::from_single_conf(data) {
        expect_code("single conf", &e, &[1, 6, 7]);
    }
    let (conf, raw) = match libcni::conf::parse_netconf(data) {
        Ok(parsed) => parsed,
        Err(e) => return expect_code("netconf", &e, &[1, 6, 7]),
    };
    // CNI_ARGS come from the environment; fuzz them with the same bytes.
    let args_text = String::from_utf8_lossy(&data[..data.len().min(64)]).into_owned();
    let args = match CniArgs::parse(&args_text) {
        Ok(a) => a,
        Err(e) => {
            expect_code("CNI_ARGS", &e, &[4]);
            CniArgs::default()
        }
    };
    match host_local::config::IpamConfig::parse(&conf, Some(&args)) {
        Ok(cfg) => {
            if let Err(e) = cfg.requested_per_set() {
                expect_code("host-local requested IPs", &e, &[7]);
            }
        }
        Err(e) => expect_code("host-local", &e, &[4, 7]),
    }
    if let Err(e) = host_local::config::store_location(&conf) {
        expect_code("host-local store", &e, &[7]);
    }
    if let Err(e) = portmap::config::parse(&raw, &conf.runtime_config, |_| Ok(netkit::firewall::BackendKind::Nftables))
    {
        expect_code("portmap", &e, &[7]);
    }
    let req = Request {
        command: Command::Add,
        container_id: "fuzz".into(),
        netns: None,
        ifname: "eth0".into(),
        args,
        netns_override: false,
        cni_path: Vec::new(),
        conf,
        raw,
        stdin: data.to_vec(),
    };
    if let Err(e) = bridge::config::parse(&req) {
        expect_code("bridge", &e, &[2, 7]);
    }
}

/// Result JSON of any version: parse with every fallback version, render to every version, and
/// the rendering must parse back as that version; `types::convert` agrees.
pub fn result_convert(data: &[u8]) {
    let value: Value = match serde_json::from_slice(data) {
        Ok(v) => v,
        Err(_) => {
            if let Err(e) = CniResult::parse_bytes(data, "1.0.0") {
                expect_code("result bytes", &e, &[6]);
            }
            return;
        }
    };
    let targets = SUPPORTED.iter().copied().chain([""]);
    for fallback in SUPPORTED.iter().copied().chain([""]) {
        let result = match CniResult::parse(&value, fallback) {
            Ok(r) => r,
            Err(e) => {
                expect_code("result parse", &e, &[1, 6]);
                continue;
            }
        };
        for to in targets.clone() {
            match result.to_value(to) {
                Ok(out) => {
                    let read_as = if to.is_empty() { "0.1.0" } else { to };
                    if let Err(e) = CniResult::parse(&out, read_as) {
                        panic!("{} -> {to:?} does not parse back: {e}: {out}", result.cni_version);
                    }
                    if let Err(e) = result.to_pretty(to) {
                        panic!("to_pretty({to:?}) failed after to_value succeeded: {e}");
                    }
                }
                // 999: a result without addresses cannot be rendered at 0.1.0/0.2.0 (the reference's code).
                Err(e) => expect_code("result render", &e, &[1, 999]),
            }
            if let Err(e) = result.as_version(to) {
                expect_code("as_version", &e, &[1, 999]);
            }
        }
    }
    for to in targets {
        if let Err(e) = types::convert(&value, to) {
            expect_code("convert", &e, &[1, 6, 999]);
        }
    }
}

//! portmap's keys and the `portMappings` capability, parsed and validated once.

use libcni::conf::{kind, lenient_bool_value};
use libcni::skel::Request;
use libcni::{Error, Result};
use netkit::firewall::{self, BackendKind, PortMapping, Protocol};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::net::IpAddr;

/// The reference's default: Kubernetes uses bits 14 and 15, Calico 20-31.
pub const DEFAULT_MARK_BIT: u8 = 13;

#[derive(Debug, Clone, Deserialize, Default)]
struct Raw {
    backend: Option<String>,
    snat: Option<Value>,
    #[serde(rename = "masqAll")]
    masq_all: Option<Value>,
    #[serde(rename = "markMasqBit")]
    mark_masq_bit: Option<i64>,
    #[serde(rename = "externalSetMarkChain")]
    external_set_mark_chain: Option<String>,
    #[serde(rename = "conditionsV4")]
    conditions_v4: Option<Vec<String>>,
    #[serde(rename = "conditionsV6")]
    conditions_v6: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
struct RawMapping {
    #[serde(rename = "hostPort")]
    host_port: Option<i64>,
    #[serde(rename = "containerPort")]
    container_port: Option<i64>,
    protocol: Option<String>,
    #[serde(rename = "hostIP")]
    host_ip: Option<String>,
}

/// portmap's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub backend: BackendKind,
    /// The backend was detected, not configured: DEL then also removes what the reference plugin
    /// left in iptables for this container (a node switched from the reference keeps working).
    pub backend_detected: bool,
    pub snat: bool,
    pub masq_all: bool,
    pub mark_masq_bit: u8,
    pub external_set_mark_chain: Option<String>,
    pub conditions_v4: Vec<String>,
    pub conditions_v6: Vec<String>,
    pub mappings: Vec<PortMapping>,
}

impl Config {
    pub fn parse(req: &Request) -> Result<Config> {
        parse(&req.raw, &req.conf.runtime_config, firewall::choose)
    }
}

fn bool_key(v: &Option<Value>, key: &str, default: bool) -> Result<bool> {
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(v) => lenient_bool_value(v)
            .ok_or_else(|| Error::config(format!("portmap key {key:?} must be true or false, got {}", kind(v)))),
    }
}

/// Which backend a list of conditions is written for: iptables conditions start with `-` or `!`.
fn conditions_backend(conds: &[String]) -> Option<BackendKind> {
    let first = conds.first()?.trim_start();
    match first.chars().next()? {
        '-' | '!' => Some(BackendKind::Iptables),
        _ => Some(BackendKind::Nftables),
    }
}

/// Parses the netconf (`raw`) and runtimeConfig; `detect` picks the backend when the config doesn't.
pub fn parse(
    raw: &Value,
    runtime_config: &Map<String, Value>,
    detect: impl Fn(Option<&str>) -> Result<BackendKind>,
) -> Result<Config> {
    let r = Raw::deserialize(raw).map_err(|e| Error::config(format!("invalid portmap configuration: {e}")))?;
    let snat = bool_key(&r.snat, "snat", true)?;
    let masq_all = bool_key(&r.masq_all, "masqAll", false)?;
    if r.mark_masq_bit.is_some() && r.external_set_mark_chain.is_some() {
        return Err(Error::config("portmap: markMasqBit and externalSetMarkChain cannot both be set"));
    }
    let mark_masq_bit = match r.mark_masq_bit {
        None => DEFAULT_MARK_BIT,
        Some(b @ 0..=31) => b as u8,
        Some(b) => return Err(Error::config(format!("portmap: markMasqBit {b} is out of range 0-31"))),
    };
    if let Some(chain) = &r.external_set_mark_chain {
        if chain.is_empty() || chain.len() > 28 || chain.chars().any(|c| c.is_whitespace() || c == '"') {
            return Err(Error::config(format!("portmap: externalSetMarkChain {chain:?} is not a valid chain name")));
        }
    }
    let conditions_v4 = r.conditions_v4.unwrap_or_default();
    let conditions_v6 = r.conditions_v6.unwrap_or_default();
    for c in conditions_v4.iter().chain(&conditions_v6) {
        if c.contains('\n') || c.contains('\r') || c.contains(';') {
            return Err(Error::config(format!("portmap: condition {c:?} must be one line without ';'")));
        }
    }

    // Options that only one backend understands.
    let mut wants: Vec<(BackendKind, &str)> = Vec::new();
    if r.external_set_mark_chain.is_some() {
        wants.push((BackendKind::Iptables, "externalSetMarkChain"));
    }
    if r.mark_masq_bit.is_some() {
        wants.push((BackendKind::Iptables, "markMasqBit"));
    }
    if let Some(b) = conditions_backend(&conditions_v4) {
        wants.push((b, "conditionsV4"));
    }
    if let Some(b) = conditions_backend(&conditions_v6) {
        wants.push((b, "conditionsV6"));
    }
    let backend = match (r.backend.as_deref(), wants.first()) {
        (Some(name), _) => BackendKind::parse(name)?,
        (None, Some((b, _))) => *b,
        (None, None) => detect(None)?,
    };
    let wrong: Vec<&str> = wants.iter().filter(|(b, _)| *b != backend).map(|(_, k)| *k).collect();
    if !wrong.is_empty() {
        return Err(Error::config(format!(
            "portmap: the {backend} backend is in use but the configuration has options for the other backend: {}",
            wrong.join(", ")
        )));
    }

    let mappings = match runtime_config.get("portMappings") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => parse_mappings(v)?,
    };
    Ok(Config {
        backend,
        backend_detected: r.backend.is_none() && wants.is_empty(),
        snat,
        masq_all,
        mark_masq_bit,
        external_set_mark_chain: r.external_set_mark_chain,
        conditions_v4,
        conditions_v6,
        mappings,
    })
}

fn parse_mappings(v: &Value) -> Result<Vec<PortMapping>> {
    let raw =
        Vec::<RawMapping>::deserialize(v).map_err(|e| Error::config(format!("runtimeConfig.portMappings: {e}")))?;
    raw.iter().enumerate().map(|(i, m)| parse_mapping(i, m)).collect()
}

fn parse_mapping(i: usize, m: &RawMapping) -> Result<PortMapping> {
    let name = format!(
        "portMappings[{i}] (hostPort {}, containerPort {}, protocol {})",
        m.host_port.map_or("missing".to_string(), |p| p.to_string()),
        m.container_port.map_or("missing".to_string(), |p| p.to_string()),
        m.protocol.as_deref().unwrap_or("tcp"),
    );
    let port = |p: Option<i64>, key: &str| -> Result<u16> {
        match p {
            Some(p @ 1..=65535) => Ok(p as u16),
            Some(p) => Err(Error::config(format!("{name}: {key} {p} is out of range 1-65535"))),
            None => Err(Error::config(format!("{name}: {key} is missing"))),
        }
    };
    let host_port = port(m.host_port, "hostPort")?;
    let container_port = port(m.container_port, "containerPort")?;
    let protocol = match m.protocol.as_deref().map(str::trim) {
        None | Some("") => Protocol::Tcp,
        Some(p) => Protocol::parse(p)
            .ok_or_else(|| Error::config(format!("{name}: unknown protocol {p:?}: use tcp, udp or sctp")))?,
    };
    let host_ip = match m.host_ip.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(s) => {
            Some(s.parse::<IpAddr>().map_err(|_| Error::config(format!("{name}: hostIP {s:?} is not an IP address")))?)
        }
    };
    Ok(PortMapping { host_port, container_port, protocol, host_ip })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nft(_: Option<&str>) -> Result<BackendKind> {
        Ok(BackendKind::Nftables)
    }

    fn rc(mappings: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("portMappings".into(), mappings);
        m
    }

    #[test]
    fn defaults() {
        let c = parse(&json!({"name": "n"}), &Map::new(), nft).unwrap();
        assert!(c.snat && !c.masq_all);
        assert_eq!(c.mark_masq_bit, 13);
        assert_eq!(c.backend, BackendKind::Nftables);
        assert!(c.mappings.is_empty());
    }

    #[test]
    fn mappings() {
        let c = parse(
            &json!({"snat": "false", "backend": "nft"}),
            &rc(json!([
                {"hostPort": 8080, "containerPort": 80, "protocol": "TCP"},
                {"hostPort": 53, "containerPort": 53, "protocol": "udp", "hostIP": "192.168.1.1"},
                {"hostPort": 9, "containerPort": 9}
            ])),
            nft,
        )
        .unwrap();
        assert!(!c.snat);
        assert_eq!(c.mappings.len(), 3);
        assert_eq!(c.mappings[1].host_ip, Some("192.168.1.1".parse().unwrap()));
        assert_eq!(c.mappings[2].protocol, Protocol::Tcp);
    }

    #[test]
    fn bad_values_are_code_7() {
        let cases = [
            (json!({}), json!([{"hostPort": 0, "containerPort": 80}]), "hostPort 0"),
            (json!({}), json!([{"hostPort": 80, "containerPort": 65536}]), "containerPort 65536"),
            (json!({}), json!([{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]), "unknown protocol"),
            (json!({}), json!([{"hostPort": 80, "containerPort": 80, "hostIP": "nope"}]), "hostIP"),
            (json!({"backend": "ipfw"}), json!([]), "unknown firewall backend"),
            (json!({"markMasqBit": 32}), json!([]), "out of range 0-31"),
            (json!({"markMasqBit": 3, "externalSetMarkChain": "X"}), json!([]), "cannot both"),
            (json!({"backend": "nftables", "externalSetMarkChain": "X"}), json!([]), "externalSetMarkChain"),
            (json!({"backend": "iptables", "conditionsV4": ["ip", "saddr", "1.2.3.4"]}), json!([]), "conditionsV4"),
            (json!({"snat": 3}), json!([]), "snat"),
        ];
        for (conf, maps, needle) in cases {
            let e = parse(&conf, &rc(maps), nft).unwrap_err();
            assert_eq!(e.code, 7, "{e}");
            assert!(e.msg.contains(needle), "{} lacks {needle}", e.msg);
        }
        let e = parse(
            &json!({}),
            &rc(json!([{"hostPort": 1, "containerPort": 2}, {"hostPort": 70000, "containerPort": 2}])),
            nft,
        )
        .unwrap_err();
        assert!(e.msg.contains("portMappings[1]"), "{}", e.msg);
    }

    #[test]
    fn backend_follows_backend_specific_options() {
        let c = parse(&json!({"markMasqBit": 5}), &Map::new(), nft).unwrap();
        assert_eq!((c.backend, c.mark_masq_bit), (BackendKind::Iptables, 5));
        let c = parse(&json!({"conditionsV4": ["-s", "1.2.3.4"]}), &Map::new(), nft).unwrap();
        assert_eq!(c.backend, BackendKind::Iptables);
        let c = parse(&json!({"backend": "iptables"}), &Map::new(), nft).unwrap();
        assert_eq!(c.backend, BackendKind::Iptables);
    }
}

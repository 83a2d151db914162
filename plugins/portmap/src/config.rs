//! portmap's keys and the `portMappings` capability, parsed and validated once.

use libcni::conf::{kind, lenient_bool_value};
use libcni::gojson::{self, Spelled};
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
    snat: Option<Spelled<Value>>,
    #[serde(rename = "masqAll")]
    masq_all: Option<Spelled<Value>>,
    #[serde(rename = "markMasqBit")]
    mark_masq_bit: Option<Spelled<i64>>,
    #[serde(rename = "externalSetMarkChain")]
    external_set_mark_chain: Option<Spelled<String>>,
    #[serde(rename = "conditionsV4")]
    conditions_v4: Option<Vec<String>>,
    #[serde(rename = "conditionsV6")]
    conditions_v6: Option<Vec<String>>,
}

/// One mapping; each key keeps its spelling (`HostPort` from containerd) for messages.
#[derive(Debug, Clone, Deserialize)]
struct RawMapping {
    #[serde(rename = "hostPort")]
    host_port: Option<Spelled<i64>>,
    #[serde(rename = "containerPort")]
    container_port: Option<Spelled<i64>>,
    protocol: Option<Spelled<String>>,
    #[serde(rename = "hostIP")]
    host_ip: Option<Spelled<String>>,
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

fn bool_key(v: &Option<Spelled<Value>>, field: &str, default: bool) -> Result<bool> {
    match v {
        None | Some(Spelled { value: Value::Null, .. }) => Ok(default),
        Some(v) => lenient_bool_value(&v.value).ok_or_else(|| {
            Error::config(format!("portmap key {:?} must be true or false, got {}", v.key_or(field), kind(&v.value)))
        }),
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

/// Parses the netconf (`raw`) and runtimeConfig with Go's key matching (containerd sends
/// `{"HostPort":8080,"ContainerPort":80,...}`); `detect` picks the backend when the config doesn't.
pub fn parse(
    raw: &Value,
    runtime_config: &Map<String, Value>,
    detect: impl Fn(Option<&str>) -> Result<BackendKind>,
) -> Result<Config> {
    let r: Raw = gojson::from_value(raw).map_err(|e| Error::config(format!("invalid portmap configuration: {e}")))?;
    let snat = bool_key(&r.snat, "snat", true)?;
    let masq_all = bool_key(&r.masq_all, "masqAll", false)?;
    if r.mark_masq_bit.is_some() && r.external_set_mark_chain.is_some() {
        return Err(Error::config("portmap: markMasqBit and externalSetMarkChain cannot both be set"));
    }
    let mark_masq_bit = match &r.mark_masq_bit {
        None => DEFAULT_MARK_BIT,
        Some(Spelled { value: b @ 0..=31, .. }) => *b as u8,
        Some(b) => {
            let key = b.key_or("markMasqBit");
            return Err(Error::config(format!("portmap: {key} {} is out of range 0-31", b.value)));
        }
    };
    if let Some(chain) = &r.external_set_mark_chain {
        let (key, chain) = (chain.key_or("externalSetMarkChain"), &chain.value);
        if chain.is_empty() || chain.len() > 28 || chain.chars().any(|c| c.is_whitespace() || c == '"') {
            return Err(Error::config(format!("portmap: {key} {chain:?} is not a valid chain name")));
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

    let mappings = match gojson::get(runtime_config, "portMappings") {
        None | Some((_, Value::Null)) => Vec::new(),
        Some((key, v)) => parse_mappings(key, v)?,
    };
    Ok(Config {
        backend,
        backend_detected: r.backend.is_none() && wants.is_empty(),
        snat,
        masq_all,
        mark_masq_bit,
        external_set_mark_chain: r.external_set_mark_chain.map(|c| c.value),
        conditions_v4,
        conditions_v6,
        mappings,
    })
}

fn parse_mappings(key: &str, v: &Value) -> Result<Vec<PortMapping>> {
    let raw: Vec<RawMapping> =
        gojson::from_value(v).map_err(|e| Error::config(e.under(key).under("runtimeConfig").to_string()))?;
    raw.iter().enumerate().map(|(i, m)| parse_mapping(i, m)).collect()
}

fn parse_mapping(i: usize, m: &RawMapping) -> Result<PortMapping> {
    let name = format!(
        "portMappings[{i}] (hostPort {}, containerPort {}, protocol {})",
        m.host_port.as_ref().map_or("missing".to_string(), |p| p.value.to_string()),
        m.container_port.as_ref().map_or("missing".to_string(), |p| p.value.to_string()),
        m.protocol.as_ref().map_or("tcp", |p| p.value.as_str()),
    );
    let port = |p: &Option<Spelled<i64>>, field: &str| -> Result<u16> {
        match p {
            Some(Spelled { value: p @ 1..=65535, .. }) => Ok(*p as u16),
            Some(p) => Err(Error::config(format!("{name}: {} {} is out of range 1-65535", p.key_or(field), p.value))),
            None => Err(Error::config(format!("{name}: {field} is missing"))),
        }
    };
    let host_port = port(&m.host_port, "hostPort")?;
    let container_port = port(&m.container_port, "containerPort")?;
    let protocol = match &m.protocol {
        Some(p) if !p.value.trim().is_empty() => Protocol::parse(p.value.trim()).ok_or_else(|| {
            let key = p.key_or("protocol");
            Error::config(format!("{name}: unknown {key} {:?}: use tcp, udp or sctp", p.value.trim()))
        })?,
        _ => Protocol::Tcp,
    };
    let host_ip =
        match &m.host_ip {
            Some(ip) if !ip.value.trim().is_empty() => {
                let text = ip.value.trim();
                Some(text.parse::<IpAddr>().map_err(|_| {
                    Error::config(format!("{name}: {} {text:?} is not an IP address", ip.key_or("hostIP")))
                })?)
            }
            _ => None,
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

    /// containerd's go-cni marshals `PortMapping{HostPort,ContainerPort,Protocol,HostIP}` without JSON
    /// tags; Go's decoder, and so the reference portmap, takes those keys.
    #[test]
    fn go_style_keys_as_containerd_sends_them() {
        let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "portmap", "SNAT": false, "MasqAll": true,
            "RuntimeConfig": {
                "PortMappings": [
                    {"HostPort": 18090, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""},
                    {"HostPort": 5353, "ContainerPort": 53, "Protocol": "udp", "HostIP": "127.0.0.1"}],
                "bandwidth": {"IngressRate": 1000, "IngressBurst": 10, "EgressRate": 1000, "EgressBurst": 10},
                "dns": {"Servers": ["10.96.0.10"], "Searches": ["svc.cluster.local"], "Options": ["ndots:5"]},
                "io.kubernetes.cri.pod-annotations": {"a": "b"}, "cgroupPath": "/kubepods/x"}});
        let runtime_config = libcni::conf::netconf_from_value(&conf).unwrap().runtime_config;
        let c = parse(&conf, &runtime_config, nft).unwrap();
        assert!(!c.snat && c.masq_all);
        assert_eq!(
            c.mappings,
            [
                PortMapping { host_port: 18090, container_port: 80, protocol: Protocol::Tcp, host_ip: None },
                PortMapping {
                    host_port: 5353,
                    container_port: 53,
                    protocol: Protocol::Udp,
                    host_ip: Some("127.0.0.1".parse().unwrap())
                },
            ]
        );
        // Messages name the key as written.
        for (mapping, needle) in [
            (json!({"HostPort": 0, "ContainerPort": 80}), "HostPort 0 is out of range"),
            (json!({"HostPort": 80, "CONTAINERPORT": 70000}), "CONTAINERPORT 70000 is out of range"),
            (json!({"HostPort": 80, "ContainerPort": 80, "Protocol": "icmp"}), "unknown Protocol \"icmp\""),
            (json!({"HostPort": 80, "ContainerPort": 80, "HostIP": "x"}), "HostIP \"x\" is not an IP address"),
            (json!({"ContainerPort": 80}), "hostPort is missing"),
        ] {
            let e = parse(&json!({}), &rc(json!([mapping])), nft).unwrap_err();
            assert_eq!(e.code, 7);
            assert!(e.msg.contains(needle), "{} lacks {needle}", e.msg);
        }
        for (conf, needle) in [
            (json!({"SNAT": 3}), "\"SNAT\" must be true or false"),
            (json!({"MarkMasqBit": 40}), "MarkMasqBit 40 is out of range"),
            (json!({"ExternalSetMarkChain": "a b"}), "ExternalSetMarkChain \"a b\" is not a valid chain name"),
        ] {
            let e = parse(&conf, &Map::new(), nft).unwrap_err();
            assert!(e.msg.contains(needle), "{} lacks {needle}", e.msg);
        }
        let e = parse(&json!({}), &rc(json!([{"HostPort": "x", "ContainerPort": 80}])), nft).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("runtimeConfig.portMappings[0].HostPort: invalid type: string \"x\""), "{}", e.msg);
    }
}

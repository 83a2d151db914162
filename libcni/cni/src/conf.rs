//! A plugin's network configuration (the netconf on stdin): the keys every plugin shares, parsed once,
//! plus helpers for the plugin's own typed keys. Unknown keys pass through untouched.

use crate::error::{Error, Result};
use crate::gojson;
/// A short name for a JSON value's type, for config errors (it lives with the JSON decoding).
pub use crate::gojson::kind;
use crate::types::{CniResult, Dns};
use crate::version;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// `{"containerID","ifname"}` as sent by GC in `cni.dev/valid-attachments` (or the older `cni.dev/attachments`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The keys that every plugin shares.
#[derive(Debug, Clone, Default)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    /// The `ipam` object as given (its `type` names the IPAM plugin to delegate to).
    pub ipam: Option<Value>,
    /// The `dns` object when it sets something as Go's plugins decide it (`dnsConfSet`): a list
    /// present and not null, even an empty one, or a non-empty `domain`. `None` otherwise: absent,
    /// null, `{}`, or only null lists and an empty domain.
    pub dns: Option<Dns>,
    pub capabilities: BTreeMap<String, bool>,
    pub runtime_config: Map<String, Value>,
    pub args: Map<String, Value>,
    pub prev_result: Option<CniResult>,
    pub valid_attachments: Option<Vec<Attachment>>,
}

impl NetConf {
    /// The IPAM plugin's type, if an `ipam` object with a non-empty `type` is configured.
    pub fn ipam_type(&self) -> Option<&str> {
        gojson::get(self.ipam.as_ref()?.as_object()?, "type")?.1.as_str().filter(|t| !t.is_empty())
    }
}

/// A network name as libcni accepts it: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`. It also keeps names safe as path parts.
pub fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Parse stdin: syntax → code 6, semantics → code 7, unsupported version → code 1.
pub fn parse_netconf(stdin: &[u8]) -> Result<(NetConf, Value)> {
    if stdin.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(Error::decode("network configuration on stdin is empty: the runtime must send the netconf JSON"));
    }
    let raw: Value = serde_json::from_slice(stdin)
        .map_err(|e| Error::decode(format!("network configuration on stdin is not valid JSON: {e}")))?;
    let conf = netconf_from_value(&raw)?;
    Ok((conf, raw))
}

/// A netconf key as Go's decoder finds it (see [`gojson`]): the key as written and its value, null as absent.
fn key<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<(&'a str, &'a Value)> {
    gojson::get(obj, name).filter(|(_, v)| !v.is_null())
}

fn string_key(obj: &Map<String, Value>, name: &str) -> Result<Option<String>> {
    match key(obj, name) {
        None => Ok(None),
        Some((_, Value::String(s))) => Ok(Some(s.clone())),
        Some((k, other)) => Err(Error::config(format!("netconf key {k:?} must be a string, got {}", kind(other)))),
    }
}

fn object_key(obj: &Map<String, Value>, name: &str) -> Result<Map<String, Value>> {
    match key(obj, name) {
        None => Ok(Map::new()),
        Some((_, Value::Object(m))) => Ok(m.clone()),
        Some((k, other)) => Err(Error::config(format!("netconf key {k:?} must be an object, got {}", kind(other)))),
    }
}

pub fn netconf_from_value(raw: &Value) -> Result<NetConf> {
    let Value::Object(obj) = raw else {
        return Err(Error::decode(format!("network configuration must be a JSON object, got {}", kind(raw))));
    };
    let cni_version = string_key(obj, "cniVersion")?.unwrap_or_default();
    version::check_supported(&cni_version)?;
    let cni_version = if cni_version.is_empty() { "0.1.0".to_string() } else { cni_version };
    let name = string_key(obj, "name")?.unwrap_or_default();
    if name.is_empty() {
        return Err(Error::config("netconf has no \"name\": every network needs a name"));
    }
    if !valid_name(&name) {
        return Err(Error::config(format!(
            "invalid network name {name:?}: use letters, digits, '_', '.' and '-', starting with a letter or digit"
        )));
    }
    let plugin_type = string_key(obj, "type")?.unwrap_or_default();
    let ipam = match key(obj, "ipam") {
        None => None,
        Some((k, v @ Value::Object(m))) => {
            match gojson::get(m, "type") {
                None | Some((_, Value::String(_))) => {}
                Some((t, other)) => {
                    return Err(Error::config(format!("{k}.{t} must be a string, got {}", kind(other))))
                }
            }
            Some(v.clone())
        }
        Some((k, other)) => {
            return Err(Error::config(format!("netconf key {k:?} must be an object, got {}", kind(other))))
        }
    };
    let dns = match key(obj, "dns") {
        None => None,
        Some((k, v)) => {
            let dns = gojson::from_value::<Dns>(v).map_err(|e| Error::config(e.under(k).to_string()))?;
            go_sets_dns(v).then_some(dns)
        }
    };
    let mut capabilities = BTreeMap::new();
    for (k, v) in object_key(obj, "capabilities")? {
        let on = lenient_bool_value(&v)
            .ok_or_else(|| Error::config(format!("capability {k:?} must be true or false, got {}", kind(&v))))?;
        capabilities.insert(k, on);
    }
    let runtime_config = object_key(obj, "runtimeConfig")?;
    let args = object_key(obj, "args")?;
    let prev_result = match key(obj, "prevResult") {
        None => None,
        // A malformed prevResult is a wrong value in valid JSON: code 7, like any other key; an
        // unsupported result version keeps code 1.
        Some((k, v)) => Some(CniResult::parse(v, &cni_version).map_err(|e| {
            let code = if e.code == crate::code::INCOMPATIBLE_VERSION { e.code } else { crate::code::INVALID_CONFIG };
            Error { code, ..e.context(k) }
        })?),
    };
    let valid_attachments = match key(obj, "cni.dev/valid-attachments").or_else(|| key(obj, "cni.dev/attachments")) {
        None => None,
        Some((k, v)) => {
            Some(gojson::from_value::<Vec<Attachment>>(v).map_err(|e| Error::config(e.under(k).to_string()))?)
        }
    };
    Ok(NetConf {
        cni_version,
        name,
        plugin_type,
        ipam,
        dns,
        capabilities,
        runtime_config,
        args,
        prev_result,
        valid_attachments,
    })
}

/// Whether a `dns` object sets anything once Go has decoded it into `types.DNS`: a list key that
/// is present and not null is a non-nil slice (an empty one included), and a domain counts when not
/// empty. The reference plugins replace the result's DNS exactly then.
fn go_sets_dns(v: &Value) -> bool {
    let Value::Object(obj) = v else { return false };
    let list_given = ["nameservers", "search", "options"].iter().any(|name| key(obj, name).is_some());
    let domain_given = matches!(key(obj, "domain"), Some((_, Value::String(d))) if !d.is_empty());
    list_given || domain_given
}

/// A bool as libcni accepts it: JSON true/false or the strings "true"/"false" in any case.
pub fn lenient_bool_value(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) if s.eq_ignore_ascii_case("true") => Some(true),
        Value::String(s) if s.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}

/// serde `deserialize_with` for bool keys that upstream also accepts as "true"/"false" strings.
pub fn lenient_bool<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<bool, D::Error> {
    let v = Value::deserialize(d)?;
    if v.is_null() {
        return Ok(false);
    }
    lenient_bool_value(&v).ok_or_else(|| de::Error::custom(format!("expected true or false, got {}", kind(&v))))
}

/// Decode a plugin's own keys from the whole netconf, matching keys as Go does (see [`gojson`]); a
/// wrong type is code 7 naming the plugin and the key as written.
pub fn plugin_conf<'a, T: Deserialize<'a>>(raw: &'a Value, plugin: &str) -> Result<T> {
    gojson::from_value(raw).map_err(|e| Error::config(format!("invalid {plugin} configuration: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("cni0.net-1_a"));
        for bad in ["", ".", "..", "a/b", "-a", "a b", "é", "a;rm"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn codes() {
        assert_eq!(parse_netconf(b"{\"cniVersion\":").unwrap_err().code, 6);
        assert_eq!(parse_netconf(b"").unwrap_err().code, 6);
        assert_eq!(parse_netconf(b"[1]").unwrap_err().code, 6);
        assert_eq!(parse_netconf(br#"{"cniVersion":"9.9.9","name":"n"}"#).unwrap_err().code, 1);
        assert_eq!(parse_netconf(br#"{"cniVersion":"1.0.0"}"#).unwrap_err().code, 7);
        assert_eq!(parse_netconf(br#"{"cniVersion":"1.0.0","name":"../x"}"#).unwrap_err().code, 7);
        assert_eq!(parse_netconf(br#"{"cniVersion":1,"name":"x"}"#).unwrap_err().code, 7);
        assert_eq!(parse_netconf(br#"{"cniVersion":"1.0.0","name":"n","prevResult":"junk"}"#).unwrap_err().code, 7);
        let bad_ips = br#"{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":[{"address":5}]}}"#;
        assert_eq!(parse_netconf(bad_ips).unwrap_err().code, 7);
        let bad_version = br#"{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"7.0.0"}}"#;
        assert_eq!(parse_netconf(bad_version).unwrap_err().code, 1);
        let deep = "[".repeat(300_000);
        assert_eq!(parse_netconf(deep.as_bytes()).unwrap_err().code, 6);
    }

    #[test]
    fn common_keys() {
        let (c, _) = parse_netconf(
            br#"{"cniVersion":"1.1.0","name":"n","type":"bridge","ipam":{"type":"host-local"},
               "capabilities":{"portMappings":"TRUE"},"cni.dev/attachments":[{"containerID":"c","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(c.ipam_type(), Some("host-local"));
        assert_eq!(c.capabilities.get("portMappings"), Some(&true));
        assert_eq!(c.valid_attachments.unwrap()[0].container_id, "c");
        let (c, _) = parse_netconf(br#"{"name":"n"}"#).unwrap();
        assert_eq!(c.cni_version, "0.1.0");
    }

    /// Keys as a Go runtime marshals untagged structs: Go's decoder takes them, so we do.
    /// `dns` counts as set exactly when the reference's `dnsConfSet` is true of what Go decoded.
    #[test]
    fn dns_is_set_as_go_decodes_it() {
        let dns = |d: &str| {
            let text = format!(r#"{{"cniVersion":"1.0.0","name":"n","dns":{d}}}"#);
            parse_netconf(text.as_bytes()).unwrap().0.dns
        };
        for unset in ["null", "{}", r#"{"domain":""}"#, r#"{"nameservers":null,"search":null,"options":null}"#] {
            assert_eq!(dns(unset), None, "{unset}");
        }
        for set in [r#"{"nameservers":[]}"#, r#"{"Search":[]}"#, r#"{"options":[]}"#, r#"{"domain":"x"}"#] {
            assert!(dns(set).is_some(), "{set}");
        }
        assert_eq!(dns(r#"{"nameservers":["10.0.0.10"]}"#).unwrap().nameservers, ["10.0.0.10"]);
    }

    #[test]
    fn keys_match_as_go_decodes_them() {
        let (c, _) = parse_netconf(
            br#"{"CNIVersion":"1.0.0","Name":"n","TYPE":"bridge","IPAM":{"Type":"host-local"},
               "DNS":{"Nameservers":["10.0.0.10"],"Search":["svc"]},
               "RuntimeConfig":{"portMappings":[]},"Args":{"cni":{"ips":["10.0.0.5"]}},
               "Cni.Dev/Valid-Attachments":[{"ContainerID":"c","IfName":"eth0"}],
               "PrevResult":{"CNIVersion":"1.0.0","Interfaces":[{"Name":"eth0","Sandbox":"/x"}],
                  "IPs":[{"Address":"10.0.0.5/24","Gateway":"10.0.0.1","Interface":0}],
                  "Routes":[{"Dst":"0.0.0.0/0","GW":"10.0.0.1"}],"DNS":{"Nameservers":["1.1.1.1"]}}}"#,
        )
        .unwrap();
        assert_eq!((c.cni_version.as_str(), c.name.as_str(), c.plugin_type.as_str()), ("1.0.0", "n", "bridge"));
        assert_eq!(c.ipam_type(), Some("host-local"));
        let dns = c.dns.unwrap();
        assert_eq!((dns.nameservers, dns.search), (vec!["10.0.0.10".to_string()], vec!["svc".to_string()]));
        assert!(c.runtime_config.contains_key("portMappings"));
        assert!(c.args.contains_key("cni"));
        assert_eq!(c.valid_attachments.unwrap(), [Attachment { container_id: "c".into(), ifname: "eth0".into() }]);
        let prev = c.prev_result.unwrap();
        assert_eq!(prev.interfaces[0].name, "eth0");
        assert_eq!(prev.interfaces[0].sandbox.as_deref(), Some("/x"));
        assert_eq!(prev.ips[0].address.to_string(), "10.0.0.5/24");
        assert_eq!((prev.ips[0].gateway, prev.ips[0].interface), (Some("10.0.0.1".parse().unwrap()), Some(0)));
        assert_eq!(prev.routes[0].gw, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(prev.dns.nameservers, ["1.1.1.1"]);
        // Errors name the key as written.
        let e = parse_netconf(br#"{"cniVersion":"1.0.0","Name":5}"#).unwrap_err();
        assert!(e.msg.contains("\"Name\""), "{e}");
        let e = parse_netconf(br#"{"cniVersion":"1.0.0","name":"n","DNS":{"Nameservers":"x"}}"#).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("DNS.Nameservers: invalid type"), "{e}");
        let bad = br#"{"cniVersion":"1.0.0","name":"n","PrevResult":{"IPs":[{"Address":"10.0.0.5/24","GateWay":7}]}}"#;
        let e = parse_netconf(bad).unwrap_err();
        assert!(e.msg.contains("IPs[0].GateWay"), "{e}");
    }
}

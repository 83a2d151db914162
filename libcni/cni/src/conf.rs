//! A plugin's network configuration (the netconf on stdin): the keys every plugin shares, parsed once,
//! plus helpers for the plugin's own typed keys. Unknown keys pass through untouched.

use crate::error::{Error, Result};
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
        self.ipam.as_ref()?.get("type")?.as_str().filter(|t| !t.is_empty())
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

fn string_key(obj: &Map<String, Value>, key: &str) -> Result<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(Error::config(format!("netconf key {key:?} must be a string, got {}", kind(other)))),
    }
}

fn object_key(obj: &Map<String, Value>, key: &str) -> Result<Map<String, Value>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(Error::config(format!("netconf key {key:?} must be an object, got {}", kind(other)))),
    }
}

/// A short name for a JSON value's type, for error messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
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
    let ipam = match obj.get("ipam") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(m)) => {
            match m.get("type") {
                None | Some(Value::String(_)) => {}
                Some(other) => {
                    return Err(Error::config(format!("ipam \"type\" must be a string, got {}", kind(other))))
                }
            }
            Some(v.clone())
        }
        Some(other) => {
            return Err(Error::config(format!("netconf key \"ipam\" must be an object, got {}", kind(other))))
        }
    };
    let dns = match obj.get("dns") {
        None | Some(Value::Null) => None,
        Some(v) => Some(Dns::deserialize(v).map_err(|e| Error::config(format!("netconf key \"dns\": {e}")))?),
    };
    let mut capabilities = BTreeMap::new();
    for (k, v) in object_key(obj, "capabilities")? {
        let on = lenient_bool_value(&v)
            .ok_or_else(|| Error::config(format!("capability {k:?} must be true or false, got {}", kind(&v))))?;
        capabilities.insert(k, on);
    }
    let runtime_config = object_key(obj, "runtimeConfig")?;
    let args = object_key(obj, "args")?;
    let prev_result = match obj.get("prevResult") {
        None | Some(Value::Null) => None,
        // A malformed prevResult is a wrong value in valid JSON: code 7, like any other key; an
        // unsupported result version keeps code 1.
        Some(v) => Some(CniResult::parse(v, &cni_version).map_err(|e| {
            let code = if e.code == crate::code::INCOMPATIBLE_VERSION { e.code } else { crate::code::INVALID_CONFIG };
            Error { code, ..e.context("prevResult") }
        })?),
    };
    let valid_attachments = match obj.get("cni.dev/valid-attachments").or_else(|| obj.get("cni.dev/attachments")) {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            Vec::<Attachment>::deserialize(v).map_err(|e| Error::config(format!("cni.dev/valid-attachments: {e}")))?,
        ),
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

/// Decode a plugin's own keys from the whole netconf; a wrong type is code 7 naming the plugin.
pub fn plugin_conf<T: serde::de::DeserializeOwned>(raw: &Value, plugin: &str) -> Result<T> {
    // From the borrowed tree: a copy of it would double a large configuration's footprint.
    T::deserialize(raw).map_err(|e| Error::config(format!("invalid {plugin} configuration: {e}")))
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
}

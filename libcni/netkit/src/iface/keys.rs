//! Configuration keys interface plugins share: the pod interface's MAC (from the plugin's key,
//! CNI_ARGS, `args` or `runtimeConfig`) and MTU.

use crate::Mac;
use libcni::conf::kind;
use libcni::gojson;
use libcni::{Error, Request, Result};
use serde_json::Value;

/// A MAC address for a pod's interface, as a configuration gives it: six hex bytes, unicast.
fn unicast_mac(s: &str) -> Result<Mac> {
    crate::parse_unicast_mac(s).map_err(|why| Error::config(format!("invalid MAC address {s:?}: {why}")))
}

/// The MAC a runtime asks for, the later source winning: `configured` (a plugin's own `mac` key),
/// `CNI_ARGS MAC`, `args.cni.mac` (only with `args_cni`: bridge reads it, macvlan does not), then
/// `runtimeConfig.mac` (the `mac` capability). Keys are matched as Go does ([`gojson::get`]); an
/// empty string counts as unset.
pub fn requested_mac(req: &Request, configured: Option<&str>, args_cni: bool) -> Result<Option<Mac>> {
    let mut mac = configured.map(str::to_string);
    if let Some(m) = req.args.get("MAC") {
        mac = Some(m.to_string());
    }
    let from_args = gojson::get(&req.conf.args, "cni")
        .filter(|_| args_cni)
        .and_then(|(c, cni)| Some((c, gojson::get(cni.as_object()?, "mac")?)))
        .map(|(c, (k, v))| (format!("args.{c}.{k}"), v));
    let from_runtime = gojson::get(&req.conf.runtime_config, "mac").map(|(k, v)| (format!("runtimeConfig.{k}"), v));
    for (key, v) in [from_args, from_runtime].into_iter().flatten() {
        match v {
            Value::Null => {}
            Value::String(s) if s.is_empty() => {}
            Value::String(s) => mac = Some(s.clone()),
            other => return Err(Error::config(format!("{key} must be a string, got {}", kind(other)))),
        }
    }
    mac.filter(|m| !m.is_empty()).map(|m| unicast_mac(&m)).transpose()
}

/// An `mtu` key: 68-65535, or 0 (absent) for the kernel's default; `None` for the default.
pub fn mtu_key(m: Option<&gojson::Spelled<i64>>) -> Result<Option<u32>> {
    match m {
        None | Some(gojson::Spelled { value: 0, .. }) => Ok(None),
        Some(gojson::Spelled { value: v @ 68..=65535, .. }) => Ok(Some(*v as u32)),
        Some(m) => {
            let key = m.key_or("mtu");
            Err(Error::config(format!("invalid {key} {}: use 68-65535, or 0 for the kernel default", m.value)))
        }
    }
}

//! tuning's keys, `args.cni`, the `mac` capability and CNI_ARGS `MAC`, parsed and validated once.

use libcni::conf::kind;
use libcni::gojson;
use libcni::skel::Request;
use libcni::{Error, Result};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

/// The reference's default directory for the saved original link attributes.
pub const DEFAULT_DATA_DIR: &str = "/run/cni/tuning";

/// The allowlist file current upstream reads: one Go regexp per line; when it exists, every
/// sysctl key must match one of them.
pub const ALLOWLIST: &str = "/etc/cni/tuning/allowlist.conf";

#[derive(Debug, Default, Deserialize)]
struct Raw {
    #[serde(rename = "dataDir")]
    data_dir: Option<String>,
    sysctl: Option<Map<String, Value>>,
    mac: Option<String>,
    promisc: Option<bool>,
    mtu: Option<i64>,
    #[serde(rename = "txQLen")]
    txqlen: Option<i64>,
    allmulti: Option<bool>,
}

/// One sysctl: the key as written (what the allowlist matches) and its file under /proc/sys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysctl {
    pub key: String,
    /// Relative to /proc/sys, `net/...`, with `IFNAME` replaced.
    pub path: String,
    pub value: String,
}

/// tuning's configuration for one attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub data_dir: PathBuf,
    pub sysctls: Vec<Sysctl>,
    pub mac: Option<netkit::Mac>,
    /// Only `true` does anything, as in the reference (`promisc: false` leaves the flag alone).
    pub promisc: bool,
    pub mtu: Option<u32>,
    pub txqlen: Option<u32>,
    pub allmulti: Option<bool>,
}

impl Config {
    /// Any link attribute to change (the original values are then saved).
    pub fn touches_link(&self) -> bool {
        self.mac.is_some() || self.promisc || self.mtu.is_some() || self.txqlen.is_some() || self.allmulti.is_some()
    }

    pub fn parse(req: &Request) -> Result<Config> {
        refuse_duplicate_sysctls(&req.stdin)?;
        parse(&req.raw, &req.conf.args, &req.conf.runtime_config, req.args.get("MAC"), &req.ifname)
    }

    /// Only what DEL needs: the data directory. A DEL whose other keys no longer validate still
    /// restores the link from the saved file.
    pub fn data_dir_for_del(req: &Request) -> Result<PathBuf> {
        netkit::saved::dir_for_del(&req.raw, DEFAULT_DATA_DIR, "tuning")
    }
}

fn data_dir(dir: Option<String>) -> Result<PathBuf> {
    netkit::saved::dir(dir, DEFAULT_DATA_DIR, "tuning")
}

/// `args.cni.<field>`, with the key as written for messages.
fn arg<'a>(args: &'a Map<String, Value>, field: &str) -> Option<(String, &'a Value)> {
    let (c, cni) = gojson::get(args, "cni")?;
    let (k, v) = gojson::get(cni.as_object()?, field)?;
    if v.is_null() {
        return None;
    }
    Some((format!("args.{c}.{k}"), v))
}

fn int(key: &str, v: &Value, max: u32) -> Result<u32> {
    match v.as_i64() {
        Some(n) if (0..=i64::from(max)).contains(&n) => Ok(n as u32),
        Some(n) => Err(Error::config(format!("tuning: {key} {n} is out of range 0-{max}"))),
        None => Err(Error::config(format!("tuning: {key} must be an integer, got {}", kind(v)))),
    }
}

fn boolean(key: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| Error::config(format!("tuning: {key} must be true or false, got {}", kind(v))))
}

/// Parses the netconf. Precedence as the reference: `mac` < CNI_ARGS `MAC` < `runtimeConfig.mac` <
/// `args.cni.mac`; every other `args.cni` key overrides its netconf key, and `args.cni.sysctl`
/// adds to (and overrides keys of) `sysctl`.
pub fn parse(
    raw: &Value,
    args: &Map<String, Value>,
    runtime_config: &Map<String, Value>,
    cni_args_mac: Option<&str>,
    ifname: &str,
) -> Result<Config> {
    let r: Raw = gojson::from_value(raw).map_err(|e| Error::config(format!("invalid tuning configuration: {e}")))?;
    let data_dir = data_dir(r.data_dir)?;

    let mut sysctl_values: Vec<(String, String, Value)> = Vec::new();
    for (k, v) in r.sysctl.iter().flatten() {
        sysctl_values.push((format!("sysctl.{k}"), k.clone(), v.clone()));
    }
    if let Some((key, v)) = arg(args, "sysctl") {
        let obj =
            v.as_object().ok_or_else(|| Error::config(format!("tuning: {key} must be an object, got {}", kind(v))))?;
        for (k, v) in obj {
            sysctl_values.retain(|(_, existing, _)| existing != k);
            sysctl_values.push((format!("{key}.{k}"), k.clone(), v.clone()));
        }
    }
    let mut sysctls = Vec::new();
    for (where_, key, v) in sysctl_values {
        let Value::String(value) = v else {
            return Err(Error::config(format!("tuning: {where_} must be a string, got {}", kind(&v))));
        };
        if value.contains('\0') {
            return Err(Error::config(format!("tuning: {where_} contains a NUL byte")));
        }
        let path = sysctl_path(&key, ifname)?;
        sysctls.push(Sysctl { key, path, value });
    }

    let mut mac_text: Option<(String, String)> = r.mac.map(|m| ("mac".to_string(), m));
    if let Some(m) = cni_args_mac.filter(|m| !m.is_empty()) {
        mac_text = Some(("CNI_ARGS MAC".to_string(), m.to_string()));
    }
    let from_runtime = gojson::get(runtime_config, "mac")
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (format!("runtimeConfig.{k}"), v));
    for (key, v) in [from_runtime, arg(args, "mac")].into_iter().flatten() {
        match v {
            Value::String(s) if s.is_empty() => {}
            Value::String(s) => mac_text = Some((key, s.clone())),
            other => return Err(Error::config(format!("tuning: {key} must be a string, got {}", kind(other)))),
        }
    }
    let mac = match mac_text.filter(|(_, m)| !m.is_empty()) {
        None => None,
        Some((key, m)) => Some(parse_mac(&m).map_err(|why| Error::config(format!("tuning: {key} {m:?}: {why}")))?),
    };

    let mut promisc = r.promisc.unwrap_or(false);
    if let Some((key, v)) = arg(args, "promisc") {
        promisc = boolean(&key, v)?;
    }
    let mut allmulti = r.allmulti;
    if let Some((key, v)) = arg(args, "allmulti") {
        allmulti = Some(boolean(&key, v)?);
    }
    // The kernel's MTU is an unsigned 32-bit value, but no link takes more than 64 KiB - 1 (and
    // loopback's 64 KiB); 0 means "not set", as in the reference.
    let mut mtu = match r.mtu {
        Some(n) => Some(int("mtu", &Value::from(n), 65536)?).filter(|m| *m != 0),
        None => None,
    };
    if let Some((key, v)) = arg(args, "mtu") {
        mtu = Some(int(&key, v, 65536)?).filter(|m| *m != 0);
    }
    let mut txqlen = match r.txqlen {
        Some(n) => Some(int("txQLen", &Value::from(n), i32::MAX as u32)?),
        None => None,
    };
    if let Some((key, v)) = arg(args, "txQLen") {
        txqlen = Some(int(&key, v, i32::MAX as u32)?);
    }
    Ok(Config { data_dir, sysctls, mac, promisc, mtu, txqlen, allmulti })
}

/// The sysctl file for `key` relative to /proc/sys, as the reference maps it: every `.` becomes
/// `/` (so `net/ipv4/ip_forward` and `net.ipv4.ip_forward` are the same key), then the first
/// `IFNAME` becomes the interface name (which may itself contain dots, as /proc/sys spells it).
/// Only plain paths under `net/` pass: a key with `..`, an empty or `.` component, or another tree
/// is refused (7). /proc/sys holds no symlinks, so a plain path under net/ cannot leave it.
pub fn sysctl_path(key: &str, ifname: &str) -> Result<String> {
    let refuse = |why: &str| {
        Error::config(format!(
            "tuning: sysctl key {key:?} {why}: only keys under net. are allowed (like net.ipv4.conf.IFNAME.rp_filter)"
        ))
    };
    if key.contains("..") {
        return Err(refuse("contains \"..\""));
    }
    if key.contains('\0') {
        return Err(refuse("contains a NUL byte"));
    }
    let path = key.replace('.', "/").replacen("IFNAME", ifname, 1);
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() < 2 || parts[0] != "net" {
        return Err(refuse("is outside net"));
    }
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return Err(refuse("has an empty, \".\" or \"..\" component"));
    }
    Ok(path)
}

pub use netkit::parse_unicast_mac as parse_mac;

/// The reference refuses a `sysctl` object that names one key twice ("duplicated sysctl keys are
/// not allowed"): JSON decoders keep one of the two silently, so the other value would be lost.
fn refuse_duplicate_sysctls(stdin: &[u8]) -> Result<()> {
    struct Top;
    struct Keys;
    impl<'de> Visitor<'de> for Top {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
            let mut dup = None;
            while let Some(k) = map.next_key::<String>()? {
                if gojson::fold_eq(&k, "sysctl") {
                    if let Some(d) = map.next_value_seed(Keys)? {
                        dup = Some(d);
                    }
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(dup)
        }
    }
    impl<'de> de::DeserializeSeed<'de> for Keys {
        type Value = Option<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
            let mut seen = BTreeSet::new();
            let mut dup = None;
            while let Some(k) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if !seen.insert(k.clone()) {
                    dup = Some(k);
                }
            }
            Ok(dup)
        }
        // Other types are reported by the typed decode with the key's name.
        fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }
    let mut d = serde_json::Deserializer::from_slice(stdin);
    match d.deserialize_map(Top) {
        Ok(Some(k)) => Err(Error::config(format!(
            "tuning: sysctl key {k:?} is given twice: duplicated sysctl keys are not allowed"
        ))),
        // skel already parsed stdin; anything this pass cannot read is the typed decode's to report.
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(raw: Value) -> Result<Config> {
        let args = raw.get("args").and_then(Value::as_object).cloned().unwrap_or_default();
        let rc = raw.get("runtimeConfig").and_then(Value::as_object).cloned().unwrap_or_default();
        parse(&raw, &args, &rc, None, "eth0")
    }

    #[test]
    fn defaults() {
        let c = p(json!({"cniVersion": "1.0.0", "name": "n", "type": "tuning"})).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/run/cni/tuning"));
        assert!(c.sysctls.is_empty());
        assert_eq!((c.mac, c.promisc, c.mtu, c.txqlen, c.allmulti), (None, false, None, None, None));
        assert!(!c.touches_link());
    }

    #[test]
    fn every_key() {
        let c = p(json!({"type": "tuning", "dataDir": "/tmp/t", "mac": "0A:58:0a:f4:01:02", "promisc": true,
            "mtu": 1400, "txQLen": 0, "allmulti": false,
            "sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "2", "net/core/somaxconn": "512"}}))
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/t"));
        assert_eq!(c.mac, Some(netkit::Mac([0x0a, 0x58, 0x0a, 0xf4, 1, 2])));
        assert!(c.promisc);
        assert_eq!((c.mtu, c.txqlen, c.allmulti), (Some(1400), Some(0), Some(false)));
        let paths: Vec<&str> = c.sysctls.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(paths, ["net/ipv4/conf/eth0/rp_filter", "net/core/somaxconn"]);
        assert!(c.touches_link());
        // Go's key matching: DataDir, MTU, TxQLen spelled differently.
        let c = p(json!({"DataDir": "/x", "MTU": 9000, "TXQLEN": 5, "Sysctl": {"net.core.somaxconn": "1"}})).unwrap();
        assert_eq!((c.data_dir, c.mtu, c.txqlen, c.sysctls.len()), (PathBuf::from("/x"), Some(9000), Some(5), 1));
        assert_eq!(p(json!({"mtu": 0})).unwrap().mtu, None);
    }

    #[test]
    fn mac_precedence_is_the_references() {
        let raw = json!({"mac": "02:00:00:00:00:01"});
        let m = |raw: &Value, env: Option<&str>| {
            let args = raw.get("args").and_then(Value::as_object).cloned().unwrap_or_default();
            let rc = raw.get("runtimeConfig").and_then(Value::as_object).cloned().unwrap_or_default();
            parse(raw, &args, &rc, env, "eth0").unwrap().mac.unwrap().octets()[5]
        };
        assert_eq!(m(&raw, None), 1);
        assert_eq!(m(&raw, Some("02:00:00:00:00:02")), 2);
        let raw = json!({"mac": "02:00:00:00:00:01", "runtimeConfig": {"mac": "02-00-00-00-00-03"}});
        assert_eq!(m(&raw, Some("02:00:00:00:00:02")), 3);
        let raw = json!({"mac": "02:00:00:00:00:01", "runtimeConfig": {"mac": "0200.0000.0003"},
            "args": {"cni": {"mac": "02:00:00:00:00:04"}}});
        assert_eq!(m(&raw, None), 4);
    }

    #[test]
    fn args_cni_override_and_merge() {
        let c =
            p(json!({"promisc": true, "mtu": 1400, "sysctl": {"net.core.somaxconn": "1", "net.ipv4.ip_forward": "0"},
            "args": {"cni": {"promisc": false, "mtu": 1300, "allmulti": true, "txQLen": 7,
                "sysctl": {"net.core.somaxconn": "2"}}}}))
            .unwrap();
        assert!(!c.promisc);
        assert_eq!((c.mtu, c.allmulti, c.txqlen), (Some(1300), Some(true), Some(7)));
        let kv: Vec<(&str, &str)> = c.sysctls.iter().map(|s| (s.key.as_str(), s.value.as_str())).collect();
        assert_eq!(kv, [("net.ipv4.ip_forward", "0"), ("net.core.somaxconn", "2")]);
    }

    #[test]
    fn errors_name_the_key() {
        for (raw, needle) in [
            (json!({"mtu": -1}), "mtu -1 is out of range"),
            (json!({"mtu": 70000}), "mtu 70000"),
            (json!({"txQLen": -3}), "txQLen -3"),
            (json!({"mac": "zz"}), "mac \"zz\""),
            (json!({"mac": "01:00:5e:00:00:01"}), "multicast"),
            (json!({"runtimeConfig": {"mac": 5}}), "runtimeConfig.mac must be a string"),
            (json!({"args": {"cni": {"mtu": "x"}}}), "args.cni.mtu must be an integer"),
            (json!({"args": {"cni": {"promisc": 1}}}), "args.cni.promisc must be true or false"),
            (json!({"sysctl": {"net.core.somaxconn": 1}}), "sysctl.net.core.somaxconn must be a string"),
            (json!({"sysctl": {"kernel.hostname": "x"}}), "\"kernel.hostname\" is outside net"),
            (json!({"dataDir": "relative"}), "dataDir \"relative\" must be an absolute path"),
            (json!({"promisc": "yes"}), "promisc"),
        ] {
            let e = p(raw.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{raw}");
            assert!(e.msg.contains(needle), "{raw}: {}", e.msg);
        }
    }

    #[test]
    fn sysctl_keys_stay_under_net() {
        assert_eq!(
            sysctl_path("net.ipv4.conf.IFNAME.rp_filter", "eth0.100").unwrap(),
            "net/ipv4/conf/eth0.100/rp_filter"
        );
        // Only the first IFNAME is replaced, as in the reference.
        assert_eq!(sysctl_path("net.IFNAME.IFNAME", "e0").unwrap(), "net/e0/IFNAME");
        assert_eq!(sysctl_path("net/ipv6/conf/all/forwarding", "e0").unwrap(), "net/ipv6/conf/all/forwarding");
        for bad in [
            "kernel.hostname",
            "kernel/hostname",
            "net/../kernel/hostname",
            "net.ipv4.conf.IFNAME.../../../..",
            "net..ipv4",
            "/proc/sys/net/ipv4/ip_forward",
            "net",
            "net.",
            "netx.y",
            "",
            "vm.overcommit_memory",
        ] {
            let e = sysctl_path(bad, "eth0").unwrap_err();
            assert_eq!(e.code, 7, "{bad}");
        }
    }

    #[test]
    fn duplicate_sysctl_keys_are_refused() {
        let e = refuse_duplicate_sysctls(br#"{"sysctl": {"net.core.somaxconn": "1", "net.core.somaxconn": "2"}}"#)
            .unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("net.core.somaxconn"));
        refuse_duplicate_sysctls(br#"{"sysctl": {"net.a": "1", "net.b": "2"}, "x": [1, {"y": null}]}"#).unwrap();
        refuse_duplicate_sysctls(br#"{"sysctl": null}"#).unwrap();
    }

    #[test]
    fn macs() {
        assert_eq!(parse_mac("aa-bb-cc-dd-ee-f0").unwrap().octets(), [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xf0]);
        assert_eq!(parse_mac("aabb.ccdd.eef0").unwrap().octets(), [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xf0]);
        for bad in
            ["", "aa:bb:cc:dd:ee", "aa:bb:cc:dd:ee:ff:00", "aa:bb-cc:dd:ee:f0", "aabbccddeef0", "gg:bb:cc:dd:ee:f0"]
        {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
    }
}

//! The tap plugin's keys (`mac`, `mtu`, `multiQueue`, `owner`, `group`, `bridge`,
//! `selinuxContext`), parsed and validated once; problems are code 7 naming the key as written.

use libcni::conf::{kind, lenient_bool, NetConf};
use libcni::gojson::{self, Spelled};
use libcni::skel::validate_ifname;
use libcni::types::Dns;
use libcni::{code, Error, Result};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    mac: Option<Spelled<String>>,
    mtu: Option<Spelled<i64>>,
    #[serde(default, deserialize_with = "lenient_bool")]
    multi_queue: bool,
    owner: Option<Spelled<i64>>,
    group: Option<Spelled<i64>>,
    bridge: Option<Spelled<String>>,
    selinux_context: Option<Spelled<String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TapConf {
    /// runtimeConfig.mac, else CNI_ARGS `MAC`, else `mac`.
    pub mac: Option<netkit::Mac>,
    pub mtu: Option<u32>,
    pub multi_queue: bool,
    pub owner: Option<u32>,
    pub group: Option<u32>,
    /// A bridge in the pod's namespace to make the tap a port of.
    pub bridge: Option<String>,
    /// None: layer 2 only.
    pub ipam_type: Option<String>,
    pub dns: Option<Dns>,
}

/// Where the kernel shows SELinux when it is on.
const SELINUX_FS: &str = "/sys/fs/selinux/enforce";

fn parse_mac(key: &str, s: &str) -> Result<netkit::Mac> {
    netkit::parse_unicast_mac(s).map_err(|why| Error::config(format!("{key}: invalid MAC address {s:?}: {why}")))
}

fn id(v: Spelled<i64>, name: &str) -> Result<u32> {
    u32::try_from(v.value)
        .map_err(|_| Error::config(format!("{}: invalid {name} id {}: use 0-4294967295", v.key_or(name), v.value)))
}

/// `args` is CNI_ARGS' `MAC`, if given.
pub fn parse(raw: &Value, conf: &NetConf, args_mac: Option<&str>) -> Result<TapConf> {
    parse_with(raw, conf, args_mac, Path::new(SELINUX_FS).exists())
}

fn parse_with(raw: &Value, conf: &NetConf, args_mac: Option<&str>, selinux: bool) -> Result<TapConf> {
    let r: Raw = libcni::conf::plugin_conf(raw, "tap")?;
    let mut mac = None;
    if let Some(m) = r.mac.filter(|m| !m.value.is_empty()) {
        mac = Some(parse_mac(m.key_or("mac"), &m.value)?);
    }
    if let Some(m) = args_mac.filter(|m| !m.is_empty()) {
        mac = Some(parse_mac("CNI_ARGS MAC", m)?);
    }
    if let Some((k, v)) = gojson::non_null(&conf.runtime_config, "mac") {
        let key = format!("runtimeConfig.{k}");
        let s = v.as_str().ok_or_else(|| Error::config(format!("{key} must be a string, got {}", kind(v))))?;
        if !s.is_empty() {
            mac = Some(parse_mac(&key, s)?);
        }
    }
    let mtu = match r.mtu {
        None | Some(Spelled { value: 0, .. }) => None,
        Some(Spelled { value: m @ 68..=65535, .. }) => Some(m as u32),
        Some(m) => {
            let key = m.key_or("mtu");
            return Err(Error::config(format!("{key}: invalid MTU {}: use 68-65535, or 0 for the default", m.value)));
        }
    };
    let bridge = match r.bridge.filter(|b| !b.value.is_empty()) {
        Some(b) => {
            validate_ifname(&b.value).map_err(|e| Error::config(format!("{}: {}", b.key_or("bridge"), e.msg)))?;
            Some(b.value)
        }
        None => None,
    };
    if let Some(ctx) = r.selinux_context.filter(|c| !c.value.is_empty() && selinux) {
        return Err(Error::new(
            code::UNSUPPORTED_FIELD,
            format!(
                "{}: SELinux is enabled on this node and labelling the tap device with {:?} is not supported; \
                 leave the key out (it is ignored where SELinux is off)",
                ctx.key_or("selinuxContext"),
                ctx.value
            ),
        ));
    }
    Ok(TapConf {
        mac,
        mtu,
        multi_queue: r.multi_queue,
        owner: r.owner.map(|o| id(o, "owner")).transpose()?,
        group: r.group.map(|g| id(g, "group")).transpose()?,
        bridge,
        ipam_type: netkit::iface::ipam::plugin(conf)?.map(str::to_string),
        dns: conf.dns.clone(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_json(extra: Value, args_mac: Option<&str>, selinux: bool) -> Result<TapConf> {
        let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "tap"});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        parse_with(&v, &libcni::conf::netconf_from_value(&v).unwrap(), args_mac, selinux)
    }

    #[test]
    fn every_key_and_defaults() {
        let c = parse_json(json!({}), None, false).unwrap();
        assert_eq!(
            c,
            TapConf {
                mac: None,
                mtu: None,
                multi_queue: false,
                owner: None,
                group: None,
                bridge: None,
                ipam_type: None,
                dns: None
            }
        );
        let c = parse_json(
            json!({"mac": "0a:58:0a:f4:01:02", "mtu": 1400, "multiQueue": true, "owner": 1000, "group": 0,
                "bridge": "br0", "selinuxContext": "system_u:system_r:container_t:s0",
                "ipam": {"type": "host-local"}}),
            None,
            false,
        )
        .unwrap();
        assert_eq!(c.mac, Some(netkit::Mac([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x02])));
        assert_eq!((c.mtu, c.multi_queue, c.owner, c.group), (Some(1400), true, Some(1000), Some(0)));
        assert_eq!((c.bridge.as_deref(), c.ipam_type.as_deref()), (Some("br0"), Some("host-local")));
        // Every form Go's net.ParseMAC reads.
        let dotted = parse_json(json!({"mac": "0a58.0af4.0102"}), None, false).unwrap();
        assert_eq!(dotted.mac, Some(netkit::Mac([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x02])));
        // Go's key matching: the reference's struct fields are MultiQueue, MTU, Mac, Owner, ...
        let c = parse_json(json!({"MultiQueue": "true", "MTU": 9000, "Owner": 7}), None, false).unwrap();
        assert_eq!((c.multi_queue, c.mtu, c.owner), (true, Some(9000), Some(7)));
    }

    #[test]
    fn mac_precedence_runtime_then_cni_args_then_key() {
        let m = |s: &str| s.parse::<netkit::Mac>().ok();
        let key = json!({"mac": "0a:00:00:00:00:01"});
        assert_eq!(parse_json(key.clone(), None, false).unwrap().mac, m("0a:00:00:00:00:01"));
        assert_eq!(parse_json(key.clone(), Some("0a:00:00:00:00:02"), false).unwrap().mac, m("0a:00:00:00:00:02"));
        let mut all = key;
        all["runtimeConfig"] = json!({"mac": "0a:00:00:00:00:03"});
        assert_eq!(parse_json(all, Some("0a:00:00:00:00:02"), false).unwrap().mac, m("0a:00:00:00:00:03"));
    }

    #[test]
    fn selinux_context_is_ignored_without_selinux_and_refused_with_it() {
        let ctx = json!({"selinuxContext": "system_u:system_r:container_t:s0"});
        assert!(parse_json(ctx.clone(), None, false).is_ok());
        let e = parse_json(ctx, None, true).unwrap_err();
        assert_eq!(e.code, 2, "{e}");
        assert!(e.msg.starts_with("selinuxContext: SELinux is enabled"), "{}", e.msg);
        assert!(parse_json(json!({"selinuxContext": ""}), None, true).is_ok());
    }

    #[test]
    fn errors_are_code_7_and_name_the_key() {
        for (extra, args, needle) in [
            (json!({"mac": "0a:58"}), None, "mac: invalid MAC"),
            (json!({"mac": "01:00:5e:00:00:01"}), None, "a multicast address cannot name an interface"),
            (json!({"mac": 5}), None, "mac"),
            (json!({}), Some("zz"), "CNI_ARGS MAC: invalid MAC"),
            (json!({"runtimeConfig": {"mac": 5}}), None, "runtimeConfig.mac must be a string"),
            (json!({"runtimeConfig": {"Mac": "x"}}), None, "runtimeConfig.Mac: invalid MAC"),
            (json!({"mtu": 67}), None, "mtu: invalid MTU 67"),
            (json!({"MTU": -1}), None, "MTU: invalid MTU -1"),
            (json!({"mtu": "1500"}), None, "mtu"),
            (json!({"multiQueue": 1}), None, "multiQueue"),
            (json!({"owner": -1}), None, "owner: invalid owner id -1"),
            (json!({"group": 4294967296u64}), None, "group: invalid group id"),
            (json!({"owner": "root"}), None, "owner"),
            (json!({"bridge": "a/b"}), None, "bridge: "),
            (json!({"bridge": 5}), None, "bridge"),
            (json!({"selinuxContext": 5}), None, "selinuxContext"),
        ] {
            let e = parse_json(extra.clone(), args, false).unwrap_err();
            assert_eq!(e.code, 7, "{extra}: {e}");
            assert!(e.msg.contains(needle), "{extra}: {:?} lacks {needle:?}", e.msg);
        }
    }
}

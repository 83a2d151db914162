//! The vlan plugin's keys (`master`, `vlanId`, `mtu`, `linkInContainer`), parsed and validated once;
//! problems are code 7 naming the key as written.

use libcni::conf::{lenient_bool, NetConf};
use libcni::gojson::Spelled;
use libcni::skel::validate_ifname;
use libcni::types::Dns;
use libcni::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    master: Option<Spelled<String>>,
    vlan_id: Option<Spelled<i64>>,
    mtu: Option<Spelled<i64>>,
    #[serde(default, deserialize_with = "lenient_bool")]
    link_in_container: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VlanConf {
    /// The parent link, on the host (or in the pod with `link_in_container`).
    pub master: String,
    /// 0-4094, as the reference takes it (0: priority-tagged frames only).
    pub vlan_id: u16,
    /// None: the kernel's default, the master's MTU. Checked against the master's at ADD.
    pub mtu: Option<u32>,
    /// `mtu` as written, for messages.
    pub mtu_key: String,
    pub link_in_container: bool,
    pub ipam_type: String,
    pub dns: Option<Dns>,
}

pub fn parse(raw: &Value, conf: &NetConf) -> Result<VlanConf> {
    let r: Raw = libcni::conf::plugin_conf(raw, "vlan")?;
    let master = match r.master {
        Some(m) if !m.value.is_empty() => {
            validate_ifname(&m.value).map_err(|e| Error::config(format!("{}: {}", m.key_or("master"), e.msg)))?;
            m.value
        }
        _ => {
            return Err(Error::config(
                "master: the vlan plugin needs \"master\", the interface to create the VLAN on (e.g. \"eth0\")",
            ))
        }
    };
    let vlan_id = match r.vlan_id {
        None => 0,
        Some(v) => u16::try_from(v.value)
            .ok()
            .filter(|id| *id <= 4094)
            .ok_or_else(|| Error::config(format!("{}: invalid VLAN id {}: use 0-4094", v.key_or("vlanId"), v.value)))?,
    };
    let mtu_key = r.mtu.as_ref().map_or("mtu", |m| m.key_or("mtu")).to_string();
    let mtu = match r.mtu {
        None | Some(Spelled { value: 0, .. }) => None,
        Some(Spelled { value: m @ 68..=65535, .. }) => Some(m as u32),
        Some(m) => {
            return Err(Error::config(format!(
                "{mtu_key}: invalid MTU {}: use 68 up to the master's MTU, or 0 for the master's",
                m.value
            )))
        }
    };
    let ipam_type = netkit::iface::ipam::plugin(conf)?.map(str::to_string).ok_or_else(|| {
        Error::config("ipam: the vlan plugin needs an IPAM configuration (\"ipam\": {\"type\": ...})")
    })?;
    Ok(VlanConf {
        master,
        vlan_id,
        mtu,
        mtu_key,
        link_in_container: r.link_in_container,
        ipam_type,
        dns: conf.dns.clone(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_json(extra: Value) -> Result<VlanConf> {
        let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "vlan", "master": "eth0",
            "ipam": {"type": "host-local"}});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        parse(&v, &libcni::conf::netconf_from_value(&v).unwrap())
    }

    #[test]
    fn every_key_and_defaults() {
        let c = parse_json(json!({})).unwrap();
        assert_eq!((c.master.as_str(), c.vlan_id, c.mtu, c.link_in_container), ("eth0", 0, None, false));
        assert_eq!(c.ipam_type, "host-local");
        let c = parse_json(json!({"vlanId": 4094, "mtu": 1400, "linkInContainer": true,
            "dns": {"nameservers": ["10.0.0.53"]}}))
        .unwrap();
        assert_eq!((c.vlan_id, c.mtu, c.link_in_container), (4094, Some(1400), true));
        assert_eq!(c.dns.unwrap().nameservers, ["10.0.0.53"]);
        // Go's key matching: a runtime that marshals the reference's struct sends its field names.
        let v = json!({"cniVersion": "1.0.0", "name": "n", "Master": "ens3", "VlanID": 7, "MTU": 0,
            "LinkInContainer": "true", "IPAM": {"Type": "host-local"}});
        let c = parse(&v, &libcni::conf::netconf_from_value(&v).unwrap()).unwrap();
        assert_eq!((c.master.as_str(), c.vlan_id, c.mtu, c.link_in_container), ("ens3", 7, None, true));
    }

    #[test]
    fn errors_are_code_7_and_name_the_key() {
        for (extra, needle) in [
            (json!({"master": ""}), "master: "),
            (json!({"master": null}), "master: "),
            (json!({"master": "a/b"}), "master: "),
            (json!({"master": "0123456789abcdef"}), "master: "),
            (json!({"master": 5}), "master"),
            (json!({"vlanId": -1}), "vlanId: invalid VLAN id -1"),
            (json!({"vlanId": 4095}), "vlanId: invalid VLAN id 4095"),
            (json!({"VLANID": 70000}), "VLANID: invalid VLAN id 70000"),
            (json!({"vlanId": "10"}), "vlanId"),
            (json!({"mtu": -1}), "mtu: invalid MTU -1"),
            (json!({"mtu": 67}), "mtu: invalid MTU 67"),
            (json!({"MTU": 70000}), "MTU: invalid MTU 70000"),
            (json!({"mtu": 1.5}), "mtu"),
            (json!({"linkInContainer": 1}), "linkInContainer"),
            (json!({"ipam": {}}), "ipam: "),
        ] {
            let e = parse_json(extra.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{extra}: {e}");
            assert!(e.msg.contains(needle), "{extra}: {:?} lacks {needle:?}", e.msg);
        }
        let mut v = json!({"cniVersion": "1.0.0", "name": "n", "master": "eth0"});
        let e = parse(&v, &libcni::conf::netconf_from_value(&v).unwrap()).unwrap_err();
        assert!(e.msg.starts_with("ipam: "), "{}", e.msg);
        v["ipam"] = json!({"type": "a/b"});
        assert_eq!(parse(&v, &libcni::conf::netconf_from_value(&v).unwrap()).unwrap_err().code, 7);
    }
}

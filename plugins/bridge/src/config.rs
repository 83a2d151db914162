//! The bridge plugin's keys, parsed and validated once; later code never touches raw JSON.

use libcni::conf::lenient_bool;
use libcni::gojson::Spelled;
use libcni::skel::{validate_ifname, Request};
use libcni::types::Dns;
use libcni::{Error, Result};
use netkit::firewall;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    bridge: Option<Spelled<String>>,
    #[serde(default, deserialize_with = "lenient_bool")]
    is_gateway: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    is_default_gateway: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    force_address: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    ip_masq: bool,
    ip_masq_backend: Option<Spelled<String>>,
    mtu: Option<Spelled<i64>>,
    #[serde(default, deserialize_with = "lenient_bool")]
    hairpin_mode: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    promisc_mode: bool,
    vlan: Option<Spelled<i64>>,
    vlan_trunk: Option<Vec<TrunkRaw>>,
    #[serde(default, deserialize_with = "lenient_bool")]
    preserve_default_vlan: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    macspoofchk: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    enabledad: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    disable_container_interface: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    port_isolation: bool,
}

#[derive(Debug, Clone, Deserialize)]
struct TrunkRaw {
    #[serde(rename = "minID")]
    min_id: Option<i64>,
    #[serde(rename = "maxID")]
    max_id: Option<i64>,
    id: Option<i64>,
}

/// A validated bridge configuration with defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct BridgeConf {
    pub network: String,
    pub bridge: String,
    pub is_gateway: bool,
    pub is_default_gateway: bool,
    pub force_address: bool,
    /// Where masquerade rules go when `ipMasq` is set.
    pub ip_masq: Option<IpMasq>,
    pub mtu: Option<u32>,
    pub hairpin: bool,
    pub promisc: bool,
    /// PVID of the host port; 0 = no VLAN.
    pub vlan: u16,
    /// Inclusive VLAN ranges tagged on the port.
    pub vlan_trunk: Vec<(u16, u16)>,
    pub preserve_default_vlan: bool,
    pub macspoofchk: bool,
    pub enable_dad: bool,
    pub disable_container_interface: bool,
    pub port_isolation: bool,
    pub ipam_type: Option<String>,
    pub dns: Option<Dns>,
    /// From CNI_ARGS MAC < args.cni.mac < runtimeConfig.mac.
    pub mac: Option<netkit::Mac>,
}

pub use netkit::firewall::IpMasq;

impl BridgeConf {
    pub fn vlan_filtering(&self) -> bool {
        self.vlan != 0 || !self.vlan_trunk.is_empty()
    }
}

/// The host interface holding the gateway of VLAN `vid` on `bridge` (the reference's name).
pub fn vlan_gateway_name(bridge: &str, vid: u16) -> String {
    format!("{bridge}.{vid}")
}

fn vlan_id(v: i64, what: &str) -> Result<u16> {
    if (1..=4094).contains(&v) {
        Ok(v as u16)
    } else {
        Err(Error::config(format!("invalid {what} {v}: VLAN ids are 1-4094")))
    }
}

pub use libcni::invoke::valid_plugin_type;

pub fn parse(req: &Request) -> Result<BridgeConf> {
    let raw: Raw = req.plugin_conf()?;
    let (bridge_key, bridge) = match raw.bridge {
        Some(b) if !b.value.is_empty() => (b.key_or("bridge").to_string(), b.value),
        _ => ("bridge".to_string(), "cni0".to_string()),
    };
    validate_ifname(&bridge).map_err(|e| Error::config(format!("{bridge_key} name: {}", e.msg)))?;
    let mtu = netkit::iface::keys::mtu_key(raw.mtu.as_ref())?;
    let vlan = match &raw.vlan {
        None | Some(Spelled { value: 0, .. }) => 0,
        Some(v) => vlan_id(v.value, v.key_or("vlan"))?,
    };
    let mut vlan_trunk = Vec::new();
    for t in raw.vlan_trunk.unwrap_or_default() {
        match (t.id, t.min_id, t.max_id) {
            (Some(id), None, None) => {
                let id = vlan_id(id, "vlanTrunk id")?;
                vlan_trunk.push((id, id));
            }
            (None, Some(lo), Some(hi)) => {
                let (lo, hi) = (vlan_id(lo, "vlanTrunk minID")?, vlan_id(hi, "vlanTrunk maxID")?);
                if lo > hi {
                    return Err(Error::config(format!("vlanTrunk minID {lo} is above maxID {hi}")));
                }
                vlan_trunk.push((lo, hi));
            }
            _ => return Err(Error::config("each vlanTrunk entry needs either \"id\" or both \"minID\" and \"maxID\"")),
        }
    }
    if (raw.is_gateway || raw.is_default_gateway) && vlan != 0 {
        let name = vlan_gateway_name(&bridge, vlan);
        if name.len() > 15 {
            return Err(Error::config(format!(
                "bridge name {bridge:?} is too long for the gateway interface of vlan {vlan}: {name:?} is over 15 \
                 bytes; use a bridge name of at most {} bytes",
                15 - (name.len() - bridge.len())
            )));
        }
    }
    if raw.hairpin_mode && raw.promisc_mode {
        return Err(Error::config("hairpinMode and promiscMode cannot both be set"));
    }
    let ipam_type = req.conf.ipam_type().map(str::to_string);
    if raw.disable_container_interface && ipam_type.is_some() {
        return Err(Error::config(
            "disableContainerInterface cannot be used with ipam: an interface that stays down cannot hold addresses",
        ));
    }
    if let Some(t) = &ipam_type {
        if !valid_plugin_type(t) {
            return Err(Error::config(format!("invalid ipam type {t:?}: a plugin name cannot contain '/'")));
        }
    }
    if raw.is_default_gateway && ipam_type.is_none() {
        return Err(Error::config("isDefaultGateway needs an ipam plugin to learn the gateway address"));
    }
    let ip_masq = firewall::ip_masq(raw.ip_masq, raw.ip_masq_backend.as_ref())?;
    Ok(BridgeConf {
        network: req.conf.name.clone(),
        bridge,
        is_gateway: raw.is_gateway || raw.is_default_gateway,
        is_default_gateway: raw.is_default_gateway,
        force_address: raw.force_address,
        ip_masq,
        mtu,
        hairpin: raw.hairpin_mode,
        promisc: raw.promisc_mode,
        vlan,
        vlan_trunk,
        preserve_default_vlan: raw.preserve_default_vlan,
        macspoofchk: raw.macspoofchk,
        enable_dad: raw.enabledad,
        disable_container_interface: raw.disable_container_interface,
        port_isolation: raw.port_isolation,
        ipam_type,
        dns: req.conf.dns.clone(),
        // CNI_ARGS MAC < args.cni.mac < runtimeConfig.mac.
        mac: netkit::iface::keys::requested_mac(req, None, true)?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use netkit::firewall::BackendKind;
    use serde_json::{json, Value};

    fn parse_conf(raw: Value) -> Result<BridgeConf> {
        parse(&crate::tests::request(raw))
    }

    /// Keys as Go's decoder takes them (the reference bridge's struct fields are `IsGW`, `IPMasq`, ...
    /// with camelCase tags; a Go runtime that marshals an untagged struct sends the field names).
    #[test]
    fn go_style_keys() {
        let c = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge",
            "Bridge": "br9", "IsGateway": true, "IPMasq": "true", "IPMasqBackend": "iptables", "MTU": 1400,
            "HairpinMode": true, "Vlan": 5, "VlanTrunk": [{"MinID": 10, "MaxID": 20}, {"ID": 30}],
            "IPAM": {"Type": "host-local"}, "Args": {"CNI": {"MAC": "0a:58:0a:f4:01:02"}},
            "RuntimeConfig": {"Mac": "0a:58:0a:f4:01:03"}}))
        .unwrap();
        assert_eq!(c.bridge, "br9");
        assert!(c.is_gateway && c.hairpin);
        assert_eq!(c.ip_masq, Some(IpMasq { backend: BackendKind::Iptables, detected: false }));
        assert_eq!((c.mtu, c.vlan), (Some(1400), 5));
        assert_eq!(c.vlan_trunk, [(10, 20), (30, 30)]);
        assert_eq!(c.ipam_type.as_deref(), Some("host-local"));
        assert_eq!(c.mac, Some(netkit::Mac([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03])));
        // Exact beats folded; unknown keys are ignored as before.
        let c = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", "isGateway": false, "IsGateway": true,
            "Whatever": 1}))
        .unwrap();
        assert!(!c.is_gateway);
        // A wrong type names the key as written.
        let e = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", "IPMasq": 3})).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("IPMasq: expected true or false"), "{}", e.msg);
        for (key, value, needle) in [
            ("MTU", json!(40), "invalid MTU 40"),
            ("VLAN", json!(5000), "invalid VLAN 5000"),
            ("IPMasqBackend", json!("pf"), "invalid IPMasqBackend \"pf\""),
            ("Bridge", json!("br/0"), "Bridge name"),
        ] {
            let e = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", key: value})).unwrap_err();
            assert_eq!(e.code, 7);
            assert!(e.msg.contains(needle), "{} lacks {needle}", e.msg);
        }
        let e = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", "RuntimeConfig": {"MAC": 5}})).unwrap_err();
        assert!(e.msg.contains("runtimeConfig.MAC must be a string"), "{}", e.msg);
    }
}

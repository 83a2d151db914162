//! The bridge plugin's keys, parsed and validated once; later code never touches raw JSON.

use libcni::conf::{kind, lenient_bool};
use libcni::skel::{validate_ifname, Request};
use libcni::types::Dns;
use libcni::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    bridge: Option<String>,
    #[serde(default, deserialize_with = "lenient_bool")]
    is_gateway: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    is_default_gateway: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    force_address: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    ip_masq: bool,
    ip_masq_backend: Option<String>,
    mtu: Option<i64>,
    #[serde(default, deserialize_with = "lenient_bool")]
    hairpin_mode: bool,
    #[serde(default, deserialize_with = "lenient_bool")]
    promisc_mode: bool,
    vlan: Option<i64>,
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
    pub ip_masq: bool,
    pub ip_masq_backend: Option<String>,
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
    pub mac: Option<[u8; 6]>,
}

impl BridgeConf {
    pub fn vlan_filtering(&self) -> bool {
        self.vlan != 0 || !self.vlan_trunk.is_empty()
    }
}

pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let bad = || Error::config(format!("invalid MAC address {s:?}: expected six hex bytes like 0a:58:0a:f4:01:02"));
    let mut out = [0u8; 6];
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(bad());
    }
    for (o, p) in out.iter_mut().zip(parts) {
        if p.len() != 2 {
            return Err(bad());
        }
        *o = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if out[0] & 1 == 1 {
        return Err(Error::config(format!("invalid MAC address {s:?}: a multicast address cannot name an interface")));
    }
    Ok(out)
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

fn mac_from(req: &Request) -> Result<Option<[u8; 6]>> {
    let mut mac = req.args.get("MAC").map(str::to_string);
    if let Some(v) = req.conf.args.get("cni").and_then(|c| c.get("mac")) {
        match v {
            Value::String(s) => mac = Some(s.clone()),
            other => return Err(Error::config(format!("args.cni.mac must be a string, got {}", kind(other)))),
        }
    }
    if let Some(v) = req.conf.runtime_config.get("mac") {
        match v {
            Value::String(s) => mac = Some(s.clone()),
            other => return Err(Error::config(format!("runtimeConfig.mac must be a string, got {}", kind(other)))),
        }
    }
    mac.filter(|m| !m.is_empty()).map(|m| parse_mac(&m)).transpose()
}

pub fn parse(req: &Request) -> Result<BridgeConf> {
    let raw: Raw = req.plugin_conf()?;
    let bridge = raw.bridge.filter(|b| !b.is_empty()).unwrap_or_else(|| "cni0".to_string());
    validate_ifname(&bridge).map_err(|e| Error::config(format!("bridge name: {}", e.msg)))?;
    let mtu = match raw.mtu {
        None | Some(0) => None,
        Some(m) if (68..=65535).contains(&m) => Some(m as u32),
        Some(m) => return Err(Error::config(format!("invalid mtu {m}: use 68-65535, or 0 for the kernel default"))),
    };
    let vlan = match raw.vlan {
        None | Some(0) => 0,
        Some(v) => vlan_id(v, "vlan")?,
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
        if t.contains('/') || t == "." || t == ".." {
            return Err(Error::config(format!("invalid ipam type {t:?}: a plugin name cannot contain '/'")));
        }
    }
    if raw.is_default_gateway && ipam_type.is_none() {
        return Err(Error::config("isDefaultGateway needs an ipam plugin to learn the gateway address"));
    }
    let ip_masq_backend = raw.ip_masq_backend.filter(|b| !b.is_empty());
    if let Some(b) = &ip_masq_backend {
        if !matches!(b.as_str(), "nftables" | "nft" | "iptables") {
            return Err(Error::config(format!("invalid ipMasqBackend {b:?}: use \"nftables\" or \"iptables\"")));
        }
    }
    Ok(BridgeConf {
        network: req.conf.name.clone(),
        bridge,
        is_gateway: raw.is_gateway || raw.is_default_gateway,
        is_default_gateway: raw.is_default_gateway,
        force_address: raw.force_address,
        ip_masq: raw.ip_masq,
        ip_masq_backend,
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
        dns: req.conf.dns.clone().filter(|d| *d != Dns::default()),
        mac: mac_from(req)?,
    })
}

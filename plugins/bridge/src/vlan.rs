//! Bridge VLAN filtering: the pod port's VLANs, the per-VLAN gateway interface and their CHECK.

use crate::config::{self, BridgeConf};
use libcni::{code, Error, Result};
use netkit::sysctl;
use netkit::Family;
use netkit::{NetNs, Netlink};
use sha2::{Digest, Sha256};

/// The pod port's VLANs: VLAN 1 (the bridge's default PVID, which a new port joins untagged)
/// removed unless `preserveDefaultVlan`, as the reference does whenever a VLAN is set; the trunk
/// ranges tagged; then `vlan` as PVID, egress untagged. The PVID goes last: adding a range that
/// holds it would clear its PVID flag.
pub(crate) fn configure_vlans(host: &Netlink, conf: &BridgeConf, port: u32) -> Result<()> {
    if !conf.preserve_default_vlan {
        host.bridge_vlan_del(port, 1, false)?;
    }
    for &(lo, hi) in &conf.vlan_trunk {
        host.bridge_vlan_add_range(port, lo, hi, false)?;
    }
    if conf.vlan != 0 {
        host.bridge_vlan_add(port, conf.vlan, true, true, false)?;
    }
    Ok(())
}

/// The bridge-side end of the VLAN gateway pair of `vid` on `bridge`: derived from both, so every
/// ADD finds the same one.
pub fn vlan_gateway_port_name(bridge: &str, vid: u16) -> String {
    let digest = Sha256::digest(format!("vlan-gateway:{bridge}.{vid}").as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("vgw{hex}")
}

/// The host interface that holds the gateway address of the pods on VLAN `conf.vlan`, as the
/// reference makes it: `<bridge>.<vlan>`, one end of a veth pair whose other end is a port of the
/// bridge with that VLAN as PVID, untagged. (The bridge's own address is on its default PVID, which
/// the pods' ports leave.) Made by the first ADD that needs it and shared by every pod of the VLAN;
/// each ADD re-applies the port settings, so one that died half-way is finished by the next. DEL
/// leaves it, as it leaves the bridge and the bridge's gateway address.
pub(crate) fn ensure_vlan_gateway(host: &Netlink, conf: &BridgeConf, br: u32) -> Result<netkit::Link> {
    let name = config::vlan_gateway_name(&conf.bridge, conf.vlan);
    let port_name = vlan_gateway_port_name(&conf.bridge, conf.vlan);
    let gw = match host.link(&name)? {
        Some(l) => l,
        None => {
            let here = NetNs::current()?;
            match host.create_veth(&port_name, &name, &here, conf.mtu, None) {
                Ok(_) => {}
                // Another ADD of the same VLAN made it first.
                Err(e) if netkit::is_exists(&e) => {}
                Err(e) => return Err(e.context(format_args!("create the VLAN {} gateway {name}", conf.vlan))),
            }
            host.link(&name)?.ok_or_else(|| {
                Error::network(format!(
                    "VLAN gateway {name} is missing after its creation: is a link named {port_name} in the way?"
                ))
            })?
        }
    };
    if gw.kind.as_deref() != Some("veth") {
        return Err(Error::network(format!(
            "{name} exists and is not a veth ({}): the gateway of VLAN {} on bridge {} needs that name; rename or \
             delete it",
            gw.kind.as_deref().unwrap_or("a device without a kind"),
            conf.vlan,
            conf.bridge
        )));
    }
    // A peer in another namespace (IFLA_LINK_NETNSID set) has an index that means nothing here.
    let peer_here = gw.link_index.filter(|_| gw.link_netnsid.is_none());
    let port = peer_here
        .and_then(|i| host.link_by_index(i).transpose())
        .transpose()?
        .ok_or_else(|| Error::network(format!("VLAN gateway {name} has no peer in this namespace: delete {name}")))?;
    if port.master != Some(br) {
        host.set_master(port.index, br)
            .map_err(|e| e.context(format_args!("attach {} to {}", port.name, conf.bridge)))?;
    }
    if !conf.preserve_default_vlan {
        host.bridge_vlan_del(port.index, 1, false)?;
    }
    host.bridge_vlan_add(port.index, conf.vlan, true, true, false)?;
    if !port.up {
        let _ = sysctl::set_if(&port.name, Family::V6, "disable_ipv6", "1");
        host.set_up(port.index)?;
    }
    if !gw.up {
        // The host routes to the VLAN's subnet through here: no router advertisements wanted.
        let _ = sysctl::set_if(&name, Family::V6, "accept_ra", "0");
        crate::skip_link_local_dad(&name);
        host.set_up(gw.index)?;
    }
    Ok(gw)
}

/// CHECK of the VLAN keys: filtering on, the port's PVID and trunk VLANs as configured, and VLAN 1
/// gone unless preserved or configured.
pub(crate) fn check_vlans(host: &Netlink, conf: &BridgeConf, br: &netkit::Link, port: &netkit::Link) -> Result<()> {
    let failed = |msg: String| Error::new(code::CHECK_FAILED, msg);
    if br.vlan_filtering != Some(true) {
        return Err(failed(format!("bridge {} has VLAN filtering off, the vlan keys need it on", conf.bridge)));
    }
    let have = host.bridge_vlans(port.index)?;
    let on = |vid: u16| have.iter().find(|v| v.vid == vid);
    if conf.vlan != 0 {
        match on(conf.vlan) {
            Some(v) if v.pvid && v.untagged => {}
            Some(_) => {
                return Err(failed(format!(
                    "bridge port {} has vlan {} but not as its untagged PVID",
                    port.name, conf.vlan
                )))
            }
            None => return Err(failed(format!("bridge port {} is not on vlan {}", port.name, conf.vlan))),
        }
    }
    for &(lo, hi) in &conf.vlan_trunk {
        if let Some(vid) = (lo..=hi).find(|&vid| vid != conf.vlan && on(vid).is_none_or(|v| v.untagged)) {
            return Err(failed(format!("bridge port {} does not carry trunk vlan {vid} tagged", port.name)));
        }
    }
    let configured = |vid: u16| conf.vlan == vid || conf.vlan_trunk.iter().any(|&(lo, hi)| (lo..=hi).contains(&vid));
    if !conf.preserve_default_vlan && !configured(1) && on(1).is_some() {
        return Err(failed(format!(
            "bridge port {} is on the default vlan 1, which preserveDefaultVlan false removes",
            port.name
        )));
    }
    Ok(())
}

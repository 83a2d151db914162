//! Asking the IPAM plugin the configuration names: whether it can run before ADD changes anything,
//! its ADD with the release registered for a failed ADD, and which order DEL releases in.

use super::Undo;
use libcni::invoke;
use libcni::types::CniResult;
use libcni::{code, Error, Request, Result};

/// The IPAM plugin the configuration names, refused (code 7) when it is a path rather than a plugin
/// name in CNI_PATH.
pub fn plugin(conf: &libcni::conf::NetConf) -> Result<Option<&str>> {
    match conf.ipam_type() {
        Some(t) if !invoke::valid_plugin_type(t) => {
            Err(Error::config(format!("invalid ipam type {t:?}: name a plugin in CNI_PATH, not a path")))
        }
        other => Ok(other),
    }
}

/// That the IPAM plugin `ipam` (when the configuration names one) can run: ADD asks before its
/// first change, so a configuration naming a plugin that is not in CNI_PATH changes nothing (code 7,
/// [`invoke::delegate_ready`]).
pub fn ready(req: &Request, ipam: Option<&str>) -> Result<()> {
    ipam.map_or(Ok(()), |ipam| invoke::delegate_ready(ipam, req))
}

/// Refuses, before anything is made, an ADD whose result can hold no address (no IPAM plugin, no
/// prevResult addresses to chain after) at cniVersion 0.1.0 or 0.2.0, which cannot print one
/// without: the same error skel gives when it converts the result, found without a change to undo.
pub fn refuse_addressless_legacy(req: &Request, ipam: Option<&str>) -> Result<()> {
    let prev_ips = req.conf.prev_result.as_ref().is_some_and(|p| !p.ips.is_empty());
    if ipam.is_none() && !prev_ips && !libcni::version::at_least(&req.conf.cni_version, "0.3.0") {
        return Err(libcni::types::no_addresses_error());
    }
    Ok(())
}

/// Runs the IPAM plugin's ADD. Its DEL is registered in `undo` before the call: an IPAM plugin
/// that died half-way may hold a reservation, and its DEL releases only what this attachment holds.
pub fn add<'a>(ipam: &'a str, req: &'a Request, undo: &mut Undo<'a>) -> Result<CniResult> {
    undo.push(move || {
        let _ = invoke::delegate_del(ipam, req);
    });
    let r = invoke::delegate_add(ipam, req)?;
    libcni::fault_point("ipam-done")?;
    if r.ips.is_empty() {
        return Err(Error::new(code::PLUGIN_EXEC, format!("IPAM plugin {ipam} returned no IP addresses")));
    }
    Ok(r)
}

/// Whether IPAM plugin `ipam` releases through the pod's interface, so its DEL must run before
/// the interface goes: dhcp sends DHCPRELEASE from it. Every other IPAM releases from its own state.
/// dhcp also leases through that interface, so its ADD needs the interface in the pod (host-device
/// runs every other IPAM before it moves the device in).
/// A function rather than `== "dhcp"` at each DEL (bridge, ptp, the sublink plugins): the reason
/// for the order lives here, and an IPAM that also releases through the link is added once.
pub fn releases_through_link(ipam: &str) -> bool {
    ipam == "dhcp"
}

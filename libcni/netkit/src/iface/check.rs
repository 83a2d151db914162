//! CHECK of the pod's interface against prevResult (code 103 on a difference), as Go's
//! `ip.ValidateExpectedInterfaceIPs` and `ValidateExpectedRoute` do.

use super::result::own_ips;
use crate::{Family, Link, NetNs, Netlink};
use libcni::invoke;
use libcni::types::CniResult;
use libcni::{code, Error, Request, Result};

/// What an interface plugin's CHECK starts with: prevResult ([`Request::prev_result`]), the pod's
/// namespace, and IPAM's CHECK when `ipam` names a plugin.
pub fn start<'r>(req: &'r Request, ipam: Option<&str>) -> Result<(&'r CniResult, NetNs)> {
    let prev = req.prev_result(&req.conf.plugin_type)?;
    let ns = crate::container_netns(req)?;
    if let Some(ipam) = ipam {
        invoke::delegate_check(ipam, req)?;
    }
    Ok((prev, ns))
}

/// `ifname` exists in `ns`, has the MAC prevResult records, is up (when `up`), holds prevResult's
/// addresses for it, and the namespace has prevResult's routes. The link, and its index in
/// prevResult's interfaces when listed there.
pub fn pod(ns: &NetNs, ifname: &str, prev: &CniResult, up: bool) -> Result<(Link, Option<usize>)> {
    let failed = |msg: String| Error::new(code::CHECK_FAILED, msg);
    let cont = Netlink::open_in(ns)?;
    let link = cont
        .link(ifname)?
        .ok_or_else(|| failed(format!("interface {ifname} is missing in {}", ns.path().display())))?;
    let sandbox_idx = prev.interfaces.iter().position(|i| i.name == ifname && i.sandbox.is_some());
    if let Some(want) = sandbox_idx.and_then(|i| prev.interfaces[i].mac.clone()) {
        let have = link.mac_string().unwrap_or_default();
        if !have.eq_ignore_ascii_case(&want) {
            return Err(failed(format!("{ifname} has MAC {have}, prevResult says {want}")));
        }
    }
    if up && !link.up {
        return Err(failed(format!("{ifname} is down")));
    }
    let addrs = cont.addresses(link.index)?;
    for ip in own_ips(prev, sandbox_idx) {
        if !addrs.iter().any(|a| a.ip() == ip.address.ip() && a.prefix() == ip.address.prefix()) {
            return Err(failed(format!("{ifname} does not hold {}", ip.address)));
        }
    }
    for r in &prev.routes {
        let family = Family::of_net(&r.dst);
        let routes = cont.routes(family, None)?;
        if !routes
            .iter()
            .any(|have| have.dst == r.dst || (have.dst.ip() == r.dst.ip() && have.dst.prefix() == r.dst.prefix()))
        {
            return Err(failed(format!("route to {} is missing in {}", r.dst, ns.path().display())));
        }
    }
    Ok((link, sandbox_idx))
}

/// That the pod's link is of `kind` (`"dummy"`, `"vlan"`, ...), code 103 otherwise.
pub fn kind(link: &Link, kind: &str) -> Result<()> {
    if link.kind.as_deref() == Some(kind) {
        return Ok(());
    }
    Err(Error::new(
        code::CHECK_FAILED,
        format!(
            "{} is not a {kind} link (it is {})",
            link.name,
            link.kind.as_deref().map_or_else(|| "a device without a kind".to_string(), |k| format!("a {k} link"))
        ),
    ))
}

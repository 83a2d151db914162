//! Applying an IPAM result (Go's `ipam.ConfigureIface`): the pod's interface gets the addresses,
//! comes up, and the pod's namespace gets the routes; the host forwards the families in use.

use super::result::is_v4;
use super::Pod;
use crate::sysctl;
use crate::Family;
use crate::{Netlink, RouteSpec};
use libcni::types::{CniResult, IpConfig};
use libcni::Result;

/// How [`apply`] takes the failure of one of its requests: the first failure it does not ignore
/// is ADD's error, with the context given.
enum OnFailure {
    Ignore,
    Fail(Option<String>),
    /// A route already there is kept.
    FailUnlessExists(String),
}

/// Configures the pod's interface `index` (the pod's `ifname`) from an IPAM result: IPv6
/// duplicate address detection on or off (`dad`), gratuitous ARP, the addresses, the link up,
/// then the routes (a route without a gateway goes through its family's gateway, if any; one
/// already there is kept).
pub fn apply(pod: &Pod, index: u32, result: &CniResult, dad: bool) -> Result<()> {
    let (ns, ifname) = (&pod.ns, pod.ifname());
    if result.ips.iter().any(|ip| !is_v4(&ip.address)) {
        let _inside = ns.enter()?;
        if dad {
            sysctl::set_if(ifname, Family::V6, "enhanced_dad", "1").ok();
            sysctl::set_if(ifname, Family::V6, "accept_dad", "1")?;
        } else {
            // The pod's address is unique by construction: skip the multi-second DAD wait.
            sysctl::set_if(ifname, Family::V6, "accept_dad", "0")?;
        }
    }
    // One round trip for every request below: the kernel handles them in this order, so the
    // routes find the addresses and the link up, and each outcome is read as if sent alone.
    let mut steps = Vec::new();
    if result.ips.iter().any(|ip| is_v4(&ip.address)) {
        // Gratuitous ARP when the link comes up, as the reference sets it (best effort, as there).
        steps.push((Netlink::set_arp_notify_op(index), OnFailure::Ignore));
    }
    for ip in &result.ips {
        let op = Netlink::add_address_op(index, ip.address, !is_v4(&ip.address) && !dad);
        steps.push((op, OnFailure::Fail(Some(format!("add address {} to {ifname}", ip.address)))));
    }
    steps.push((Netlink::set_up_op(index), OnFailure::Fail(None)));
    for r in &result.routes {
        let v4 = is_v4(&r.dst);
        let gw = r.gw.or_else(|| result.ips.iter().find(|ip| is_v4(&ip.address) == v4).and_then(|ip| ip.gateway));
        let spec = RouteSpec {
            dst: r.dst,
            gw,
            oif: Some(index),
            table: r.table,
            metric: r.priority,
            scope: r.scope,
            mtu: r.mtu,
            advmss: r.advmss,
            src: None,
        };
        let context = format!("add route {} in {}", r.dst, ns.path().display());
        steps.push((Netlink::add_route_op(&spec), OnFailure::FailUnlessExists(context)));
    }
    let (ops, on_failure): (Vec<_>, Vec<_>) = steps.into_iter().unzip();
    for (outcome, on) in pod.nl.batch(ops)?.into_iter().zip(on_failure) {
        let Err(e) = outcome else { continue };
        match on {
            OnFailure::Ignore => {}
            OnFailure::FailUnlessExists(_) if crate::is_exists(&e) => {}
            OnFailure::Fail(None) => return Err(e),
            OnFailure::Fail(Some(context)) | OnFailure::FailUnlessExists(context) => return Err(e.context(context)),
        }
    }
    Ok(())
}

/// Turns on IP forwarding on the host for each family `ips` uses.
pub fn enable_forwarding(ips: &[IpConfig]) -> Result<()> {
    if ips.iter().any(|ip| is_v4(&ip.address)) {
        sysctl::enable_forwarding(Family::V4)?;
    }
    if ips.iter().any(|ip| !is_v4(&ip.address)) {
        sysctl::enable_forwarding(Family::V6)?;
    }
    Ok(())
}

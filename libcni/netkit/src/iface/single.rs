//! Plugins whose only interface is the pod's (dummy, vlan, tap): ADD's second half once the link
//! is in the pod, their CHECK and their DEL.

use super::result::{pod_interface, set_gateways};
use super::{check, configure, inpod, ipam, Pod, Undo};
use crate::{Link, NetNs};
use libcni::invoke;
use libcni::types::{CniResult, Dns};
use libcni::{Errors, Request, Result};

/// With an IPAM plugin, its result on interface 0, configured on the pod's `link` (addresses, up,
/// routes); without, the link up (layer 2 only). The result lists the pod's interface with its
/// MAC; `dns` (the configuration's, when it sets anything: [`libcni::conf::NetConf::dns`])
/// replaces IPAM's.
pub fn result<'a>(
    pod: &'a Pod,
    ipam: Option<&'a str>,
    link: &Link,
    dns: Option<&Dns>,
    undo: &mut Undo<'a>,
) -> Result<CniResult> {
    let req = pod.req;
    let mut result = CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() };
    match ipam {
        Some(ipam) => {
            let r = ipam::add(ipam, req, undo)?;
            (result.ips, result.routes, result.dns) = (r.ips, r.routes, r.dns);
            set_gateways(&mut result, 0, false, false);
            configure::apply(pod, link.index, &result, false)?;
        }
        None => pod.nl.set_up(link.index)?,
    }
    if let Some(dns) = dns {
        result.dns = dns.clone();
    }
    let now = pod.nl.link_by_index(link.index)?.unwrap_or_else(|| link.clone());
    result.interfaces = vec![pod_interface(&req.ifname, &now, &pod.ns)];
    Ok(result)
}

/// DEL: IPAM's DEL (when `ipam` names a plugin), then the pod's link (nothing to do when the
/// namespace is gone: the link went with it), whatever the plugin's own keys say. Best effort:
/// both are tried, every error reported; an `ipam.type` that is a path is reported after the link
/// is gone.
pub fn del(req: &Request) -> Result<()> {
    let mut errs = Errors::new();
    match ipam::plugin(&req.conf) {
        Ok(Some(ipam)) => {
            errs.record(invoke::delegate_del(ipam, req));
        }
        Ok(None) => {}
        Err(e) => errs.push(e),
    }
    errs.record(inpod::del(req));
    errs.finish()
}

/// CHECK: IPAM's CHECK (when `ipam` is set), then the pod's link against prevResult
/// ([`check::pod`], up) and its `kind`. The namespace and the link, for the plugin's own checks.
pub fn check(req: &Request, ipam: Option<&str>, kind: &str) -> Result<(NetNs, Link)> {
    let (prev, ns) = check::start(req, ipam)?;
    let (link, _) = check::pod(&ns, &req.ifname, prev, true)?;
    check::kind(&link, kind)?;
    Ok((ns, link))
}

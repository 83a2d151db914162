//! Plugins whose pod interface is a link on a master (macvlan, ipvlan): the verbs they share.
//!
//! ADD finds the master (`master`, else the interface of the default route) in the host's
//! namespace, or in the pod's with `linkInContainer`; creates the link as `CNI_IFNAME` directly in
//! the pod's namespace ([`super::inpod::create`]: under a temporary name renamed there only on a
//! kernel that would confuse the new name with a host link's, as the reference always does);
//! then, when there are addresses (from IPAM, or for a chained ipvlan from prevResult), configures
//! them as Go's `ipam.ConfigureIface` does, duplicate address detection included (the link shares
//! a real L2 segment), else only sets it up. DEL asks IPAM to release first (a DHCP daemon
//! releases its lease through the interface), then deletes the link in the pod; the kernel removes
//! it with the namespace, so a namespace that is gone leaves nothing else to do.

use super::concurrent::alongside;
use super::result::{chained, is_v4, pod_interface, set_gateways};
use super::{check, configure, inpod, ipam, Pod, Undo};
use crate::netlink::SubLink;
use crate::sysctl;
use crate::Family;
use crate::{Link, NetNs, Netlink};
use libcni::gojson::Spelled;
use libcni::invoke;
use libcni::skel::validate_ifname;
use libcni::types::{CniResult, Dns};
use libcni::{code, Error, Errors, Request, Result};
use std::time::Duration;

/// A validated configuration of a macvlan or ipvlan attachment.
#[derive(Debug, Clone, PartialEq)]
pub struct SubLinkConf {
    /// The master's name; `None`: the interface of the first default route where the master is
    /// looked up.
    pub master: Option<String>,
    /// The master lives in the pod's namespace (`linkInContainer`).
    pub link_in_container: bool,
    /// `None`: the master's MTU.
    pub mtu: Option<u32>,
    pub sub: SubLink,
    pub mac: Option<crate::Mac>,
    pub ipam_type: Option<String>,
    /// With no IPAM, configure prevResult's addresses and routes (a chained ipvlan).
    pub ips_from_prev: bool,
    pub dns: Option<Dns>,
}

/// How long ADD waits for IPv6 duplicate address detection (Go's `ip.SettleAddresses`).
const DAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the master is looked up: a connection there and its description for messages.
struct MasterNs<'a> {
    nl: &'a Netlink,
    place: String,
}

/// The interface of the first default route (IPv4 first, then IPv6) of the main table.
pub fn default_route_link(nl: &Netlink) -> Result<Option<Link>> {
    for family in [Family::V4, Family::V6] {
        let routes = nl.routes(family, None)?;
        if let Some(oif) = routes.iter().filter(|r| r.dst.prefix() == 0).find_map(|r| r.oif) {
            return nl.link_by_index(oif);
        }
    }
    Ok(None)
}

/// The host's namespace, where the master is unless `linkInContainer` is set.
fn on_host(nl: &Netlink) -> MasterNs<'_> {
    MasterNs { nl, place: "the host's namespace".to_string() }
}

/// The pod's namespace `ns` (`nl` a connection there), where the master is with `linkInContainer`.
fn in_pod<'a>(nl: &'a Netlink, ns: &NetNs) -> MasterNs<'a> {
    MasterNs { nl, place: format!("the pod's namespace {}", ns.path().display()) }
}

/// The master (see [`find_master`]), refused when the configured MTU is above its own.
fn usable_master(at: &MasterNs, conf: &SubLinkConf, kind: &str) -> Result<Link> {
    let master = find_master(at, conf, kind)?;
    if let Some(mtu) = conf.mtu.filter(|m| *m > master.mtu) {
        return Err(Error::config(format!(
            "{kind} mtu {mtu} is above the MTU of its master {} ({}): use at most that, or 0 for the master's",
            master.name, master.mtu
        )));
    }
    Ok(master)
}

fn find_master(at: &MasterNs, conf: &SubLinkConf, kind: &str) -> Result<Link> {
    match &conf.master {
        Some(name) => at.nl.link(name)?.ok_or_else(|| {
            Error::config(format!(
                "{kind} master {name} does not exist in {}: set master to an existing interface{}",
                at.place,
                if conf.link_in_container { "" } else { " (or linkInContainer if it is in the pod)" }
            ))
        }),
        None => default_route_link(at.nl)?.ok_or_else(|| {
            Error::config(format!(
                "{kind}: master is not set and {} has no default route to take it from: set master",
                at.place
            ))
        }),
    }
}

/// ADD: the link in the pod, its addresses, the result (chained after prevResult's).
pub fn add(req: &Request, conf: &SubLinkConf) -> Result<CniResult> {
    let prev_ips = req.conf.prev_result.as_ref().is_some_and(|p| !p.ips.is_empty());
    if conf.ipam_type.is_none()
        && !(conf.ips_from_prev && prev_ips)
        && !libcni::version::at_least(&req.conf.cni_version, "0.3.0")
    {
        // Refused before anything is made: converting the result would fail after the link exists.
        return Err(Error::version(format!(
            "{} without ipam gives a result with no addresses, which cniVersion {} cannot hold: use 0.3.0 or \
             later, or set ipam",
            conf.sub.kind(),
            req.conf.cni_version
        )));
    }
    ipam::ready(req, conf.ipam_type.as_deref())?;
    let kind = conf.sub.kind();
    // A master on the host is checked before the pod's namespace is opened: a configuration it
    // refuses (no such master, an MTU above its) fails before anything is touched.
    let host = match conf.link_in_container {
        false => {
            let host = Netlink::open()?;
            let master = usable_master(&on_host(&host), conf, kind)?;
            Some((host, master))
        }
        true => None,
    };
    // No lookup of CNI_IFNAME in the pod first: creating the link under that name fails when it
    // is taken, with the same error ([`inpod::create`]).
    let pod = Pod::open(req)?;
    let (pod, master) = match host {
        Some((host, master)) => (pod.with_host(host), master),
        None => {
            let master = usable_master(&in_pod(&pod.nl, &pod.ns), conf, kind)?;
            (pod, master)
        }
    };
    let at = match conf.link_in_container {
        false => on_host(pod.host()?),
        true => in_pod(&pod.nl, &pod.ns),
    };
    Undo::guarded(|undo| add_link(&pod, conf, &at, &master, undo))
}

fn add_link<'a>(
    pod: &'a Pod,
    conf: &'a SubLinkConf,
    at: &MasterNs,
    master: &Link,
    undo: &mut Undo<'a>,
) -> Result<CniResult> {
    let (req, ns) = (pod.req, &pod.ns);
    let sub = &conf.sub;
    let link = inpod::create(at.nl, pod, |name| at.nl.create_sublink(name, master.index, sub, ns, conf.mtu, conf.mac))?;
    let index = link.index;
    undo.push(move || {
        let _ = pod.nl.delete_link(index);
    });
    libcni::fault_point("link-created")?;
    let mut result = CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() };
    if let Some(ipam) = &conf.ipam_type {
        let r = ipam::add(ipam, req, undo)?;
        (result.ips, result.routes, result.dns) = (r.ips, r.routes, r.dns);
    } else if let Some(prev) = req.conf.prev_result.as_ref().filter(|_| conf.ips_from_prev) {
        (result.ips, result.routes) = (prev.ips.clone(), prev.routes.clone());
    }
    // Our one interface is the pod's: every address is on it.
    set_gateways(&mut result, 0, false, false);
    if result.ips.is_empty() {
        pod.nl.set_up(index)?;
    } else {
        if result.ips.iter().any(|ip| !is_v4(&ip.address)) {
            // Unsolicited neighbour advertisements when the link comes up, as the reference sets them.
            let _ = ns.run(|| sysctl::set_if(&req.ifname, Family::V6, "ndisc_notify", "1"));
        }
        configure::apply(pod, index, &result, true)?;
        if result.ips.iter().any(|ip| !is_v4(&ip.address)) {
            pod.nl.wait_dad(index, DAD_TIMEOUT)?;
        }
    }
    libcni::fault_point("container-configured")?;
    // The link as read right after its creation: configuring it changes neither name nor MAC.
    result.interfaces = vec![pod_interface(&req.ifname, &link, ns)];
    if let Some(dns) = &conf.dns {
        result.dns = dns.clone();
    }
    let prev = req.conf.prev_result.as_ref();
    if conf.ips_from_prev && conf.ipam_type.is_none() {
        // prevResult's addresses moved onto our interface: list them once, pointing at it.
        let before = prev.map(|p| CniResult { ips: Vec::new(), ..p.clone() });
        return Ok(chained(before.as_ref(), result));
    }
    Ok(chained(prev, result))
}

/// CHECK: prevResult's interface is ours in this namespace, of our kind and mode, up, with its
/// addresses and routes; the master still exists.
pub fn check(req: &Request, conf: &SubLinkConf) -> Result<()> {
    let failed = |msg: String| Error::new(code::CHECK_FAILED, msg);
    let (prev, ns) = check::start(req, conf.ipam_type.as_deref())?;
    let netns = ns.path().display().to_string();
    if !prev.interfaces.iter().any(|i| i.name == req.ifname && i.sandbox.as_deref() == Some(netns.as_str())) {
        return Err(failed(format!("prevResult lists no interface {} in {netns}", req.ifname)));
    }
    let (link, _) = check::pod(&ns, &req.ifname, prev, true)?;
    let cont = Netlink::open_in(&ns)?;
    let kind = conf.sub.kind();
    match cont.sublink(link.index)? {
        Some(have) if have.kind() == kind && have.mode_name() == conf.sub.mode_name() => {}
        Some(have) if have.kind() == kind => {
            return Err(failed(format!(
                "{} is in {kind} mode {}, the configuration says {}",
                req.ifname,
                have.mode_name(),
                conf.sub.mode_name()
            )))
        }
        _ => return Err(failed(format!("{} is not a {kind} link", req.ifname))),
    }
    let host = if conf.link_in_container { None } else { Some(Netlink::open()?) };
    let at = match &host {
        Some(host) => on_host(host),
        None => in_pod(&cont, &ns),
    };
    find_master(&at, conf, kind).map_err(|e| failed(e.msg))?;
    Ok(())
}

/// DEL: IPAM's release (when `ipam` names a plugin) and the link in the pod; every step runs,
/// and the errors are reported together. A release through the link (dhcp) runs before the link
/// goes; any other runs alongside the deletion ([`alongside`]). Needs no other key, so a
/// configuration that no longer validates never strands an attachment.
pub fn del(req: &Request, ipam: Option<&str>) -> Result<()> {
    let mut errs = Errors::new();
    let (early, late) = match ipam {
        Some(t) if ipam::releases_through_link(t) => (Some(t), None),
        other => (None, other),
    };
    if let Some(ipam) = early {
        errs.record(invoke::delegate_del(ipam, req));
    }
    let deleted = match late {
        Some(ipam) => {
            let release = |_: &_| invoke::delegate_del(ipam, req);
            let (released, deleted) = alongside("releasing the addresses", release, |_| inpod::del(req));
            errs.record(released.and_then(|r| r));
            deleted
        }
        None => inpod::del(req),
    };
    errs.record(deleted);
    errs.finish()
}

/// STATUS: IPAM's, and a master named in the configuration and looked up on the host exists
/// (code 50 when it does not: no attachment can be made).
pub fn status(req: &Request, conf: &SubLinkConf) -> Result<()> {
    if let Some(ipam) = &conf.ipam_type {
        invoke::delegate_status(ipam, req)?;
    }
    if let (Some(name), false) = (&conf.master, conf.link_in_container) {
        if Netlink::open()?.link(name)?.is_none() {
            return Err(Error::new(
                code::NOT_AVAILABLE,
                format!("{} master {name} does not exist in the host's namespace", conf.sub.kind()),
            ));
        }
    }
    Ok(())
}

/// GC: IPAM's (the links die with their pods' namespaces).
pub fn gc(req: &Request, conf: &SubLinkConf) -> Result<()> {
    match &conf.ipam_type {
        Some(ipam) => invoke::delegate_gc(ipam, req),
        None => Ok(()),
    }
}

/// A `master` key: an interface name, or absent/empty for the default route's interface.
pub fn master_key(m: Option<&Spelled<String>>) -> Result<Option<String>> {
    let Some(m) = m.filter(|m| !m.value.is_empty()) else { return Ok(None) };
    validate_ifname(&m.value).map_err(|e| Error::config(format!("{}: {}", m.key_or("master"), e.msg)))?;
    Ok(Some(m.value.clone()))
}

/// A `mode` key: one of the names `parse` knows, or absent/empty for `default`.
pub fn mode_key<M>(m: Option<&Spelled<String>>, parse: fn(&str) -> Option<M>, names: &str, default: M) -> Result<M> {
    match m.filter(|m| !m.value.is_empty()) {
        None => Ok(default),
        Some(m) => parse(&m.value)
            .ok_or_else(|| Error::config(format!("invalid {} {:?}: use {names}", m.key_or("mode"), m.value))),
    }
}

/// A link-on-a-master plugin: the shared verbs with the plugin's own configuration parser and the
/// `CNI_ARGS` keys it (and its IPAM) read.
pub struct SubLinkPlugin {
    pub parse: fn(&Request) -> Result<SubLinkConf>,
    pub known_args: &'static [&'static str],
}

impl libcni::Plugin for SubLinkPlugin {
    fn known_args(&self) -> &'static [&'static str] {
        self.known_args
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        add(req, &(self.parse)(req)?)
    }

    fn del(&self, req: &Request) -> Result<()> {
        // Only the IPAM type matters: the link is found by CNI_IFNAME in the pod.
        del(req, req.conf.ipam_type())
    }

    fn check(&self, req: &Request) -> Result<()> {
        check(req, &(self.parse)(req)?)
    }

    fn status(&self, req: &Request) -> Result<()> {
        status(req, &(self.parse)(req)?)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        gc(req, &(self.parse)(req)?)
    }
}

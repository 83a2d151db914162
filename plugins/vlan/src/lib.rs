//! vlan: an 802.1Q sub-interface of `master` as the pod's interface (the reference's `vlan`), with
//! the addresses IPAM gives. Pods on the same `vlanId` of one master share a layer-2 segment.
//!
//! ADD finds `master` on the host (in the pod with `linkInContainer`), creates the VLAN link into
//! the pod as `CNI_IFNAME` ([`netkit::iface::inpod::create`]: under a temporary name renamed there
//! on a kernel that confuses the new name with a host link's), then configures IPAM's result on it; a failure
//! removes the link and releases the addresses. CHECK wants the master, a VLAN link with the
//! configured id and MTU, and prevResult's addresses and routes. DEL releases the addresses and
//! deletes the link, with or without the master or the namespace.

pub mod config;

use config::VlanConf;
use libcni::{invoke, CniResult, Error, Plugin, Request, Result};
use netkit::iface::{inpod, ipam, single, Pod, Undo};
use netkit::netlink::NewLink;
use netkit::{Link, NetNs, Netlink};

pub struct Vlan;

/// The master link, where the configuration says it is: on the host, or in the pod's namespace
/// `ns` with `linkInContainer`.
fn master(conf: &VlanConf, nl: &Netlink, ns: Option<&NetNs>) -> Result<Link> {
    nl.link(&conf.master)?.ok_or_else(|| {
        let place = match ns {
            Some(ns) => format!("in the pod's namespace {} (linkInContainer is set)", ns.path().display()),
            None => "on the host".to_string(),
        };
        Error::config(format!("master: interface {} not found {place}", conf.master))
    })
}

/// [`master`], refused when the configured MTU is above its MTU or when it is down: what ADD
/// checks of the master before it makes anything.
fn usable_master(conf: &VlanConf, nl: &Netlink, ns: Option<&NetNs>) -> Result<Link> {
    let parent = master(conf, nl, ns)?;
    if let Some(mtu) = conf.mtu.filter(|m| *m > parent.mtu) {
        return Err(Error::config(format!(
            "{}: MTU {mtu} is above the MTU of master {} ({}): a VLAN link cannot exceed its master's",
            conf.mtu_key, conf.master, parent.mtu
        )));
    }
    if !parent.up {
        return Err(Error::network(format!(
            "master {} is down: bring it up first (a VLAN link cannot come up on a master that is down)",
            conf.master
        )));
    }
    Ok(parent)
}

/// ADD's changes: the VLAN link on `parent` (in the namespace `creator` speaks to) created into
/// the pod, then IPAM's result on it.
fn add<'a>(
    pod: &'a Pod,
    conf: &'a VlanConf,
    creator: &Netlink,
    parent: &Link,
    undo: &mut Undo<'a>,
) -> Result<CniResult> {
    let kind = NewLink::Vlan { parent: parent.index, id: conf.vlan_id };
    let link = inpod::create(creator, pod, |name| {
        creator.create_link(name, kind, conf.mtu, Some(&pod.ns)).map_err(|e| {
            if netkit::is_exists(&e) {
                e.with_details(format!(
                    "master {} may already have a link for VLAN {}: the kernel allows one per id and master",
                    conf.master, conf.vlan_id
                ))
            } else {
                e
            }
        })
    })?;
    undo.push(move || {
        let _ = pod.nl.delete_link_by_name(pod.ifname());
    });
    single::result(pod, Some(&conf.ipam_type), &link, conf.dns.as_ref(), undo)
}

impl Plugin for Vlan {
    fn known_args(&self) -> &'static [&'static str] {
        // IP is read by host-local, which gets our CNI_ARGS.
        &["IP"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = config::parse(&req.raw, &req.conf)?;
        ipam::ready(req, Some(&conf.ipam_type))?;
        // A master on the host is checked before the pod's namespace is opened: a configuration
        // it refuses (an MTU above the master's) fails before anything is touched.
        let host = match conf.link_in_container {
            false => {
                let host = Netlink::open()?;
                let parent = usable_master(&conf, &host, None)?;
                Some((host, parent))
            }
            true => None,
        };
        let pod = Pod::open_for_add(req)?;
        let (pod, parent) = match host {
            Some((host, parent)) => (pod.with_host(host), parent),
            None => {
                let parent = usable_master(&conf, &pod.nl, Some(&pod.ns))?;
                (pod, parent)
            }
        };
        let creator = if conf.link_in_container { &pod.nl } else { pod.host()? };
        Undo::guarded(|undo| add(&pod, &conf, creator, &parent, undo))
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.raw, &req.conf)?;
        let (ns, link) = single::check(req, Some(&conf.ipam_type), "vlan")?;
        let failed = |msg: String| Error::new(libcni::code::CHECK_FAILED, msg);
        let host = if conf.link_in_container { Netlink::open_in(&ns)? } else { Netlink::open()? };
        master(&conf, &host, conf.link_in_container.then_some(&ns)).map_err(|e| failed(e.msg))?;
        let cont = Netlink::open_in(&ns)?;
        let id = cont.vlan_id(link.index)?;
        if id != Some(conf.vlan_id) {
            return Err(failed(format!(
                "{} has VLAN id {}, the configuration says {}",
                req.ifname,
                id.map_or_else(|| "none".to_string(), |i| i.to_string()),
                conf.vlan_id
            )));
        }
        match conf.mtu {
            Some(mtu) if mtu != link.mtu => {
                Err(failed(format!("{} has MTU {}, the configuration says {mtu}", req.ifname, link.mtu)))
            }
            _ => Ok(()),
        }
    }

    /// Releases the addresses and deletes the link whatever else is wrong with the configuration
    /// (the master gone, a key that no longer validates): DEL never strands a pod.
    fn del(&self, req: &Request) -> Result<()> {
        single::del(req)
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.raw, &req.conf)?;
        invoke::delegate_status(&conf.ipam_type, req)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.raw, &req.conf)?;
        invoke::delegate_gc(&conf.ipam_type, req)
    }
}

//! dummy: a dummy link in the pod holding the addresses IPAM gives (the reference's `dummy`). It
//! has no peer and carries no traffic off the pod: an anchor for addresses that routing elsewhere
//! delivers (a VIP, an anycast address).
//!
//! ADD creates `CNI_IFNAME` directly in the pod's namespace, asks IPAM, puts the addresses and
//! routes on it and brings it up; a failure removes the link and releases the addresses. CHECK
//! compares the link with prevResult and wants a dummy; DEL releases the addresses and deletes the
//! link (nothing to delete when the namespace is gone).

pub mod config;

use libcni::{invoke, CniResult, Error, Plugin, Request, Result};
use netkit::iface::{ipam, single, Pod, Undo};
use netkit::netlink::NewLink;

pub struct Dummy;

impl Plugin for Dummy {
    fn known_args(&self) -> &'static [&'static str] {
        // IP is read by host-local, which gets our CNI_ARGS.
        &["IP"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = config::parse(&req.conf)?;
        ipam::ready(req, Some(&conf.ipam_type))?;
        let pod = Pod::open_for_add(req)?;
        Undo::guarded(|undo| {
            pod.nl.create_link(&req.ifname, NewLink::Dummy, None, None)?;
            undo.push(|| {
                let _ = pod.nl.delete_link_by_name(&req.ifname);
            });
            let link = pod.nl.link(&req.ifname)?.ok_or_else(|| {
                Error::network(format!(
                    "dummy {} is missing in {} right after creation",
                    req.ifname,
                    pod.ns.path().display()
                ))
            })?;
            single::result(&pod, Some(&conf.ipam_type), &link, None, undo)
        })
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.conf)?;
        single::check(req, Some(&conf.ipam_type), "dummy").map(drop)
    }

    /// Releases the addresses and deletes the link, whatever else is wrong with the configuration:
    /// DEL never strands a pod.
    fn del(&self, req: &Request) -> Result<()> {
        single::del(req)
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.conf)?;
        invoke::delegate_status(&conf.ipam_type, req)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.conf)?;
        invoke::delegate_gc(&conf.ipam_type, req)
    }
}

//! tap: a persistent tap device as the pod's interface (the reference's `tap`), for a VM or a
//! userspace network stack in the pod to attach to; with IPAM's addresses, or layer 2 only.
//!
//! ADD creates `CNI_IFNAME` in the pod (through /dev/net/tun, [`netkit::tuntap`]) with its owner,
//! group and queue mode, sets `mac` and `mtu`, makes it a port of `bridge` (a bridge in the pod),
//! then configures IPAM's result on it, or only brings it up; a failure deletes it and releases the
//! addresses. CHECK wants a tap link with prevResult's MAC, addresses and routes; DEL releases the
//! addresses and deletes the tap (it went with the namespace when that is gone).

pub mod config;

use config::TapConf;
use libcni::{invoke, CniResult, Error, Plugin, Request, Result};
use netkit::iface::{ipam, single, Pod, Undo};
use netkit::tuntap::{self, TapOptions};

pub struct Tap;

fn conf_of(req: &Request) -> Result<TapConf> {
    config::parse(&req.raw, &req.conf, req.args.get("MAC"))
}

fn add<'a>(pod: &'a Pod, conf: &'a TapConf, undo: &mut Undo<'a>) -> Result<CniResult> {
    let (req, ns, cont) = (pod.req, &pod.ns, &pod.nl);
    let bridge = match &conf.bridge {
        Some(name) => {
            let br = cont.link(name)?.ok_or_else(|| {
                Error::config(format!("bridge: {name} not found in the pod's namespace {}", ns.path().display()))
            })?;
            if !br.is_bridge() {
                return Err(Error::config(format!("bridge: {name} in the pod's namespace is not a bridge")));
            }
            Some(br)
        }
        None => None,
    };
    // The reference's flags: a virtio-net header, and the queue mode a VM's vhost attaches with.
    let opts = TapOptions { multi_queue: conf.multi_queue, vnet_hdr: true, owner: conf.owner, group: conf.group };
    tuntap::create_tap(ns, &req.ifname, &opts)?;
    undo.push(move || {
        let _ = cont.delete_link_by_name(&req.ifname);
    });
    let link = cont.link(&req.ifname)?.ok_or_else(|| {
        Error::network(format!("tap {} is missing in {} right after creation", req.ifname, ns.path().display()))
    })?;
    if let Some(mac) = conf.mac {
        cont.set_mac(link.index, mac)?;
    }
    if let Some(mtu) = conf.mtu {
        cont.set_mtu(link.index, mtu)?;
    }
    if let Some(br) = &bridge {
        cont.set_master(link.index, br.index)
            .map_err(|e| e.context(format_args!("make {} a port of bridge {}", req.ifname, br.name)))?;
    }
    single::result(pod, conf.ipam_type.as_deref(), &link, conf.dns.as_ref(), undo)
}

impl Plugin for Tap {
    fn known_args(&self) -> &'static [&'static str] {
        // IP is read by host-local, which gets our CNI_ARGS.
        &["MAC", "IP"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = conf_of(req)?;
        ipam::ready(req, conf.ipam_type.as_deref())?;
        ipam::refuse_addressless_legacy(req, conf.ipam_type.as_deref())?;
        let pod = Pod::open_for_add(req)?;
        Undo::guarded(|undo| add(&pod, &conf, undo))
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = conf_of(req)?;
        single::check(req, conf.ipam_type.as_deref(), "tun").map(drop)
    }

    /// Releases the addresses and deletes the tap whatever else is wrong with the configuration.
    fn del(&self, req: &Request) -> Result<()> {
        single::del(req)
    }

    fn status(&self, req: &Request) -> Result<()> {
        match conf_of(req)?.ipam_type {
            Some(ipam) => invoke::delegate_status(&ipam, req),
            None => Ok(()),
        }
    }

    fn gc(&self, req: &Request) -> Result<()> {
        match conf_of(req)?.ipam_type {
            Some(ipam) => invoke::delegate_gc(&ipam, req),
            None => Ok(()),
        }
    }
}

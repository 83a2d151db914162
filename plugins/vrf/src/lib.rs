//! vrf: puts the pod's interface, made by an earlier plugin of the chain, into a VRF of the pod's
//! namespace (the reference's `vrf` meta plugin), so its addresses and routes live in the VRF's
//! own routing table.
//!
//! ADD finds the VRF `vrfname` in the pod, or creates it (table `table`, else the first table no
//! other VRF of the pod uses, as the reference picks it, under a lock on the pod's namespace so
//! that concurrent ADDs creating VRFs take distinct tables) and brings it up; an existing VRF with
//! another table than the configured one is refused. It then enslaves `CNI_IFNAME` (one that
//! already has a master is refused). Enslaving cycles the link down and up: the kernel moves its
//! IPv4 addresses' connected routes into the VRF table but drops its global IPv6 addresses and
//! every other route, so ADD puts the IPv6 addresses back (without a second DAD: they were
//! configured before) and copies the interface's main-table routes of global scope into the VRF
//! table, as the reference does since v1.2. A failure detaches the interface again and deletes a
//! VRF this ADD created. The output is prevResult, unchanged.
//!
//! DEL detaches the interface from the VRF and deletes the VRF once no link is left in it; nothing
//! to do when the namespace or the VRF is gone. CHECK wants the VRF (with the configured table) and
//! the interface in it.

pub mod config;

use config::VrfConf;
use ipnetwork::IpNetwork;
use libcni::{code, CniResult, Error, Plugin, Request, Result};
use netkit::netlink::{NewLink, RawRoute};
use netkit::Family;
use netkit::{Link, NetNs, Netlink};
use std::time::Duration;

pub struct Vrf;

/// The versions the reference vrf speaks.
const VERSIONS: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn is_vrf(link: &Link) -> bool {
    link.kind.as_deref() == Some("vrf")
}

/// The VRF `name` of the pod, or None; a link of that name that is not a VRF is an error.
fn find_vrf(nl: &Netlink, name: &str) -> Result<Option<(Link, u32)>> {
    let Some(link) = nl.link(name)? else { return Ok(None) };
    if !is_vrf(&link) {
        return Err(Error::config(format!(
            "vrfname: {name} exists in the pod and is not a VRF (it is {})",
            link.kind.as_deref().unwrap_or("a device without a kind")
        )));
    }
    let table = nl.vrf_table(link.index)?.unwrap_or(0);
    Ok(Some((link, table)))
}

/// The first table from 1 that no VRF of the pod uses.
fn first_free_table(nl: &Netlink) -> Result<u32> {
    let mut taken = Vec::new();
    for link in nl.links()?.iter().filter(|l| is_vrf(l)) {
        taken.extend(nl.vrf_table(link.index)?);
    }
    (1..u32::MAX)
        .find(|t| !taken.contains(t) && ![253, 254, 255].contains(t))
        .ok_or_else(|| Error::network("no free routing table for a new VRF"))
}

/// The VRF for ADD: existing (its table must match a configured one) or created here (true).
fn ensure_vrf(nl: &Netlink, conf: &VrfConf) -> Result<(Link, u32, bool)> {
    if let Some((vrf, table)) = find_vrf(nl, &conf.vrfname)? {
        if conf.table.is_some_and(|t| t != table) {
            return Err(Error::config(format!(
                "table: VRF {} already exists with table {table}, not {}",
                conf.vrfname,
                conf.table.unwrap_or_default()
            )));
        }
        if !vrf.up {
            nl.set_up(vrf.index)?;
        }
        return Ok((vrf, table, false));
    }
    let table = match conf.table {
        Some(t) => t,
        None => first_free_table(nl)?,
    };
    match nl.create_link(&conf.vrfname, NewLink::Vrf { table }, None, None) {
        Ok(()) => {}
        // Another ADD of the same pod created it first: use theirs.
        Err(e) if netkit::is_exists(&e) => {
            let (vrf, have, _) = ensure_vrf_existing(nl, conf)?;
            return Ok((vrf, have, false));
        }
        Err(e) => return Err(e),
    }
    let vrf = nl
        .link(&conf.vrfname)?
        .ok_or_else(|| Error::network(format!("VRF {} vanished right after creation", conf.vrfname)))?;
    if let Err(e) = nl.set_up(vrf.index) {
        let _ = nl.delete_link(vrf.index);
        return Err(e);
    }
    Ok((vrf, table, true))
}

fn ensure_vrf_existing(nl: &Netlink, conf: &VrfConf) -> Result<(Link, u32, bool)> {
    match find_vrf(nl, &conf.vrfname)? {
        Some((vrf, table)) if conf.table.is_none_or(|t| t == table) => Ok((vrf, table, false)),
        Some((_, table)) => Err(Error::config(format!(
            "table: VRF {} already exists with table {table}, not {}",
            conf.vrfname,
            conf.table.unwrap_or_default()
        ))),
        None => Err(Error::network(format!("VRF {} vanished while being created", conf.vrfname))),
    }
}

/// Puts `link` into the VRF and brings back what enslaving takes away (see the crate docs).
fn enslave(nl: &Netlink, link: &Link, vrf: &Link, table: u32) -> Result<()> {
    if let Some(master) = link.master {
        let name = nl.link_by_index(master)?.map_or_else(|| format!("index {master}"), |m| m.name);
        return Err(Error::network(format!(
            "interface {} already has a master, {name}: it cannot also be put into VRF {}",
            link.name, vrf.name
        )));
    }
    let v6_global: Vec<IpNetwork> =
        nl.address_details(link.index, Family::V6)?.into_iter().filter(|a| a.scope == 0).map(|a| a.net).collect();
    let routes: Vec<RawRoute> = nl.raw_routes_of(link.index)?.into_iter().filter(|r| r.scope() == 0).collect();
    nl.set_master(link.index, vrf.index)
        .map_err(|e| e.context(format_args!("put {} into VRF {}", link.name, vrf.name)))?;
    let now = nl.addresses(link.index)?;
    for a in v6_global.iter().filter(|a| !now.contains(a)) {
        match nl.add_address(link.index, *a, true) {
            Err(e) if !netkit::is_exists(&e) => {
                return Err(e.context(format_args!("restore {a} on {} in VRF {}", link.name, vrf.name)))
            }
            _ => {}
        }
    }
    for r in &routes {
        copy_route(nl, r, table)?;
    }
    Ok(())
}

/// Copies a route into the VRF table; one through a gateway waits briefly for the connected route
/// that makes the gateway reachable (the kernel adds it as the link comes back up).
fn copy_route(nl: &Netlink, r: &RawRoute, table: u32) -> Result<()> {
    let mut pause = Duration::from_millis(5);
    for _ in 0..8 {
        match nl.copy_route_to_table(r, table) {
            Err(e) if netkit::errno(&e) == Some(libc::ENETUNREACH) => std::thread::sleep(pause),
            other => return other.map(drop),
        }
        pause *= 2;
    }
    nl.copy_route_to_table(r, table).map(drop)
}

fn add(req: &Request, conf: &VrfConf, ns: &NetNs) -> Result<()> {
    let nl = Netlink::open_in(ns)?;
    let link = nl.link(&req.ifname)?.ok_or_else(|| {
        Error::network(format!(
            "interface {} not found in {}: the plugin before vrf in the chain must create it",
            req.ifname,
            ns.path().display()
        ))
    })?;
    // Choosing a free table and creating the VRF with it is one step for every ADD in this pod:
    // two ADDs that each create a VRF must not both take the table neither saw in use.
    let (vrf, table, created) = {
        let _serial = ns.lock()?;
        ensure_vrf(&nl, conf)?
    };
    libcni::fault_point("vrf-ensured")?;
    let enslaved = enslave(&nl, &link, &vrf, table);
    if enslaved.is_err() {
        if nl.link_by_index(link.index)?.is_some_and(|l| l.master == Some(vrf.index)) {
            let _ = nl.set_nomaster(link.index);
        }
        if created {
            let _ = nl.delete_link(vrf.index);
        }
    }
    enslaved
}

impl Plugin for Vrf {
    fn supported_versions(&self) -> &'static [&'static str] {
        &VERSIONS
    }

    /// The reference never loads CNI_ARGS.
    fn reads_cni_args(&self) -> bool {
        false
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = config::parse(&req.raw)?;
        let prev = req.prev_result("vrf")?;
        let ns = netkit::container_netns(req)?;
        add(req, &conf, &ns)?;
        Ok(prev.clone())
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.raw)?;
        req.prev_result("vrf")?;
        let ns = netkit::container_netns(req)?;
        let nl = Netlink::open_in(&ns)?;
        let failed = |msg: String| Error::new(code::CHECK_FAILED, msg);
        let (vrf, table) = find_vrf(&nl, &conf.vrfname)
            .map_err(|e| failed(e.msg))?
            .ok_or_else(|| failed(format!("VRF {} is missing in {}", conf.vrfname, ns.path().display())))?;
        if let Some(want) = conf.table.filter(|t| *t != table) {
            return Err(failed(format!("VRF {} has table {table}, the configuration says {want}", conf.vrfname)));
        }
        let link = nl
            .link(&req.ifname)?
            .ok_or_else(|| failed(format!("interface {} is missing in {}", req.ifname, ns.path().display())))?;
        if link.master != Some(vrf.index) {
            return Err(failed(format!("interface {} is not in VRF {}", req.ifname, conf.vrfname)));
        }
        Ok(())
    }

    /// Detaches the interface and deletes the VRF once empty. With a configuration that no longer
    /// validates, the VRF is the interface's master, if it is one: DEL never stands in the way of
    /// tearing the pod down.
    fn del(&self, req: &Request) -> Result<()> {
        let Some(ns) = netkit::container_netns_for_del(req)? else { return Ok(()) };
        let nl = Netlink::open_in(&ns)?;
        let link = nl.link(&req.ifname)?;
        let vrf = match config::parse(&req.raw) {
            Ok(conf) => nl.link(&conf.vrfname)?,
            Err(e) => {
                eprintln!("vrf: DEL works from the interface's master, as the configuration is invalid: {e}");
                match link.as_ref().and_then(|l| l.master) {
                    Some(m) => nl.link_by_index(m)?,
                    None => None,
                }
            }
        };
        let Some(vrf) = vrf.filter(is_vrf) else { return Ok(()) };
        if let Some(link) = link.filter(|l| l.master == Some(vrf.index)) {
            nl.set_nomaster(link.index)
                .map_err(|e| e.context(format_args!("take {} out of VRF {}", req.ifname, vrf.name)))?;
        }
        if !nl.links()?.iter().any(|l| l.master == Some(vrf.index)) {
            nl.delete_link(vrf.index)?;
        }
        Ok(())
    }
}

//! host-device: moves an existing device of the host (a NIC, an SR-IOV VF, a macvlan...) into the
//! pod, renamed to CNI_IFNAME, with addresses from IPAM when there is an `ipam` section; DEL moves
//! it back under its host name.
//!
//! ADD keeps a record of the device in `<dataDir>/<containerID>_<ifname>.json` before it touches
//! it: its host name, alias, MTU, MAC, permanent MAC and index. DEL moves out only the device that
//! record identifies (its permanent MAC when it has one, else its MAC and its index in the pod),
//! whatever the pod renamed or re-aliased it to, under the recorded name and with the recorded
//! alias, MTU and MAC; anything else in the pod stays there. IPAM runs before the device moves
//! (but dhcp, which leases through it), and a failed ADD gives the device back as it was, with
//! the addresses and routes the host had on it.
//!
//! As the reference, the host name also travels in the device's alias (IFLA_IFALIAS), so either
//! plugin returns a device the other moved in: without a record (the reference moved it in), DEL
//! moves `CNI_IFNAME` out under the name in its alias, as the reference's DEL does. A record the
//! reference's DEL orphaned is reclaimed by our next ADD of the device or by GC. A PCI device bound
//! to a userspace (DPDK) driver has no network interface to move: ADD only runs IPAM, as the
//! reference.

pub mod config;

use config::{HostDeviceConf, Selector};
use libcni::invoke;
use libcni::types::{CniResult, Interface};
use libcni::{code, Error, Errors, Plugin, Request, Result};
use netkit::iface::result::{pod_interface, set_gateways};
use netkit::iface::{self, configure, ipam, Pod, Undo};
use netkit::netlink::{RawAddress, RawRoute};
use netkit::{Link, Mac, NetNs, Netlink};
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub struct HostDevice;

/// Drivers that hand a PCI device to userspace (DPDK), the reference's list.
const USERSPACE_DRIVERS: [&str; 3] = ["vfio-pci", "uio_pci_generic", "igb_uio"];

impl Plugin for HostDevice {
    fn known_args(&self) -> &'static [&'static str] {
        // IP is read by the IPAM plugin, which gets our CNI_ARGS.
        &["IP"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = config::parse(req)?;
        ipam::ready(req, conf.ipam_type.as_deref())?;
        ipam::refuse_addressless_legacy(req, conf.ipam_type.as_deref())?;
        let pod = Pod::open_for_add(req)?;
        pod.add_chained(|undo| add(&pod, &conf, undo))
    }

    /// Releases the addresses and returns the device to this namespace, each best effort. With
    /// ADD's record, the device it identifies ([`return_recorded`], [`return_after_pod_gone`]);
    /// without one (the reference moved the device in), `CNI_IFNAME` under the host name in its
    /// alias ([`move_out`], [`rename_returned`]). Needs no valid configuration.
    fn del(&self, req: &Request) -> Result<()> {
        let mut errs = Errors::new();
        if let Err(e) = config::parse(req) {
            eprintln!("host-device: DEL returns the device all the same, as its configuration is invalid: {e}");
        }
        if let Some(ipam) = req.conf.ipam_type().filter(|t| !t.is_empty()) {
            errs.record(invoke::delegate_del(ipam, req));
        }
        let record = match netkit::saved::dir_for_del(&req.raw, config::DEFAULT_DATA_DIR, "host-device") {
            Ok(dir) => read_record(&saved_path(&dir, req)),
            Err(e) => {
                eprintln!("host-device: DEL goes on without ADD's record of the device: {e}");
                Ok(None)
            }
        };
        let mtu = recorded(req).and_then(|i| i.mtu);
        let returned = match (record, netkit::container_netns_for_del(req)) {
            // A record there but unreadable on disk: returning whatever CNI_IFNAME is could
            // move a link of the pod's onto the host.
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(Some((path, s))), Ok(Some(ns))) => return_recorded(&ns, &path, &s, mtu),
            (Ok(Some((path, s))), Ok(None)) => return_after_pod_gone(&path, &s, mtu),
            (Ok(None), Ok(Some(ns))) => {
                let mac = recorded(req).and_then(|i| i.mac.as_deref()).and_then(|m| m.parse::<Mac>().ok());
                move_out(&ns, &req.ifname, mtu, mac)
            }
            (Ok(None), Ok(None)) => rename_returned(req, mtu),
        };
        errs.record(returned);
        errs.finish()
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        let (prev, ns) = iface::check::start(req, conf.ipam_type.as_deref())?;
        // A DPDK device was never moved: prevResult lists no interface of the pod.
        if recorded(req).is_some() {
            iface::check::pod(&ns, &req.ifname, prev, true)?;
        }
        Ok(())
    }

    fn status(&self, req: &Request) -> Result<()> {
        match config::parse(req)?.ipam_type {
            Some(ipam) => invoke::delegate_status(&ipam, req),
            None => Ok(()),
        }
    }

    /// Records of attachments the runtime no longer lists are stale (another plugin's DEL, the
    /// reference's, returned the device): each device back on the host as its record left it gets
    /// its alias back, and the record goes. Then IPAM's GC. Without a list from the runtime nothing
    /// is taken as stale.
    fn gc(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        let mut errs = Errors::new();
        if req.conf.valid_attachments.is_some() {
            let keep: Vec<PathBuf> = req
                .valid_attachments()
                .iter()
                .map(|a| netkit::saved::path(&conf.data_dir, &a.container_id, &a.ifname))
                .collect();
            errs.record(collect_stale(&conf.data_dir, &keep));
        }
        if let Some(ipam) = &conf.ipam_type {
            errs.record(invoke::delegate_gc(ipam, req));
        }
        errs.finish()
    }
}

/// prevResult's record of the pod's interface.
fn recorded(req: &Request) -> Option<&Interface> {
    let prev = req.conf.prev_result.as_ref()?;
    prev.interfaces.iter().find(|i| i.name == req.ifname && i.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
}

fn add<'a>(pod: &'a Pod, conf: &'a HostDeviceConf, undo: &mut Undo<'a>) -> Result<CniResult> {
    let (req, host) = (pod.req, pod.host()?);
    let mut result = CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() };
    let dev = find_device(host, &conf.selector, Path::new("/sys"))?;
    if dev.as_ref().is_some_and(|d| d.name == "lo") {
        return Err(Error::config("host-device cannot move lo: name a network device"));
    }
    // IPAM first, so that its failure leaves the device untouched; dhcp leases through the
    // device, so it runs once the device is in the pod.
    let mut leased = match &conf.ipam_type {
        Some(t) if dev.is_none() || !ipam::releases_through_link(t) => Some(ipam::add(t, req, undo)?),
        _ => None,
    };
    let moved = match dev {
        Some(dev) => Some(move_in(pod, dev, saved_path(&conf.data_dir, req), undo)?),
        None => None,
    };
    if let (None, Some(t)) = (&leased, &conf.ipam_type) {
        leased = Some(ipam::add(t, req, undo)?);
    }
    if let Some(r) = leased {
        (result.ips, result.routes, result.dns) = (r.ips, r.routes, r.dns);
        if let Some(link) = &moved {
            set_gateways(&mut result, 0, false, false);
            // DAD off as in the other plugins: IPAM hands each address to one pod.
            configure::apply(pod, link.index, &result, false)?;
            libcni::fault_point("container-configured")?;
        }
    }
    if let Some(link) = moved {
        result.interfaces = vec![Interface {
            // The MTU the device had on the host: DEL puts it back (results from 1.0.0 on carry it).
            mtu: Some(link.mtu),
            pci_id: match &conf.selector {
                Selector::Pci(addr) => Some(addr.clone()),
                _ => None,
            },
            ..pod_interface(&link.name, &link, &pod.ns)
        }];
    }
    if let Some(dns) = &conf.dns {
        result.dns = dns.clone();
    }
    Ok(result)
}

/// Moves `dev` into the pod as its `ifname` and brings it up; the pod's link, with the MTU the
/// device had on the host. The record at `saved` is written first, and `undo` gives the device
/// back as it was from the first change on.
fn move_in<'a>(pod: &'a Pod, dev: Link, saved: PathBuf, undo: &mut Undo<'a>) -> Result<Link> {
    let (host, cont, ns, ifname) = (pod.host()?, &pod.nl, &pod.ns, pod.ifname());
    // A record of ours naming this device is stale, as the device is on the host: another
    // plugin's DEL (the reference's) returned it. Its alias is the device's own, not the host name
    // that moving it in left.
    let dev = match reclaim_stale(host, saved.parent().unwrap_or(Path::new("/")), &dev) {
        Ok(Some(back)) => back,
        Ok(None) => dev,
        Err(e) => {
            eprintln!("host-device: ADD of {} goes on without reclaiming stale records: {e}", dev.name);
            dev
        }
    };
    let what = |e: Error, step: &str| e.context(format_args!("{step} host device {}", dev.name));
    let snapshot = Snapshot::take(host, &dev).map_err(|e| what(e, "read the addresses and routes of"))?;
    // Kept before anything changes, so that DEL finds the device whenever it can be in the pod.
    let mut record = Saved::of(&dev);
    write_record(&saved, &record)?;
    let pod_index = Rc::new(Cell::new(None));
    {
        let (record, pod_index, saved) = (record.clone(), pod_index.clone(), saved.clone());
        undo.push(move || undo_move(host, ns, &Saved { pod_index: pod_index.get(), ..record }, &snapshot, &saved));
    }
    libcni::fault_point("device-saved")?;
    host.set_down(dev.index).map_err(|e| what(e, "set down"))?;
    libcni::fault_point("device-down")?;
    host.set_alias(dev.index, &dev.name).map_err(|e| what(e, "record the host name in the alias of"))?;
    libcni::fault_point("alias-set")?;
    host.set_netns_named(dev.index, ns, ifname).map_err(|e| what(e, "move into the pod"))?;
    libcni::fault_point("device-moved")?;
    let link = cont.link(ifname)?.ok_or_else(|| {
        Error::network(format!("{} moved into {} but {ifname} is not there", dev.name, ns.path().display()))
    })?;
    // The kernel keeps the index unless the pod has a link with it: the record must name the
    // index the device has there.
    if link.index != dev.index {
        record.pod_index = Some(link.index);
        pod_index.set(record.pod_index);
        write_record(&saved, &record)?;
    }
    cont.set_up(link.index).map_err(|e| e.context(format_args!("set up {ifname} in {}", ns.path().display())))?;
    libcni::fault_point("device-up")?;
    Ok(Link { mtu: dev.mtu, ..link })
}

/// What leaving its namespace takes from a device (the addresses the host gave it, the routes
/// through it) and its state: a failed ADD gives them back.
struct Snapshot {
    up: bool,
    addresses: Vec<RawAddress>,
    routes: Vec<RawRoute>,
}

/// RTPROT_*: routes the kernel makes again by itself (an address's own, learnt from a redirect
/// or a router advertisement), which a snapshot leaves out.
const RTPROT_REDIRECT: u8 = 1;
const RTPROT_KERNEL: u8 = 2;
const RTPROT_RA: u8 = 9;

impl Snapshot {
    fn take(host: &Netlink, dev: &Link) -> Result<Snapshot> {
        // Addresses learnt with a lifetime (SLAAC) come back by themselves too.
        let addresses = host.raw_addresses(dev.index)?.into_iter().filter(RawAddress::permanent).collect();
        let routes = host
            .raw_routes(None)?
            .into_iter()
            .filter(|r| r.oif() == Some(dev.index))
            .filter(|r| !matches!(r.protocol(), RTPROT_REDIRECT | RTPROT_KERNEL | RTPROT_RA))
            .collect();
        Ok(Snapshot { up: dev.up, addresses, routes })
    }

    /// Gives link `index` its state, addresses and routes back. A route whose gateway only
    /// another of them reaches is retried once that one is back; one already there (the kernel
    /// made it again, or someone added it meanwhile) is left as it is.
    fn restore(&self, host: &Netlink, index: u32) -> Result<()> {
        let mut errs = Errors::new();
        if self.up {
            errs.record(host.set_up(index));
        }
        for a in &self.addresses {
            match host.restore_address(index, a) {
                Err(e) if !netkit::is_exists(&e) => errs.push(e),
                _ => {}
            }
        }
        let mut pending: Vec<&RawRoute> = self.routes.iter().collect();
        loop {
            let before = pending.len();
            let mut failed = Vec::new();
            for r in pending {
                match host.readd_route(r, index) {
                    Err(e) if !netkit::is_exists(&e) => failed.push((r, e)),
                    _ => {}
                }
            }
            if failed.is_empty() || failed.len() == before {
                failed.into_iter().for_each(|(_, e)| errs.push(e));
                break;
            }
            pending = failed.into_iter().map(|(r, _)| r).collect();
        }
        errs.finish()
    }
}

/// A failed ADD's undo: the device `s` records back on the host under its name, with its alias,
/// MTU, state, addresses and routes as `snapshot` saw them, and no record at `path`. Best effort:
/// what fails is logged.
fn undo_move(host: &Netlink, ns: &NetNs, s: &Saved, snapshot: &Snapshot, path: &Path) {
    let returned = (|| -> Result<()> {
        let cont = Netlink::open_in(ns)?;
        let index = match cont.links()?.into_iter().find(|l| s.in_pod(l)) {
            Some(dev) => {
                cont.set_down(dev.index)?;
                cont.set_netns_named(dev.index, &NetNs::current()?, &s.name)?;
                host.link(&s.name)?.map_or(dev.index, |l| l.index)
            }
            // It never left.
            None => s.index,
        };
        let dev = host
            .link_by_index(index)?
            .ok_or_else(|| Error::network(format!("host device {} is gone ({})", s.name, s.looked_for())))?;
        let mut errs = Errors::new();
        errs.record(restore_recorded(host, &dev, s, None));
        errs.record(snapshot.restore(host, dev.index));
        errs.finish()
    })();
    if let Err(e) = returned {
        eprintln!("host-device: the failed ADD could not give host device {} back as it was: {e}", s.name);
    }
    if let Err(e) = netkit::saved::remove(path, "host-device") {
        eprintln!("host-device: {e}");
    }
}

/// DEL with ADD's record `s` (at `path`) and the pod's namespace `ns`: the device `s` identifies
/// ([`Saved::in_pod`]) goes back to this namespace under its recorded name, whatever the pod
/// calls or aliases it, gets what `s` recorded back, and the record goes. Nothing else in the
/// pod is touched. The device not in the pod is success: on the host already (the reference's
/// DEL returned it: [`give_back`]), or nowhere (the pod deleted a virtual device: logged). A
/// link at the device's index in the pod that does not prove to be it (the pod changed the MAC
/// of a device without a permanent one) is an error: it may be the device, or the pod's own.
fn return_recorded(ns: &NetNs, path: &Path, s: &Saved, prev_mtu: Option<u32>) -> Result<()> {
    let cont = Netlink::open_in(ns)?;
    let host = Netlink::open()?;
    let pod_links = cont.links()?;
    let Some(dev) = pod_links.iter().find(|l| s.in_pod(l)) else {
        if host.link(&s.name)?.is_some_and(|l| s.on_host(&l)) {
            return give_back(&host, path, s);
        }
        let at_index = pod_links.iter().find(|l| s.perm_mac.is_none() && l.index == s.index_in_pod());
        if let Some(other) = at_index {
            let want = s.mac.as_deref().unwrap_or("none");
            return Err(Error::network(format!(
                "{} in {} has the index {} host device {} has there, but MAC {}, not {want}: it does not prove to \
                 be {}, so it stays in the pod; give it MAC {want} and DEL again, or delete the pod's namespace",
                other.name,
                ns.path().display(),
                other.index,
                s.name,
                other.mac_string().as_deref().unwrap_or("none"),
                s.name,
            )));
        }
        eprintln!(
            "host-device: DEL finds host device {} neither in {} ({}) nor on the host: nothing to return",
            s.name,
            ns.path().display(),
            s.looked_for()
        );
        return netkit::saved::remove(path, "host-device");
    };
    if host.link(&s.name)?.is_some() {
        return Err(Error::network(format!(
            "cannot return host device {} ({} in {}): the host has another link called {}; rename that one and \
             DEL again",
            s.name,
            dev.name,
            ns.path().display(),
            s.name
        )));
    }
    let context = || format!("return host device {} ({} in {})", s.name, dev.name, ns.path().display());
    cont.set_down(dev.index).map_err(|e| e.context(context()))?;
    cont.set_netns_named(dev.index, &NetNs::current()?, &s.name).map_err(|e| e.context(context()))?;
    let back = host
        .link(&s.name)?
        .ok_or_else(|| Error::network(format!("{}: it left the pod but is not on the host", context())))?;
    restore_recorded(&host, &back, s, prev_mtu)?;
    netkit::saved::remove(path, "host-device")
}

/// DEL with ADD's record `s` (at `path`) and the pod's namespace gone. The kernel destroys a
/// virtual device with the namespace and returns a physical one to the initial namespace (this
/// one, on a node) under its pod name: the device `s` identifies ([`Saved::on_host`]) gets its
/// name and what `s` recorded back. Not found is success, logged.
fn return_after_pod_gone(path: &Path, s: &Saved, prev_mtu: Option<u32>) -> Result<()> {
    let host = Netlink::open()?;
    let Some(dev) = host.links()?.into_iter().find(|l| s.on_host(l)) else {
        eprintln!(
            "host-device: DEL finds host device {} nowhere ({}): the pod's namespace is gone, and a virtual \
             device goes with it",
            s.name,
            s.looked_for()
        );
        return netkit::saved::remove(path, "host-device");
    };
    if dev.name != s.name {
        if host.link(&s.name)?.is_some() {
            return Err(Error::network(format!(
                "cannot give host device {} (now {}) its name back: the host has another link called {}; rename \
                 that one and DEL again",
                s.name, dev.name, s.name
            )));
        }
        host.set_name(dev.index, &s.name)
            .map_err(|e| e.context(format_args!("give host device {} (now {}) its name back", s.name, dev.name)))?;
    }
    restore_recorded(&host, &Link { name: s.name.clone(), ..dev }, s, prev_mtu)?;
    netkit::saved::remove(path, "host-device")
}

/// Gives `dev`, the device `s` records, back on the host, its recorded alias, MTU (`prev_mtu`,
/// prevResult's, for a record that lacks it) and, for a device with a permanent MAC, the MAC it
/// had (the pod may have changed it).
fn restore_recorded(host: &Netlink, dev: &Link, s: &Saved, prev_mtu: Option<u32>) -> Result<()> {
    let mut errs = Errors::new();
    let name = &s.name;
    if let Some(mtu) = s.mtu.or(prev_mtu).filter(|m| *m != dev.mtu) {
        errs.record(host.set_mtu(dev.index, mtu).map_err(|e| e.context(format_args!("give {name} its MTU back"))));
    }
    if s.perm_mac.is_some() {
        if let Some(mac) = s.mac.as_deref().and_then(|m| m.parse::<Mac>().ok()).filter(|m| dev.mac != Some(*m)) {
            errs.record(host.set_mac(dev.index, mac).map_err(|e| e.context(format_args!("give {name} its MAC back"))));
        }
    }
    if dev.alias.as_deref().unwrap_or_default() != s.alias {
        errs.record(
            host.set_alias(dev.index, &s.alias)
                .map_err(|e| e.context(format_args!("give {name} its alias {:?} back", s.alias))),
        );
    }
    errs.finish()
}

/// Moves the pod's `ifname` back to this namespace under the host name its alias records, with
/// `mtu` when given: a device the reference moved in (no record of ours). Success when the pod
/// has no `ifname`, or when the host has that name on a link with `mac` (prevResult's): moved
/// back already, and the pod's `ifname` is not it.
fn move_out(ns: &NetNs, ifname: &str, mtu: Option<u32>, mac: Option<Mac>) -> Result<()> {
    let cont = Netlink::open_in(ns)?;
    let Some(link) = cont.link(ifname)? else { return Ok(()) };
    let name = link.alias.clone().filter(|a| netkit::valid_ifname(a)).ok_or_else(|| {
        Error::network(format!(
            "{ifname} in {} has no host name in its alias: host-device did not move it there, so it stays",
            ns.path().display()
        ))
    })?;
    let home = NetNs::current()?;
    let host = Netlink::open()?;
    if let Some(there) = host.link(&name)? {
        if mac.is_some() && there.mac == mac {
            eprintln!(
                "host-device: {name} is back on the host already (it has prevResult's MAC): {ifname} in {} is not it, \
                 so it stays",
                ns.path().display()
            );
            return Ok(());
        }
        return Err(Error::network(format!(
            "cannot return {ifname} from {} as {name}: the host has another link called {name}; rename that one \
             and DEL again",
            ns.path().display()
        )));
    }
    cont.set_down(link.index)?;
    cont.set_netns_named(link.index, &home, &name)
        .map_err(|e| e.context(format_args!("return {ifname} from {} as {name}", ns.path().display())))?;
    restore_mtu(&host, &name, mtu)
}

/// What ADD keeps of the device on the host, for DEL (and for its own undo).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Saved {
    /// Its host name (also in its alias while it is in the pod).
    name: String,
    /// Its alias on the host, empty for none.
    alias: String,
    /// Its index on the host.
    index: u32,
    mac: Option<String>,
    /// The MAC it came with, when the kernel reports one: the pod cannot change it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    perm_mac: Option<String>,
    /// Its index in the pod, when the kernel gave it another there (the pod had a link with its
    /// own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
}

/// `<dataDir>/<containerID>_<ifname>.json`.
fn saved_path(dir: &Path, req: &Request) -> PathBuf {
    netkit::saved::path(dir, &req.container_id, &req.ifname)
}

fn write_record(path: &Path, s: &Saved) -> Result<()> {
    let bytes = serde_json::to_vec(s)
        .map_err(|e| Error::new(code::INTERNAL, format!("host-device: encode the record of {}: {e}", s.name)))?;
    netkit::saved::write(path, &bytes, "host-device: save the record of the device")
}

/// The record at `path`, `None` when there is none. One that does not parse is removed: DEL then
/// returns the device as the reference does.
fn read_record(path: &Path) -> Result<Option<(PathBuf, Saved)>> {
    let Some(bytes) = netkit::saved::read(path, "host-device")? else { return Ok(None) };
    match serde_json::from_slice::<Saved>(&bytes) {
        Ok(s) => Ok(Some((path.to_path_buf(), s))),
        Err(e) => {
            eprintln!("host-device: {} is unreadable, so DEL returns the device by its alias: {e}", path.display());
            netkit::saved::remove(path, "host-device")?;
            Ok(None)
        }
    }
}

/// The device `s` records, back on the host under its saved name, still carrying that name as its
/// alias (as moving it in left it) and the same device ([`Saved::on_host`]), gets its own alias
/// back (none when it had none). Then the record at `path` goes: whatever was not found is not
/// there to restore.
fn give_back(host: &Netlink, path: &Path, s: &Saved) -> Result<()> {
    if let Some(link) = host.link(&s.name)?.filter(|l| s.left(l)) {
        host.set_alias(link.index, &s.alias)
            .map_err(|e| e.context(format_args!("give {} its alias {:?} back", s.name, s.alias)))?;
    }
    netkit::saved::remove(path, "host-device")
}

impl Saved {
    fn of(dev: &Link) -> Saved {
        Saved {
            name: dev.name.clone(),
            alias: dev.alias.clone().unwrap_or_default(),
            index: dev.index,
            mac: dev.mac_string(),
            perm_mac: dev.perm_mac.map(|m| m.to_string()),
            pod_index: None,
            mtu: Some(dev.mtu),
        }
    }

    fn index_in_pod(&self) -> u32 {
        self.pod_index.unwrap_or(self.index)
    }

    /// Whether `link` is the device: the same permanent MAC when it has one (no link the pod
    /// makes has it); else the same MAC and one of `indexes` (an index is unique in a namespace,
    /// and the kernel keeps it across a move when it can).
    fn is_at(&self, link: &Link, indexes: &[u32]) -> bool {
        match &self.perm_mac {
            Some(perm) => link.perm_mac.map(|m| m.to_string()).as_ref() == Some(perm),
            None => link.mac_string() == self.mac && indexes.contains(&link.index),
        }
    }

    /// Whether `link`, in the pod, is the device.
    fn in_pod(&self, link: &Link) -> bool {
        self.is_at(link, &[self.index_in_pod()])
    }

    /// Whether `link`, on the host, is the device (back from the pod, it may keep its pod index).
    fn on_host(&self, link: &Link) -> bool {
        self.is_at(link, &[self.index, self.index_in_pod()])
    }

    /// Whether `link` is the device, on the host as moving it into a pod left it.
    fn left(&self, link: &Link) -> bool {
        link.alias.as_deref() == Some(self.name.as_str()) && self.on_host(link)
    }

    /// What identifies the device, for messages.
    fn looked_for(&self) -> String {
        match &self.perm_mac {
            Some(perm) => format!("looked for permanent MAC {perm}"),
            None => {
                format!("looked for index {} with MAC {}", self.index_in_pod(), self.mac.as_deref().unwrap_or("none"))
            }
        }
    }
}

/// The records of ours in `dir` (files that parse as one), with their paths; none when `dir` does
/// not exist.
fn records(dir: &Path) -> Result<Vec<(PathBuf, Saved)>> {
    let paths = netkit::saved::list(dir, "host-device")?;
    Ok(paths
        .into_iter()
        .filter_map(|p| {
            let bytes = netkit::saved::read(&p, "host-device").ok()??;
            Some((p, serde_json::from_slice(&bytes).ok()?))
        })
        .collect())
}

/// GC: gives back what each record in `dir` but those at `keep` saved, and removes them.
fn collect_stale(dir: &Path, keep: &[PathBuf]) -> Result<()> {
    let stale: Vec<_> = records(dir)?.into_iter().filter(|(p, _)| !keep.contains(p)).collect();
    if stale.is_empty() {
        return Ok(());
    }
    let host = Netlink::open()?;
    let mut errs = Errors::new();
    for (path, saved) in &stale {
        errs.record(give_back(&host, path, saved));
    }
    errs.finish()
}

/// Before ADD moves `dev`, a device of the host: gives back what each record in `dir` naming it
/// saved (none can be current, as the device is not in a pod) and removes those records. The
/// device as it then is, when a record was given back.
fn reclaim_stale(host: &Netlink, dir: &Path, dev: &Link) -> Result<Option<Link>> {
    let mut reclaimed = false;
    for (path, saved) in records(dir)? {
        if saved.name == dev.name && saved.on_host(dev) {
            give_back(host, &path, &saved)?;
            reclaimed = true;
        }
    }
    if !reclaimed {
        return Ok(None);
    }
    host.link_by_index(dev.index)
}

fn restore_mtu(host: &Netlink, name: &str, mtu: Option<u32>) -> Result<()> {
    let Some(mtu) = mtu else { return Ok(()) };
    match host.link(name)? {
        Some(l) if l.mtu != mtu => host.set_mtu(l.index, mtu).map_err(|e| e.context(format_args!("restore {name}"))),
        _ => Ok(()),
    }
}

/// DEL with the pod's namespace gone and no record of ours: a physical device the kernel
/// returned to this (the initial) namespace is here under CNI_IFNAME (or `dev<N>` when that was
/// taken), with prevResult's MAC and its host name in the alias: it gets that name back. Nothing
/// else is touched.
fn rename_returned(req: &Request, mtu: Option<u32>) -> Result<()> {
    let Some(mac) = recorded(req).and_then(|i| i.mac.as_deref()).and_then(|m| m.parse::<Mac>().ok()) else {
        return Ok(());
    };
    let host = Netlink::open()?;
    let Some(link) = host.link_by_mac(mac)? else { return Ok(()) };
    let Some(name) = link.alias.clone().filter(|a| *a != link.name && netkit::valid_ifname(a)) else { return Ok(()) };
    if link.up || host.link(&name)?.is_some() {
        return Ok(());
    }
    host.set_name(link.index, &name).map_err(|e| e.context(format_args!("give {} back its name", link.name)))?;
    restore_mtu(&host, &name, mtu)
}

/// The host device `selector` names; `None` for a PCI device a userspace driver holds (nothing to
/// move). `sys` is sysfs' mount point.
fn find_device(host: &Netlink, selector: &Selector, sys: &Path) -> Result<Option<Link>> {
    let missing = |what: String| Error::new(code::NETWORK, format!("host device {what} not found in this namespace"));
    let by_name = |name: &str, what: String| host.link(name)?.ok_or_else(|| missing(what)).map(Some);
    match selector {
        Selector::Device(name) => by_name(name, name.clone()),
        Selector::HwAddr(mac) => host.link_by_mac(*mac)?.ok_or_else(|| missing(format!("with MAC {mac}"))).map(Some),
        Selector::KernelPath(path) => {
            let names = net_names(&path.join("net"))?;
            let links = host.links()?;
            let link = names.iter().find_map(|n| links.iter().find(|l| &l.name == n));
            link.cloned().ok_or_else(|| missing(format!("at {}", path.display()))).map(Some)
        }
        Selector::Pci(addr) => {
            let dev = sys.join("bus/pci/devices").join(addr);
            if userspace_driver(&dev).is_some() {
                return Ok(None);
            }
            let name = pci_net_name(&dev)?.ok_or_else(|| missing(format!("of PCI device {addr}")))?;
            by_name(&name, format!("{name} (PCI {addr})"))
        }
        Selector::Auxiliary(id) => {
            let names = net_names(&sys.join("bus/auxiliary/devices").join(id).join("net"))?;
            let name = names.into_iter().next().ok_or_else(|| missing(format!("of auxiliary device {id}")))?;
            by_name(&name, format!("{name} (auxiliary {id})"))
        }
    }
}

/// The interface names listed in a sysfs `net` directory, sorted.
fn net_names(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::new(code::NETWORK, format!("no network devices at {}: {e}", dir.display())))?;
    let mut names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    Ok(names)
}

/// A PCI device's interface name: under `net/`, or `virtio*/net/` for a virtio device.
fn pci_net_name(dev: &Path) -> Result<Option<String>> {
    let mut dir = dev.join("net");
    if !dir.is_dir() {
        let entries = std::fs::read_dir(dev)
            .map_err(|e| Error::new(code::NETWORK, format!("PCI device {}: {e}", dev.display())))?;
        let mut virtio: Vec<_> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("virtio"))
            .map(|e| e.path().join("net"))
            .filter(|p| p.is_dir())
            .collect();
        virtio.sort();
        match virtio.into_iter().next() {
            Some(d) => dir = d,
            None => {
                return Err(Error::new(code::NETWORK, format!("no net directory under PCI device {}", dev.display())))
            }
        }
    }
    Ok(net_names(&dir)?.into_iter().next())
}

/// The userspace driver bound to a PCI device, if one is.
fn userspace_driver(dev: &Path) -> Option<String> {
    let driver = std::fs::read_link(dev.join("driver")).ok()?;
    let name = driver.file_name()?.to_str()?.to_string();
    USERSPACE_DRIVERS.contains(&name.as_str()).then_some(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn link(index: u32, mac: [u8; 6], perm_mac: Option<[u8; 6]>) -> Link {
        Link {
            index,
            name: "x".into(),
            kind: None,
            mac: Some(Mac(mac)),
            perm_mac: perm_mac.map(Mac),
            mtu: 1500,
            master: None,
            up: false,
            oper_up: false,
            oper_state: "down".into(),
            promisc: false,
            link_index: None,
            link_netnsid: None,
            vlan_filtering: None,
            alias: None,
        }
    }

    /// A NIC is known by its permanent MAC, whatever its MAC or index; a device without one by
    /// its MAC and its index there, both.
    #[test]
    fn identity_of_the_recorded_device() {
        let (m1, m2, p1) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [0, 0x1b, 0x21, 0, 0, 1]);
        let nic = Saved::of(&link(7, m1, Some(p1)));
        assert!(nic.in_pod(&link(9, m2, Some(p1))) && nic.on_host(&link(9, m2, Some(p1))));
        assert!(!nic.in_pod(&link(7, m1, None)), "a copy of its MAC at its index");
        assert!(!nic.in_pod(&link(7, m1, Some(m1))));
        assert_eq!(nic.looked_for(), "looked for permanent MAC 00:1b:21:00:00:01");

        let mut veth = Saved::of(&link(7, m1, None));
        assert!(veth.in_pod(&link(7, m1, None)));
        assert!(!veth.in_pod(&link(8, m1, None)), "its MAC at another index");
        assert!(!veth.in_pod(&link(7, m2, None)), "another MAC at its index");
        veth.pod_index = Some(12);
        assert!(veth.in_pod(&link(12, m1, None)) && !veth.in_pod(&link(7, m1, None)));
        assert!(veth.on_host(&link(12, m1, None)) && veth.on_host(&link(7, m1, None)));
        assert_eq!(veth.looked_for(), "looked for index 12 with MAC 02:00:00:00:00:01");
        // A record of name, alias, index and MAC alone reads, with no MTU to give back.
        let old: Saved =
            serde_json::from_str(r#"{"name":"hd0","alias":"","index":7,"mac":"02:00:00:00:00:01"}"#).unwrap();
        assert!(old.in_pod(&link(7, m1, None)) && old.mtu.is_none());
    }

    /// A fake sysfs: PCI devices with a kernel driver, a DPDK driver and a virtio layout.
    #[test]
    fn pci_lookup_in_sysfs() {
        let root = std::env::temp_dir().join(format!("hostdev-sys-{}", std::process::id()));
        let pci = root.join("bus/pci/devices");
        let drivers = root.join("bus/pci/drivers");
        for d in ["vfio-pci", "ixgbe"] {
            std::fs::create_dir_all(drivers.join(d)).unwrap();
        }
        std::fs::create_dir_all(pci.join("0000:03:00.0/net/enp3s0f0")).unwrap();
        std::os::unix::fs::symlink(drivers.join("ixgbe"), pci.join("0000:03:00.0/driver")).unwrap();
        std::fs::create_dir_all(pci.join("0000:03:00.1")).unwrap();
        std::os::unix::fs::symlink(drivers.join("vfio-pci"), pci.join("0000:03:00.1/driver")).unwrap();
        std::fs::create_dir_all(pci.join("0000:00:03.0/virtio0/net/ens3")).unwrap();
        std::fs::create_dir_all(pci.join("0000:00:04.0")).unwrap();

        assert_eq!(userspace_driver(&pci.join("0000:03:00.0")), None);
        assert_eq!(userspace_driver(&pci.join("0000:03:00.1")).as_deref(), Some("vfio-pci"));
        assert_eq!(pci_net_name(&pci.join("0000:03:00.0")).unwrap().as_deref(), Some("enp3s0f0"));
        assert_eq!(pci_net_name(&pci.join("0000:00:03.0")).unwrap().as_deref(), Some("ens3"));
        let e = pci_net_name(&pci.join("0000:00:04.0")).unwrap_err();
        assert!(e.msg.contains("no net directory under PCI device"), "{}", e.msg);
        // A DPDK device is found without a netlink query: nothing to move.
        let nl = Netlink::open();
        if let Ok(nl) = nl {
            assert_eq!(find_device(&nl, &Selector::Pci("0000:03:00.1".into()), &root).unwrap(), None);
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}

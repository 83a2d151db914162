//! host-device: moves an existing device of the host (a NIC, an SR-IOV VF, a macvlan...) into the
//! pod, renamed to CNI_IFNAME, with addresses from IPAM when there is an `ipam` section; DEL moves
//! it back under its host name. As the reference, the host name travels in the device's alias
//! (IFLA_IFALIAS), so either plugin returns a device the other moved in. The alias the device had
//! is kept in `<dataDir>/<containerID>_<ifname>.json` and given back on DEL (the reference leaves
//! the host name in the alias for good); a device the reference moved in keeps its alias as the
//! reference leaves it. A record the reference's DEL orphaned is reclaimed by our next ADD of the
//! device or by GC. A PCI device bound to a userspace (DPDK) driver has no network interface to
//! move: ADD only runs IPAM, as the reference.

pub mod config;

use config::{HostDeviceConf, Selector};
use libcni::invoke;
use libcni::types::{CniResult, Interface};
use libcni::{code, Error, Errors, Plugin, Request, Result};
use netkit::iface::{self, Undo};
use netkit::{Link, NetNs, Netlink};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
        iface::ipam_ready(req, conf.ipam_type.as_deref())?;
        iface::refuse_addressless_legacy(req, conf.ipam_type.as_deref())?;
        let (ns, cont, host) = iface::open_pod_and_host_for_add(req)?;
        iface::add_or_undo(req, |undo| add(req, &conf, &ns, &cont, &host, undo))
    }

    /// Releases the addresses and returns the device to this namespace under its host name (its
    /// MTU as ADD found it, when prevResult records it), each best effort. A device no longer in
    /// the pod is success: DEL already ran, or the pod's namespace is gone (the kernel destroys a
    /// virtual device with it, and returns a physical one to the initial namespace, where DEL
    /// gives it back its name). Needs no valid configuration: everything comes from the pod.
    fn del(&self, req: &Request) -> Result<()> {
        let mut errs = Errors::new();
        if let Err(e) = config::parse(req) {
            eprintln!("host-device: DEL returns the device all the same, as its configuration is invalid: {e}");
        }
        if let Some(ipam) = req.conf.ipam_type().filter(|t| !t.is_empty()) {
            errs.record(invoke::delegate_del(ipam, req));
        }
        let mtu = recorded(req).and_then(|i| i.mtu);
        let returned = match netkit::container_netns_for_del(req) {
            Ok(Some(ns)) => move_out(&ns, &req.ifname, mtu),
            Ok(None) => rename_returned(req, mtu),
            Err(e) => Err(e),
        };
        match returned {
            // The device is out of the pod (or gone with it): its own alias back, if ADD kept it.
            Ok(()) => match netkit::saved::dir_for_del(&req.raw, config::DEFAULT_DATA_DIR, "host-device") {
                Ok(dir) => {
                    errs.record(restore_alias(&saved_path(&dir, req)));
                }
                Err(e) => eprintln!("host-device: DEL cannot give the device its alias back: {e}"),
            },
            Err(e) => errs.push(e),
        }
        errs.finish()
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        let (prev, ns) = iface::check_start(req, conf.ipam_type.as_deref())?;
        // A DPDK device was never moved: prevResult lists no interface of the pod.
        if recorded(req).is_some() {
            iface::check_pod(&ns, &req.ifname, prev, true)?;
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

fn add<'a>(
    req: &'a Request,
    conf: &'a HostDeviceConf,
    ns: &'a NetNs,
    cont: &Netlink,
    host: &'a Netlink,
    undo: &mut Undo<'a>,
) -> Result<CniResult> {
    let mut result = CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() };
    let moved = match find_device(host, &conf.selector, Path::new("/sys"))? {
        Some(dev) => {
            let saved = saved_path(&conf.data_dir, req);
            Some(move_in(host, cont, ns, dev, &req.ifname, saved, undo)?)
        }
        None => None,
    };
    if let Some(ipam) = &conf.ipam_type {
        let r = iface::ipam_add(ipam, req, undo)?;
        (result.ips, result.routes, result.dns) = (r.ips, r.routes, r.dns);
        if let Some(link) = &moved {
            iface::set_gateways(&mut result, 0, false, false);
            // DAD off as in the other plugins: IPAM hands each address to one pod.
            iface::configure(cont, ns, &req.ifname, link.index, &result, false)?;
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
            ..iface::pod_interface(&link.name, &link, ns)
        }];
    }
    if let Some(dns) = &conf.dns {
        result.dns = dns.clone();
    }
    Ok(result)
}

/// Moves `dev` into the pod as `ifname` and brings it up; the pod's link, with the MTU the
/// device had on the host.
fn move_in<'a>(
    host: &'a Netlink,
    cont: &Netlink,
    ns: &'a NetNs,
    dev: Link,
    ifname: &'a str,
    saved: PathBuf,
    undo: &mut Undo<'a>,
) -> Result<Link> {
    if dev.name == "lo" {
        return Err(Error::config("host-device cannot move lo: name a network device"));
    }
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
    let (index, was_up, old_alias) = (dev.index, dev.up, dev.alias.clone().unwrap_or_default());
    // Kept before the alias changes, so that DEL finds it whenever the device can be in the pod.
    let record = Saved { name: dev.name.clone(), alias: old_alias.clone(), index, mac: dev.mac_string() };
    let bytes = serde_json::to_vec(&record)
        .map_err(|e| Error::new(code::INTERNAL, format!("host-device: encode the saved alias: {e}")))?;
    netkit::saved::write(&saved, &bytes, "host-device: save the alias of the device")?;
    // A failed ADD gives the device back as it was: up if it was, its own alias.
    undo.push(move || {
        let _ = host.set_alias(index, &old_alias);
        if was_up {
            let _ = host.set_up(index);
        }
        let _ = netkit::saved::remove(&saved, "host-device");
    });
    host.set_down(index).map_err(|e| what(e, "set down"))?;
    host.set_alias(index, &dev.name).map_err(|e| what(e, "record the host name in the alias of"))?;
    host.set_netns_named(index, ns, ifname).map_err(|e| what(e, "move into the pod"))?;
    // Runs before the step above restores alias and state (newest first); the kernel keeps the
    // device's index when it returns, as nothing took it meanwhile.
    undo.push(move || {
        let _ = move_out(ns, ifname, None);
    });
    let link = cont.link(ifname)?.ok_or_else(|| {
        Error::network(format!("{} moved into {} but {ifname} is not there", dev.name, ns.path().display()))
    })?;
    cont.set_up(link.index).map_err(|e| e.context(format_args!("set up {ifname} in {}", ns.path().display())))?;
    Ok(Link { mtu: dev.mtu, ..link })
}

/// Moves the pod's `ifname` back to this namespace under the host name its alias records, with
/// `mtu` when given. Success when the pod has no `ifname` (moved back already).
fn move_out(ns: &NetNs, ifname: &str, mtu: Option<u32>) -> Result<()> {
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
    if host.link(&name)?.is_some() {
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

/// What ADD keeps of the device on the host, for DEL.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    /// Its host name (also in its alias while it is in the pod).
    name: String,
    /// Its alias on the host, empty for none.
    alias: String,
    index: u32,
    mac: Option<String>,
}

/// `<dataDir>/<containerID>_<ifname>.json`.
fn saved_path(dir: &Path, req: &Request) -> PathBuf {
    netkit::saved::path(dir, &req.container_id, &req.ifname)
}

/// DEL, once the device is out of the pod: gives back what `saved` records (`give_back`). Nothing
/// saved (the reference moved the device in): nothing to do.
fn restore_alias(saved: &Path) -> Result<()> {
    let Some(bytes) = netkit::saved::read(saved, "host-device")? else { return Ok(()) };
    match serde_json::from_slice::<Saved>(&bytes) {
        Ok(s) => give_back(&Netlink::open()?, saved, &s),
        Err(e) => {
            eprintln!("host-device: {} is unreadable, so the alias stays: {e}", saved.display());
            netkit::saved::remove(saved, "host-device")
        }
    }
}

/// The device `s` records, back on the host under its saved name, still carrying that name as its
/// alias (as moving it in left it) and the same device (its index or MAC), gets its own alias back
/// (none when it had none). Then the record at `path` goes: whatever was not found is not there to
/// restore.
fn give_back(host: &Netlink, path: &Path, s: &Saved) -> Result<()> {
    if let Some(link) = host.link(&s.name)?.filter(|l| s.left(l)) {
        host.set_alias(link.index, &s.alias)
            .map_err(|e| e.context(format_args!("give {} its alias {:?} back", s.name, s.alias)))?;
    }
    netkit::saved::remove(path, "host-device")
}

impl Saved {
    /// Whether `link` is the device this records (its index or its MAC).
    fn is(&self, link: &Link) -> bool {
        link.index == self.index || link.mac_string() == self.mac
    }

    /// Whether `link` is the device this records, as moving it into a pod left it.
    fn left(&self, link: &Link) -> bool {
        link.alias.as_deref() == Some(self.name.as_str()) && self.is(link)
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
        if saved.name == dev.name && saved.is(dev) {
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

/// DEL with the pod's namespace gone: a physical device the kernel returned to this (the initial)
/// namespace is here under CNI_IFNAME (or `dev<N>` when that was taken), with prevResult's MAC and
/// its host name in the alias: it gets that name back. Nothing else is touched.
fn rename_returned(req: &Request, mtu: Option<u32>) -> Result<()> {
    let Some(mac) = recorded(req).and_then(|i| i.mac.as_deref()).and_then(netkit::parse_mac) else { return Ok(()) };
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
        Selector::HwAddr(mac) => {
            host.link_by_mac(*mac)?.ok_or_else(|| missing(format!("with MAC {}", netkit::format_mac(mac)))).map(Some)
        }
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

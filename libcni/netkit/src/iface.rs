//! The steps every interface plugin shares (bridge, ptp, host-device, macvlan, ipvlan, vlan, dummy
//! and tap), in the order ADD takes them:
//!
//! 1. open and guard the pod's namespace and refuse an `ifname` already there
//!    ([`open_pod_for_add`], [`open_pod_and_host_for_add`]);
//! 2. create the link: a veth pair with a host name derived from the attachment ([`create_veth`]);
//! 3. ask IPAM ([`ipam_add`]), fill gateways and default routes ([`set_gateways`]);
//! 4. configure the pod's interface from the result ([`configure`], Go's `ipam.ConfigureIface`);
//! 5. forwarding sysctls for the families in use ([`enable_forwarding`]);
//!
//! each successful step registering its reversal in an [`Undo`] that a failed ADD runs. CHECK
//! starts with prevResult, the namespace and IPAM ([`check_start`]) and compares the pod's
//! interface with prevResult ([`check_pod`], Go's `ip.ValidateExpectedInterfaceIPs` and
//! `ValidateExpectedRoute`); DEL removes the pod's link, or a veth's host end stranded by a
//! namespace that is gone ([`del_pod_link`]). A chained ADD outputs the previous result with its
//! own appended ([`chained`]); a chained plugin gets its prevResult from [`chained_prev_result`].
//! A plugin that masquerades (bridge, ptp) shares its STATUS, GC and DEL of the rules
//! ([`status_masquerading`], [`gc_masquerading`], [`del_masquerade`]).

pub mod hostnet;
pub mod sublink;

use crate::firewall::{self, IpMasq, Masquerade};
use crate::sysctl;
use crate::{Family, Link, Mac, NetNs, Netlink, RouteSpec};
use ipnetwork::IpNetwork;
use libcni::conf::kind;
use libcni::conf::Attachment;
use libcni::gojson;
use libcni::invoke;
use libcni::types::{CniResult, Interface, IpConfig, Route};
use libcni::{code, Error, Errors, Request, Result};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What a failed ADD must undo: each step registers its reversal as it starts, and [`Undo::run`]
/// runs them newest first, best effort. A successful ADD drops it unrun.
#[derive(Default)]
pub struct Undo<'a> {
    steps: Vec<Box<dyn FnOnce() + 'a>>,
}

impl<'a> Undo<'a> {
    pub fn push(&mut self, step: impl FnOnce() + 'a) {
        self.steps.push(Box::new(step));
    }

    /// Runs the reversals, the last registered first.
    pub fn run(self) {
        self.steps.into_iter().rev().for_each(|step| step());
    }

    /// Runs an ADD's steps with a fresh `Undo`, and the reversals they registered when they fail.
    pub fn guarded<T>(steps: impl FnOnce(&mut Undo<'a>) -> Result<T>) -> Result<T> {
        let mut undo = Undo::default();
        let done = steps(&mut undo);
        if done.is_err() {
            undo.run();
        }
        done
    }
}

/// Fails when `ifname` already exists in the pod's namespace: an ADD without a DEL in between.
pub fn ensure_absent(cont: &Netlink, ns: &NetNs, ifname: &str) -> Result<()> {
    if cont.link(ifname)?.is_some() {
        return Err(Error::new(
            code::NETWORK,
            format!("interface {ifname} already exists in {}: DEL the attachment first", ns.path().display()),
        ));
    }
    Ok(())
}

/// A MAC address for a pod's interface, as a configuration gives it: six hex bytes, unicast.
pub fn unicast_mac(s: &str) -> Result<Mac> {
    crate::parse_unicast_mac(s).map_err(|why| Error::config(format!("invalid MAC address {s:?}: {why}")))
}

/// The MAC a runtime asks for, the later source winning: `configured` (a plugin's own `mac` key),
/// `CNI_ARGS MAC`, `args.cni.mac` (only with `args_cni`: bridge reads it, macvlan does not), then
/// `runtimeConfig.mac` (the `mac` capability). Keys are matched as Go does ([`gojson::get`]); an
/// empty string counts as unset.
pub fn requested_mac(req: &Request, configured: Option<&str>, args_cni: bool) -> Result<Option<Mac>> {
    let mut mac = configured.map(str::to_string);
    if let Some(m) = req.args.get("MAC") {
        mac = Some(m.to_string());
    }
    let from_args = gojson::get(&req.conf.args, "cni")
        .filter(|_| args_cni)
        .and_then(|(c, cni)| Some((c, gojson::get(cni.as_object()?, "mac")?)))
        .map(|(c, (k, v))| (format!("args.{c}.{k}"), v));
    let from_runtime = gojson::get(&req.conf.runtime_config, "mac").map(|(k, v)| (format!("runtimeConfig.{k}"), v));
    for (key, v) in [from_args, from_runtime].into_iter().flatten() {
        match v {
            Value::Null => {}
            Value::String(s) if s.is_empty() => {}
            Value::String(s) => mac = Some(s.clone()),
            other => return Err(Error::config(format!("{key} must be a string, got {}", kind(other)))),
        }
    }
    mac.filter(|m| !m.is_empty()).map(|m| unicast_mac(&m)).transpose()
}

/// An `mtu` key: 68-65535, or 0 (absent) for the kernel's default; `None` for the default.
pub fn mtu_key(m: Option<&gojson::Spelled<i64>>) -> Result<Option<u32>> {
    match m {
        None | Some(gojson::Spelled { value: 0, .. }) => Ok(None),
        Some(gojson::Spelled { value: v @ 68..=65535, .. }) => Ok(Some(*v as u32)),
        Some(m) => {
            let key = m.key_or("mtu");
            Err(Error::config(format!("invalid {key} {}: use 68-65535, or 0 for the kernel default", m.value)))
        }
    }
}

/// Candidate names for a veth's host end, derived from the attachment (`attempt` 0 first). A later
/// attempt is used only when a hash collision gives another pod's veth the same name.
pub fn host_veth_name(container_id: &str, ifname: &str, attempt: u32) -> String {
    let seed =
        if attempt == 0 { format!("{container_id}:{ifname}") } else { format!("{container_id}:{ifname}:{attempt}") };
    let digest = Sha256::digest(seed.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("veth{hex}")
}

/// How many host names ADD tries before giving up on collisions.
pub const HOST_NAME_ATTEMPTS: u32 = 8;

/// Creates the pair `<host name>` (on the host) - `ifname` (in `ns`) in one request; the host
/// end's name and link. The pod has no `ifname` ([`ensure_absent`]) and the pair dies with the
/// pod's namespace, so a host link holding a candidate name is another pod's: the next is tried.
pub fn create_veth(
    host: &Netlink,
    container_id: &str,
    ifname: &str,
    ns: &NetNs,
    mtu: Option<u32>,
    mac: Option<Mac>,
) -> Result<(String, Link)> {
    for attempt in 0..HOST_NAME_ATTEMPTS {
        let candidate = host_veth_name(container_id, ifname, attempt);
        if host.link(&candidate)?.is_some() {
            continue;
        }
        match host.create_veth(&candidate, ifname, ns, mtu, mac) {
            Ok(link) => return Ok((candidate, link)),
            // Another ADD took the name between the lookup and the create.
            Err(e) if crate::is_exists(&e) && host.link(&candidate)?.is_some() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::network(format!("no free host veth name for {container_id}:{ifname} after {HOST_NAME_ATTEMPTS} tries")))
}

/// Runs the IPAM plugin's ADD. Its DEL is registered in `undo` before the call: an IPAM plugin
/// that died half-way may hold a reservation, and its DEL releases only what this attachment holds.
pub fn ipam_add<'a>(ipam: &'a str, req: &'a Request, undo: &mut Undo<'a>) -> Result<CniResult> {
    undo.push(move || {
        let _ = invoke::delegate_del(ipam, req);
    });
    let r = invoke::delegate_add(ipam, req)?;
    libcni::fault_point("ipam-done")?;
    if r.ips.is_empty() {
        return Err(Error::new(code::PLUGIN_EXEC, format!("IPAM plugin {ipam} returned no IP addresses")));
    }
    Ok(r)
}

pub fn is_v4(n: &IpNetwork) -> bool {
    matches!(n, IpNetwork::V4(_))
}

/// The first address after the network address: the default gateway of a subnet.
pub fn subnet_gateway(n: &IpNetwork) -> IpAddr {
    match n {
        IpNetwork::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4.network()).wrapping_add(1))),
        IpNetwork::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6.network()).wrapping_add(1))),
    }
}

/// Points each address at the result's interface `index`. With `gateway`, an address IPAM gave no
/// gateway gets its subnet's first address; with `default_route`, each family with a gateway and
/// no default route gets one through it.
pub fn set_gateways(result: &mut CniResult, index: usize, gateway: bool, default_route: bool) {
    for ip in &mut result.ips {
        ip.interface = Some(index);
        if gateway && ip.gateway.is_none() {
            ip.gateway = Some(subnet_gateway(&ip.address));
        }
    }
    if !default_route {
        return;
    }
    for family in [Family::V4, Family::V6] {
        let Some(gw) = result.ips.iter().find(|ip| Family::of_net(&ip.address) == family).and_then(|ip| ip.gateway)
        else {
            continue;
        };
        if !result.routes.iter().any(|r| Family::of_net(&r.dst) == family && r.dst.prefix() == 0) {
            result.routes.push(Route {
                dst: family.default_dst(),
                gw: Some(gw),
                mtu: None,
                advmss: None,
                priority: None,
                table: None,
                scope: None,
            });
        }
    }
}

/// How [`configure`] takes the failure of one of its requests: the first failure it does not
/// ignore is ADD's error, with the context given.
enum OnFailure {
    Ignore,
    Fail(Option<String>),
    /// A route already there is kept.
    FailUnlessExists(String),
}

/// Configures the pod's interface `index` (named `ifname`, in `ns`, `cont` a connection there)
/// from an IPAM result, as Go's `ipam.ConfigureIface` does: IPv6 duplicate address detection on
/// or off (`dad`), gratuitous ARP, the addresses, the link up, then the routes (a route without a
/// gateway goes through its family's gateway, if any; one already there is kept).
pub fn configure(cont: &Netlink, ns: &NetNs, ifname: &str, index: u32, result: &CniResult, dad: bool) -> Result<()> {
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
    for (outcome, on) in cont.batch(ops)?.into_iter().zip(on_failure) {
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

/// CHECK of the pod's interface against prevResult (code 103 on a difference): `ifname` exists
/// in `ns`, has the MAC prevResult records, is up (when `up`), holds prevResult's addresses for
/// it, and the namespace has prevResult's routes. The link, and its index in prevResult's
/// interfaces when listed there.
pub fn check_pod(ns: &NetNs, ifname: &str, prev: &CniResult, up: bool) -> Result<(Link, Option<usize>)> {
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

/// prevResult's addresses of the interface at `sandbox_idx`, and those naming no interface.
pub fn own_ips(prev: &CniResult, sandbox_idx: Option<usize>) -> impl Iterator<Item = &IpConfig> {
    prev.ips.iter().filter(move |ip| ip.interface.is_none() || ip.interface == sandbox_idx)
}

/// DEL's link removal for a veth plugin; the errors, in order. `started` is called as the deletion
/// request goes out (not at all when there is nothing to delete). Deleting the pod's end removes
/// the pair. The plugin's own namespace is refused: deleting CNI_IFNAME there would take a node
/// interface.
pub fn del_pod_link(req: &Request, started: impl FnOnce()) -> Vec<Error> {
    let mut errs = Vec::new();
    match crate::container_netns_for_del(req) {
        Ok(Some(ns)) => errs.extend(delete_in(&ns, &req.ifname, started).err()),
        Ok(None) => errs.extend(del_stranded_host_veth(req, started).err()),
        Err(e) => errs.push(e),
    }
    errs
}

/// Runs `side` on a thread of its own while `main` runs on this one; both results. For DEL: a
/// link deletion waits out RCU grace periods in the kernel after it released the rtnl lock
/// (~16-28 ms for a veth here, more for an ifb), so what needs neither that link nor its wait
/// (releasing addresses from IPAM's own state, removing rules, deleting another link) runs
/// alongside instead of after it. A panic on the thread is an error naming `what` (code 110).
pub fn alongside<A: Send, B>(what: &str, side: impl FnOnce() -> A + Send, main: impl FnOnce() -> B) -> (Result<A>, B) {
    std::thread::scope(|s| {
        let thread = s.spawn(side);
        let b = main();
        let a = thread.join().map_err(|_| Error::new(code::INTERNAL, format!("{what} panicked")));
        (a, b)
    })
}

/// Whether IPAM plugin `ipam` releases through the pod's interface, so its DEL must run before
/// the interface goes: dhcp sends DHCPRELEASE from it. Every other IPAM releases from its own state.
/// dhcp also leases through that interface, so its ADD needs the interface in the pod (host-device
/// runs every other IPAM before it moves the device in).
/// A function rather than `== "dhcp"` at each DEL (bridge, ptp, the sublink plugins): the reason
/// for the order lives here, and an IPAM that also releases through the link is added once.
pub fn releases_through_link(ipam: &str) -> bool {
    ipam == "dhcp"
}

/// Deletes `CNI_IFNAME` in the pod's namespace, for a plugin whose link lives only there (macvlan,
/// ipvlan: the kernel removes it with the namespace, so a namespace that is gone, or CNI_NETNS
/// unset, leaves nothing to do). A missing link is success. The plugin's own namespace is refused.
pub fn del_in_pod(req: &Request) -> Result<()> {
    match crate::container_netns_for_del(req)? {
        Some(ns) => delete_in(&ns, &req.ifname, || {}),
        None => Ok(()),
    }
}

fn delete_in(ns: &NetNs, ifname: &str, started: impl FnOnce()) -> Result<()> {
    let nl = Netlink::open_in(ns)?;
    started();
    nl.delete_link_by_name(ifname).map(|_| ())
}

/// DEL when the pod's namespace is gone from its path (or CNI_NETNS is unset). The kernel removed
/// the pair with the namespace, unless a process still holds the namespace: then the host end is
/// still there. It is deleted only when it is certainly ours: prevResult lists it under one of the
/// names ADD picks for this attachment, and it is a veth with the MAC prevResult records (a host
/// link that merely has our name may be another pod's, after a hash collision).
fn del_stranded_host_veth(req: &Request, started: impl FnOnce()) -> Result<()> {
    let Some(prev) = &req.conf.prev_result else { return Ok(()) };
    let names: Vec<String> =
        (0..HOST_NAME_ATTEMPTS).map(|attempt| host_veth_name(&req.container_id, &req.ifname, attempt)).collect();
    let Some((name, mac)) = prev
        .interfaces
        .iter()
        .filter(|i| i.sandbox.as_deref().is_none_or(str::is_empty) && names.contains(&i.name))
        .find_map(|i| Some((i.name.clone(), i.mac.clone()?)))
    else {
        return Ok(());
    };
    let host = Netlink::open()?;
    let Some(link) = host.link(&name)? else { return Ok(()) };
    let same_mac = link.mac_string().is_some_and(|have| have.eq_ignore_ascii_case(&mac));
    if link.kind.as_deref() != Some("veth") || !same_mac {
        return Ok(());
    }
    started();
    match host.delete_link_by_name(&name) {
        Err(e) if !crate::is_not_found(&e) => Err(e),
        _ => Ok(()),
    }
}

/// What ADD outputs when chained: the spec has a plugin given a `prevResult` output it, modified. The
/// earlier plugins' interfaces, addresses and routes stay first, ours are appended (our addresses'
/// interface indices shifted past theirs, theirs unchanged), and their DNS stays unless we set one.
pub fn chained(prev: Option<&CniResult>, own: CniResult) -> CniResult {
    let Some(prev) = prev else { return own };
    let offset = prev.interfaces.len();
    let mut out = CniResult {
        cni_version: own.cni_version,
        interfaces: prev.interfaces.clone(),
        ips: prev.ips.clone(),
        routes: prev.routes.clone(),
        dns: if own.dns.is_empty() { prev.dns.clone() } else { own.dns },
    };
    out.interfaces.extend(own.interfaces);
    out.ips.extend(own.ips.into_iter().map(|ip| IpConfig { interface: ip.interface.map(|i| i + offset), ..ip }));
    for route in own.routes {
        if !out.routes.contains(&route) {
            out.routes.push(route);
        }
    }
    out
}

/// The result's entry for the pod's interface `name` in `ns`, with the MAC `link` has now.
pub fn pod_interface(name: &str, link: &Link, ns: &NetNs) -> Interface {
    Interface {
        name: name.to_string(),
        mac: link.mac_string(),
        sandbox: Some(ns.path().display().to_string()),
        ..Default::default()
    }
}

/// The masquerade rules of the attachment `req` names, in `network`, for `addresses`.
pub fn masquerade<'i>(req: &Request, network: &str, addresses: impl Iterator<Item = &'i IpConfig>) -> Masquerade {
    Masquerade {
        network: network.to_string(),
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        addresses: addresses.map(|ip| ip.address).collect(),
    }
}

/// An interface plugin's ADD: runs `steps` with an [`Undo`] that runs when they fail; on success
/// their result, chained after prevResult ([`chained`]).
pub fn add_or_undo<'a>(req: &Request, steps: impl FnOnce(&mut Undo<'a>) -> Result<CniResult>) -> Result<CniResult> {
    let mut undo = Undo::default();
    match steps(&mut undo) {
        Ok(r) => Ok(chained(req.conf.prev_result.as_ref(), r)),
        Err(e) => {
            undo.run();
            Err(e)
        }
    }
}

/// The IPAM plugin the configuration names, refused (code 7) when it is a path rather than a plugin
/// name in CNI_PATH.
pub fn ipam_type(conf: &libcni::conf::NetConf) -> Result<Option<&str>> {
    match conf.ipam_type() {
        Some(t) if !invoke::valid_plugin_type(t) => {
            Err(Error::config(format!("invalid ipam type {t:?}: name a plugin in CNI_PATH, not a path")))
        }
        other => Ok(other),
    }
}

/// That the IPAM plugin `ipam` (when the configuration names one) can run: ADD asks before its
/// first change, so a configuration naming a plugin that is not in CNI_PATH changes nothing (code 7,
/// [`invoke::delegate_ready`]).
pub fn ipam_ready(req: &Request, ipam: Option<&str>) -> Result<()> {
    ipam.map_or(Ok(()), |ipam| invoke::delegate_ready(ipam, req))
}

/// Refuses, before anything is made, an ADD whose result can hold no address (no IPAM plugin, no
/// prevResult addresses to chain after) at cniVersion 0.1.0 or 0.2.0, which cannot print one
/// without: the same error skel gives when it converts the result, found without a change to undo.
pub fn refuse_addressless_legacy(req: &Request, ipam: Option<&str>) -> Result<()> {
    let prev_ips = req.conf.prev_result.as_ref().is_some_and(|p| !p.ips.is_empty());
    if ipam.is_none() && !prev_ips && !libcni::version::at_least(&req.conf.cni_version, "0.3.0") {
        return Err(libcni::types::no_addresses_error());
    }
    Ok(())
}

/// Candidate temporary names for a link created outside the pod's namespace and renamed to its
/// `ifname` once inside (`attempt` 0 first), derived from the attachment like [`host_veth_name`].
pub fn temp_link_name(container_id: &str, ifname: &str, attempt: u32) -> String {
    let digest = Sha256::digest(format!("{container_id}:{ifname}:temp:{attempt}").as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("tmp{hex}")
}

/// Creates the pod's `ifname` directly under that name with a request sent from `creator` (where
/// the link's parent lives: the host, or the pod itself); `create(name)` sends the request for a
/// link called `name` placed in `ns`. Returns the link as the pod (`cont`) sees it; on failure
/// nothing is left.
///
/// A rename costs the kernel an RCU grace period, so the name is given at creation. EEXIST means
/// the pod already has `ifname` (refused as [`ensure_absent`] does: the caller need not ask first),
/// or the kernel is one that looks the name up in `creator`'s namespace, which has a link so named
/// (before Linux 6.14; see [`create_in_pod_renamed`], which ADD then falls back to).
pub fn create_in_pod(
    creator: &Netlink,
    cont: &Netlink,
    ns: &NetNs,
    container_id: &str,
    ifname: &str,
    create: impl Fn(&str) -> Result<()>,
) -> Result<Link> {
    match create(ifname) {
        Ok(()) => created(cont, ns, ifname),
        Err(e) if crate::is_exists(&e) => {
            ensure_absent(cont, ns, ifname)?;
            create_in_pod_renamed(creator, cont, ns, container_id, ifname, create)
        }
        Err(e) => Err(e),
    }
}

/// The link `name` the pod (`cont`, in `ns`) has just been given.
fn created(cont: &Netlink, ns: &NetNs, name: &str) -> Result<Link> {
    cont.link(name)?.ok_or_else(|| {
        Error::network(format!("link {name} is missing in {} right after creation", ns.path().display()))
    })
}

/// Creates the pod's `ifname` with a request sent from another namespace (`creator`, where the
/// link's parent lives: a VLAN's master on the host), then renames it inside the pod (`cont`, `ns`).
/// `create(name)` sends the request for a link called `name` placed in `ns`.
///
/// Older kernels (Debian 12's 6.1 among them; 6.18 no longer does) look a new link's name up in the
/// namespace the request comes from before creating it, so creating `eth0` for the pod from a host
/// that has its own `eth0` fails with EEXIST there: the link is made under a temporary name free on
/// the host ([`temp_link_name`]), as the reference plugins do (`plugins/vlan/tests/vm_vlan.rs`).
/// Returns the pod's link; on failure nothing is left.
pub fn create_in_pod_renamed(
    creator: &Netlink,
    cont: &Netlink,
    ns: &NetNs,
    container_id: &str,
    ifname: &str,
    create: impl Fn(&str) -> Result<()>,
) -> Result<Link> {
    // Whether either namespace has a link named `name`.
    let taken = |name: &str| -> Result<bool> { Ok(creator.link(name)?.is_some() || cont.link(name)?.is_some()) };
    let mut made = None;
    for attempt in 0..HOST_NAME_ATTEMPTS {
        let temp = temp_link_name(container_id, ifname, attempt);
        if taken(&temp)? {
            continue;
        }
        match create(&temp) {
            Ok(()) => {
                made = Some(temp);
                break;
            }
            // Another ADD took the name between the lookup and the create; EEXIST for another
            // reason (a VLAN id already used on the master) is the error.
            Err(e) if crate::is_exists(&e) && taken(&temp)? => continue,
            Err(e) => return Err(e),
        }
    }
    let temp = made.ok_or_else(|| {
        Error::network(format!(
            "no free temporary link name for {container_id}:{ifname} after {HOST_NAME_ATTEMPTS} tries"
        ))
    })?;
    let link = created(cont, ns, &temp)?;
    if let Err(e) = cont.set_name(link.index, ifname) {
        let _ = cont.delete_link(link.index);
        return Err(e.context(format_args!("rename {temp} to {ifname} in {}", ns.path().display())));
    }
    Ok(Link { name: ifname.to_string(), ..link })
}

/// ADD's second half for a plugin whose only interface is the pod's (dummy, vlan, tap): with an
/// IPAM plugin, its result on interface 0, configured on the link (addresses, up, routes); without,
/// the link up (layer 2 only). The result lists the pod's interface with its MAC; `dns` (the
/// configuration's, when it sets anything: [`libcni::conf::NetConf::dns`]) replaces IPAM's.
pub fn single_interface_result<'a>(
    req: &'a Request,
    ipam: Option<&'a str>,
    cont: &Netlink,
    ns: &NetNs,
    link: &Link,
    dns: Option<&libcni::types::Dns>,
    undo: &mut Undo<'a>,
) -> Result<CniResult> {
    let mut result = CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() };
    match ipam {
        Some(ipam) => {
            let r = ipam_add(ipam, req, undo)?;
            (result.ips, result.routes, result.dns) = (r.ips, r.routes, r.dns);
            set_gateways(&mut result, 0, false, false);
            configure(cont, ns, &req.ifname, link.index, &result, false)?;
        }
        None => cont.set_up(link.index)?,
    }
    if let Some(dns) = dns {
        result.dns = dns.clone();
    }
    let now = cont.link_by_index(link.index)?.unwrap_or_else(|| link.clone());
    result.interfaces = vec![pod_interface(&req.ifname, &now, ns)];
    Ok(result)
}

/// DEL for a plugin whose only interface is the pod's: IPAM's DEL (when `ipam` names a plugin),
/// then the pod's link (nothing to do when the namespace is gone: the link went with it), whatever
/// the plugin's own keys say. Best effort: both are tried, every error reported; an `ipam.type` that
/// is a path is reported after the link is gone.
pub fn del_single_interface(req: &Request) -> Result<()> {
    let mut errs = libcni::Errors::new();
    match ipam_type(&req.conf) {
        Ok(Some(ipam)) => {
            errs.record(invoke::delegate_del(ipam, req));
        }
        Ok(None) => {}
        Err(e) => errs.push(e),
    }
    for e in del_pod_link(req, || {}) {
        errs.push(e);
    }
    errs.finish()
}

/// What an interface plugin's ADD opens first: the pod's namespace (refused when it is the
/// plugin's own) and a netlink socket inside it, where `CNI_IFNAME` must not exist yet
/// ([`ensure_absent`]).
pub fn open_pod_for_add(req: &Request) -> Result<(NetNs, Netlink)> {
    let ns = crate::container_netns(req)?;
    let cont = Netlink::open_in(&ns)?;
    ensure_absent(&cont, &ns, &req.ifname)?;
    Ok((ns, cont))
}

/// [`open_pod_for_add`], and a netlink socket in this, the host's, namespace: for a plugin that
/// makes or takes its link on the host (a veth's host end, a host device).
pub fn open_pod_and_host_for_add(req: &Request) -> Result<(NetNs, Netlink, Netlink)> {
    let (ns, cont) = open_pod_for_add(req)?;
    Ok((ns, cont, Netlink::open()?))
}

/// What an interface plugin's CHECK starts with: prevResult ([`Request::prev_result`]), the pod's
/// namespace, and IPAM's CHECK when `ipam` names a plugin.
pub fn check_start<'r>(req: &'r Request, ipam: Option<&str>) -> Result<(&'r CniResult, NetNs)> {
    let prev = req.prev_result(&req.conf.plugin_type)?;
    let ns = crate::container_netns(req)?;
    if let Some(ipam) = ipam {
        invoke::delegate_check(ipam, req)?;
    }
    Ok((prev, ns))
}

/// STATUS of a plugin that delegates to IPAM and may masquerade (bridge, ptp): IPAM's STATUS when
/// `ipam` names a plugin, then the masquerade backend's.
pub fn status_masquerading(req: &Request, ipam: Option<&str>, ip_masq: Option<IpMasq>) -> Result<()> {
    if let Some(ipam) = ipam {
        invoke::delegate_status(ipam, req)?;
    }
    if let Some(m) = ip_masq {
        firewall::open(m.backend).status()?;
    }
    Ok(())
}

/// GC of such a plugin: IPAM's GC when `ipam` names a plugin, then the masquerade rules of every
/// attachment of `network` not in the list of valid attachments. Without that list garbage cannot
/// be told from live pods (host-local and portmap decide so too): then only IPAM's GC runs. The
/// errors, and the list for the plugin's own rules.
pub fn gc_masquerading<'r>(
    req: &'r Request,
    network: &str,
    ipam: Option<&str>,
    ip_masq: Option<IpMasq>,
) -> (Errors, Option<&'r [Attachment]>) {
    let mut errs = Errors::new();
    if let Some(ipam) = ipam {
        errs.record(invoke::delegate_gc(ipam, req));
    }
    let keep = req.conf.valid_attachments.as_deref();
    if let (Some(keep), Some(m)) = (keep, ip_masq) {
        errs.record(firewall::open(m.backend).gc_masquerade(network, keep));
    }
    (errs, keep)
}

/// Which masquerade rules DEL removes: from a configuration that validates, those of its `ipMasq`
/// (`None`: masquerade is off); from one that does not (edited since ADD, a key the runtime sent
/// broken), every backend's rules of the attachment, so a bad key never strands a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasqueradeDel {
    Configured(Option<IpMasq>),
    Everywhere,
}

/// DEL of attachment `id`/`ifname`'s masquerade rules in `network` (bridge, ptp), on the backend
/// `open` gives ([`firewall::open`]; a fake in unit tests). A backend detected as nftables also
/// removes what the reference plugin left in iptables, on a node that switched from it. The errors,
/// in order.
pub fn del_masquerade(
    open: &dyn Fn(firewall::BackendKind) -> Box<dyn firewall::Firewall>,
    masq: MasqueradeDel,
    network: &str,
    id: &str,
    ifname: &str,
) -> Vec<Error> {
    let mut errs = Vec::new();
    match masq {
        MasqueradeDel::Configured(None) => {}
        MasqueradeDel::Configured(Some(m)) => {
            errs.extend(open(m.backend).del_masquerade(network, id, ifname).err());
            if m.detected && m.backend == firewall::BackendKind::Nftables {
                errs.extend(firewall::del_reference_leftovers(network, id, ifname, false).err());
            }
        }
        MasqueradeDel::Everywhere => {
            errs.extend(firewall::del_everywhere(firewall::Rules::Masquerade, network, id, ifname).err());
        }
    }
    errs
}

/// CHECK for a plugin whose only interface is the pod's: IPAM's CHECK (when `ipam` is set), then
/// the pod's link against prevResult ([`check_pod`], up) and its `kind`. The namespace and the link,
/// for the plugin's own checks.
pub fn check_single_interface(req: &Request, ipam: Option<&str>, kind: &str) -> Result<(NetNs, Link)> {
    let (prev, ns) = check_start(req, ipam)?;
    let (link, _) = check_pod(&ns, &req.ifname, prev, true)?;
    check_kind(&link, kind)?;
    Ok((ns, link))
}

/// CHECK that the pod's link is of `kind` (`"dummy"`, `"vlan"`, ...), code 103 otherwise.
pub fn check_kind(link: &Link, kind: &str) -> Result<()> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn undo_runs_newest_first() {
        let log = RefCell::new(Vec::new());
        let mut undo = Undo::default();
        for step in ["veth", "ipam", "masquerade"] {
            let log = &log;
            undo.push(move || log.borrow_mut().push(step));
        }
        undo.run();
        assert_eq!(*log.borrow(), ["masquerade", "ipam", "veth"]);
    }

    #[test]
    fn alongside_overlaps_and_reports_a_panic() {
        // The side waits for the main closure to have started: run one after the other, it would
        // time out (the overlap is the point of DEL's link deletion alongside the release).
        let (tx, rx) = std::sync::mpsc::channel();
        let (side, main) = alongside(
            "the side",
            move || rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok(),
            move || tx.send(()).is_ok(),
        );
        assert!(side.unwrap() && main, "the side never saw the main closure run alongside it");
        let (side, main): (Result<()>, u8) = alongside("releasing the addresses", || panic!("boom"), || 7);
        let e = side.unwrap_err();
        assert_eq!((e.code, main), (code::INTERNAL, 7));
        assert!(e.msg.contains("releasing the addresses panicked"), "{}", e.msg);
    }

    #[test]
    fn gateways_and_default_routes() {
        let ip = |a: &str| IpConfig { address: a.parse().unwrap(), gateway: None, interface: None };
        let mut r = CniResult { ips: vec![ip("10.1.2.7/24"), ip("fd00::7/64")], ..Default::default() };
        r.ips[1].gateway = Some("fd00::fe".parse().unwrap());
        set_gateways(&mut r, 2, true, true);
        assert_eq!(r.ips[0].gateway, Some("10.1.2.1".parse().unwrap()));
        assert_eq!(r.ips[1].gateway, Some("fd00::fe".parse().unwrap()));
        assert!(r.ips.iter().all(|ip| ip.interface == Some(2)));
        let defaults: Vec<_> = r.routes.iter().map(|r| (r.dst.to_string(), r.gw.unwrap().to_string())).collect();
        assert_eq!(defaults, [("0.0.0.0/0".into(), "10.1.2.1".into()), ("::/0".into(), "fd00::fe".into())]);
        // A default route IPAM gave is kept, and no gateway is invented without `gateway`.
        let mut r = CniResult { ips: vec![ip("10.1.2.7/24")], ..Default::default() };
        set_gateways(&mut r, 0, false, true);
        assert!(r.ips[0].gateway.is_none() && r.routes.is_empty());
    }
}

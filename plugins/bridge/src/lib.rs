//! bridge: a veth pair from the container to a Linux bridge on the host, addresses from IPAM,
//! routes, optional gateway and masquerade.

pub mod config;

use config::BridgeConf;
use ipnetwork::IpNetwork;
use libcni::invoke;
use libcni::types::{CniResult, Interface, IpConfig, Route};
use libcni::{code, Error, Errors, Plugin, Request, Result};
use netkit::firewall::{self, Masquerade};
use netkit::sysctl::{self, Family};
use netkit::{NetNs, Netlink, RouteSpec};
use sha2::{Digest, Sha256};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub struct Bridge;

/// Candidate names for the host end, derived from the attachment (`attempt` 0 first). A later
/// attempt is used only when a hash collision gives another pod's veth the same name.
pub fn host_veth_name(container_id: &str, ifname: &str, attempt: u32) -> String {
    let seed =
        if attempt == 0 { format!("{container_id}:{ifname}") } else { format!("{container_id}:{ifname}:{attempt}") };
    let digest = Sha256::digest(seed.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("veth{hex}")
}

/// How many names ADD tries before giving up on collisions.
const HOST_NAME_ATTEMPTS: u32 = 8;

fn mac_string(mac: Option<[u8; 6]>) -> Option<String> {
    mac.map(|m| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"))
}

fn is_v4(n: &IpNetwork) -> bool {
    matches!(n, IpNetwork::V4(_))
}

/// The first address after the network address: the default gateway of a subnet.
fn subnet_gateway(n: &IpNetwork) -> IpAddr {
    match n {
        IpNetwork::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4.network()).wrapping_add(1))),
        IpNetwork::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6.network()).wrapping_add(1))),
    }
}

fn default_dst(v4: bool) -> IpNetwork {
    if v4 {
        IpNetwork::V4(ipnetwork::Ipv4Network::from(Ipv4Addr::UNSPECIFIED))
    } else {
        IpNetwork::V6(ipnetwork::Ipv6Network::from(Ipv6Addr::UNSPECIFIED))
    }
    .with_prefix(0)
}

trait WithPrefix {
    fn with_prefix(self, p: u8) -> IpNetwork;
}
impl WithPrefix for IpNetwork {
    fn with_prefix(self, p: u8) -> IpNetwork {
        IpNetwork::new(self.ip(), p).unwrap_or(self)
    }
}

fn firewall_of(conf: &BridgeConf) -> Result<Box<dyn firewall::Firewall>> {
    Ok(firewall::open(firewall::choose(conf.ip_masq_backend.as_deref())?))
}

/// What a failed ADD must undo, in reverse.
#[derive(Default)]
struct Undo {
    host_veth: Option<String>,
    ipam: Option<String>,
    masquerade: bool,
    macspoof: bool,
}

impl Undo {
    fn run(&self, req: &Request, conf: &BridgeConf, host: &Netlink) {
        if self.macspoof {
            let _ = firewall::del_macspoof(&conf.network, &req.container_id, &req.ifname);
        }
        if self.masquerade {
            if let Ok(fw) = firewall_of(conf) {
                let _ = fw.del_masquerade(&conf.network, &req.container_id, &req.ifname);
            }
        }
        if let Some(ipam) = &self.ipam {
            let _ = invoke::delegate_del(ipam, req);
        }
        if let Some(name) = &self.host_veth {
            // Deleting one end removes the pair, the container end included.
            let _ = host.delete_link_by_name(name);
        }
    }
}

impl Plugin for Bridge {
    fn known_args(&self) -> &'static [&'static str] {
        // IP is read by host-local, which gets our CNI_ARGS.
        &["MAC", "IP"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = config::parse(req)?;
        let ns = netkit::container_netns(req)?;
        let host = Netlink::open()?;
        let mut undo = Undo::default();
        match add(req, &conf, &ns, &host, &mut undo) {
            Ok(r) => Ok(chained(req.conf.prev_result.as_ref(), r)),
            Err(e) => {
                undo.run(req, &conf, &host);
                Err(e)
            }
        }
    }

    fn del(&self, req: &Request) -> Result<()> {
        let plan = DelPlan::new(req);
        // Deleting a veth waits out RCU grace periods in the kernel (~20 ms), and so does removing
        // firewall rules that deletes something (iptables, the MAC spoof check's chain; nftables
        // masquerade only gives its elements an expiry): the rules and the addresses go on a thread
        // of their own, alongside the veth deletion. The rules' nf_tables commit waits until the veth deletion has been
        // under way for VETH_HEAD_START: committed just before it, its grace period made the
        // kernel's wait for the veth a grace period longer (DEL median 45 -> 39 ms, docs/bench).
        let (started, veth_started) = std::sync::mpsc::channel::<std::time::Instant>();
        std::thread::scope(|s| {
            let others = s.spawn(move || {
                let mut errs = Errors::new();
                if let Some(e) = &plan.refused {
                    errs.push(e.clone());
                }
                if let Some(ipam) = &plan.ipam {
                    errs.record(invoke::delegate_del(ipam, req));
                }
                // No message: there is no veth to delete (or the main thread failed first).
                if let Ok(at) = veth_started.recv() {
                    std::thread::sleep((at + VETH_HEAD_START).saturating_duration_since(std::time::Instant::now()));
                }
                (errs, del_firewall(req, &plan))
            });
            let link_errs = del_links(req, started);
            let mut errs = match others.join() {
                Ok((mut errs, fw_errs)) => {
                    fw_errs.into_iter().for_each(|e| errs.push(e));
                    errs
                }
                Err(_) => {
                    let mut errs = Errors::new();
                    errs.push(Error::new(code::INTERNAL, "releasing the addresses or removing the rules panicked"));
                    errs
                }
            };
            link_errs.into_iter().for_each(|e| errs.push(e));
            errs.finish()
        })
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        let prev = req
            .conf
            .prev_result
            .as_ref()
            .ok_or_else(|| Error::config("CHECK needs prevResult: the runtime must send the result of ADD"))?;
        let ns = netkit::container_netns(req)?;
        if let Some(ipam) = &conf.ipam_type {
            invoke::delegate_check(ipam, req)?;
        }
        check(req, &conf, prev, &ns)
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        if let Some(ipam) = &conf.ipam_type {
            invoke::delegate_status(ipam, req)?;
        }
        if conf.ip_masq {
            firewall_of(&conf)?.status()?;
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        let mut errs = Errors::new();
        if let Some(ipam) = &conf.ipam_type {
            errs.record(invoke::delegate_gc(ipam, req));
        }
        // Without the list of valid attachments, garbage cannot be told from live pods (as host-local
        // and portmap decide too).
        let Some(keep) = req.conf.valid_attachments.as_deref() else { return errs.finish() };
        if conf.ip_masq {
            errs.record(firewall_of(&conf).and_then(|fw| fw.gc_masquerade(&conf.network, keep)));
        }
        if conf.macspoofchk {
            errs.record(firewall::gc_macspoof(&conf.network, keep));
        }
        errs.finish()
    }
}

/// How long the veth deletion runs before bridge DEL commits its firewall removal (see `del`).
const VETH_HEAD_START: std::time::Duration = std::time::Duration::from_micros(2500);

/// DEL's link removal; the errors, in order. `started` is told when the deletion request goes out
/// (and dropped unsent when there is nothing to delete).
fn del_links(req: &Request, started: std::sync::mpsc::Sender<std::time::Instant>) -> Vec<Error> {
    let mut errs = Vec::new();
    // Deleting the pod's end removes the pair. The plugin's own namespace is refused: deleting
    // CNI_IFNAME there would take a node interface.
    match netkit::container_netns_for_del(req) {
        Ok(Some(ns)) => {
            let deleted = Netlink::open_in(&ns).and_then(|nl| {
                let _ = started.send(std::time::Instant::now());
                nl.delete_link_by_name(&req.ifname)
            });
            if let Err(e) = deleted {
                errs.push(e);
            }
        }
        Ok(None) => errs.extend(del_stranded_host_veth(req, started).err()),
        Err(e) => errs.push(e),
    }
    errs
}

/// DEL when the pod's namespace is gone from its path (or CNI_NETNS is unset). The kernel removed
/// the pair with the namespace, unless a process still holds the namespace: then the host end is
/// still there. It is deleted only when it is certainly ours: prevResult lists it under one of the
/// names ADD picks for this attachment, and it is a veth with the MAC prevResult records (a host
/// link that merely has our name may be another pod's, after a hash collision).
fn del_stranded_host_veth(req: &Request, started: std::sync::mpsc::Sender<std::time::Instant>) -> Result<()> {
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
    let same_mac = mac_string(link.mac).is_some_and(|have| have.eq_ignore_ascii_case(&mac));
    if link.kind.as_deref() != Some("veth") || !same_mac {
        return Ok(());
    }
    let _ = started.send(std::time::Instant::now());
    match host.delete_link_by_name(&name) {
        Err(e) if !netkit::is_not_found(&e) => Err(e),
        _ => Ok(()),
    }
}

/// What bridge DEL removes. From a valid configuration, what it enabled. From one that does not
/// validate (edited since ADD, or a key the runtime sent broken), everything an attachment of this
/// network can hold, found by container id and ifname: the veth, the IPAM reservation, masquerade
/// rules on every backend the node runs, the MAC spoof check. A bad key never strands a pod.
struct DelPlan {
    network: String,
    ipam: Option<String>,
    masquerade: MasqueradeDel,
    macspoof: bool,
    /// An error DEL reports after removing everything else: an IPAM type it refuses to run.
    refused: Option<Error>,
}

enum MasqueradeDel {
    None,
    /// The configured (or detected) backend; `leftovers` also removes the reference's iptables
    /// rules, on a node that switched from the reference plugins.
    Backend {
        kind: firewall::BackendKind,
        leftovers: bool,
    },
    Everywhere,
}

impl DelPlan {
    fn new(req: &Request) -> DelPlan {
        let invalid = match config::parse(req) {
            Ok(conf) => return DelPlan::from_conf(&conf),
            Err(e) => e,
        };
        eprintln!("bridge: DEL removes everything the attachment can hold, as its configuration is invalid: {invalid}");
        let mut refused = None;
        let ipam = req.conf.ipam_type().and_then(|t| {
            if config::valid_plugin_type(t) {
                Some(t.to_string())
            } else {
                refused = Some(invalid.clone());
                None
            }
        });
        DelPlan {
            network: req.conf.name.clone(),
            ipam,
            masquerade: MasqueradeDel::Everywhere,
            macspoof: firewall::nftables_usable(),
            refused,
        }
    }

    fn from_conf(conf: &BridgeConf) -> DelPlan {
        let masquerade = match firewall::choose(conf.ip_masq_backend.as_deref()) {
            _ if !conf.ip_masq => MasqueradeDel::None,
            Ok(kind) => MasqueradeDel::Backend {
                kind,
                leftovers: conf.ip_masq_backend.is_none() && kind == firewall::BackendKind::Nftables,
            },
            // The name was validated while parsing; should it not parse here, look everywhere.
            Err(_) => MasqueradeDel::Everywhere,
        };
        DelPlan {
            network: conf.network.clone(),
            ipam: conf.ipam_type.clone(),
            masquerade,
            macspoof: conf.macspoofchk,
            refused: None,
        }
    }
}

/// DEL's firewall part: masquerade and MAC spoof check rules; the errors, in order.
fn del_firewall(req: &Request, plan: &DelPlan) -> Vec<Error> {
    let mut errs = Vec::new();
    let (network, id, ifname) = (&plan.network, &req.container_id, &req.ifname);
    match plan.masquerade {
        MasqueradeDel::None => {}
        MasqueradeDel::Backend { kind, leftovers } => {
            errs.extend(firewall::open(kind).del_masquerade(network, id, ifname).err());
            if leftovers {
                errs.extend(firewall::del_reference_leftovers(network, id, ifname, false).err());
            }
        }
        MasqueradeDel::Everywhere => {
            errs.extend(firewall::del_everywhere(firewall::Rules::Masquerade, network, id, ifname).err());
        }
    }
    if plan.macspoof {
        errs.extend(firewall::del_macspoof(network, id, ifname).err());
    }
    errs
}

fn fail(what: impl std::fmt::Display) -> impl FnOnce(Error) -> Error {
    move |e| e.context(what)
}

fn add(req: &Request, conf: &BridgeConf, ns: &NetNs, host: &Netlink, undo: &mut Undo) -> Result<CniResult> {
    let cont = Netlink::open_in(ns)?;
    if cont.link(&req.ifname)?.is_some() {
        return Err(Error::new(
            code::NETWORK,
            format!("interface {} already exists in {}: DEL the attachment first", req.ifname, ns.path().display()),
        ));
    }
    let br = host.ensure_bridge(&conf.bridge, conf.mtu, conf.vlan_filtering(), conf.promisc)?;
    libcni::fault_point("bridge-ensured")?;

    // The pair is made in one request and dies with the pod's namespace, and the pod has no
    // `ifname` (checked above), so a host link holding a candidate name is another pod's.
    let mut created = None;
    for attempt in 0..HOST_NAME_ATTEMPTS {
        let candidate = host_veth_name(&req.container_id, &req.ifname, attempt);
        if host.link(&candidate)?.is_some() {
            continue;
        }
        match host.create_veth(&candidate, &req.ifname, ns, conf.mtu, conf.mac) {
            Ok(link) => {
                created = Some((candidate, link));
                break;
            }
            // Another ADD took the name between the lookup and the create.
            Err(e) if netkit::is_exists(&e) && host.link(&candidate)?.is_some() => continue,
            Err(e) => return Err(e),
        }
    }
    let (host_name, host_link) = created.ok_or_else(|| {
        Error::network(format!(
            "no free host veth name for {}:{} after {HOST_NAME_ATTEMPTS} tries",
            req.container_id, req.ifname
        ))
    })?;
    undo.host_veth = Some(host_name.clone());
    libcni::fault_point("veth-created")?;
    host.set_master(host_link.index, br.index).map_err(fail(format_args!("attach {host_name} to {}", conf.bridge)))?;
    if conf.hairpin || conf.port_isolation {
        host.set_port_flags(host_link.index, Some(conf.hairpin), Some(conf.port_isolation))?;
    }
    if conf.vlan_filtering() {
        configure_vlans(host, conf, host_link.index)?;
    }
    // The host end is a bridge port: it forwards the pod's IPv6 at layer 2 and needs no IPv6 of its
    // own. Off before it comes up, it gets no link-local address and none of the four routes that
    // come with one (the reference only sets accept_ra=0 and keeps them): with N pods the host's
    // IPv6 table held 4N routes, and the kernel walks that whole table on every link event, so
    // every ADD and DEL got slower with each pod. No IPv6 in the kernel: nothing to turn off.
    let _ = sysctl::set_if(&host_name, Family::V6, "disable_ipv6", "1");
    host.set_up(host_link.index)?;
    libcni::fault_point("port-configured")?;

    let cont_link = cont
        .link(&req.ifname)?
        .ok_or_else(|| Error::network(format!("veth peer {} is missing in {}", req.ifname, ns.path().display())))?;

    let mut result = CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() };
    if let Some(ipam) = &conf.ipam_type {
        // Set before the call: an IPAM plugin that died half-way may hold a reservation, and its
        // DEL releases only what this attachment holds.
        undo.ipam = Some(ipam.clone());
        let r = invoke::delegate_add(ipam, req)?;
        libcni::fault_point("ipam-done")?;
        result.ips = r.ips;
        result.routes = r.routes;
        result.dns = r.dns;
        if result.ips.is_empty() {
            return Err(Error::new(code::PLUGIN_EXEC, format!("IPAM plugin {ipam} returned no IP addresses")));
        }
    }
    for ip in &mut result.ips {
        ip.interface = Some(2);
        if conf.is_gateway && ip.gateway.is_none() {
            ip.gateway = Some(subnet_gateway(&ip.address));
        }
    }
    if conf.is_default_gateway {
        for v4 in [true, false] {
            let Some(gw) = result.ips.iter().find(|ip| is_v4(&ip.address) == v4).and_then(|ip| ip.gateway) else {
                continue;
            };
            let has_default = result.routes.iter().any(|r| is_v4(&r.dst) == v4 && r.dst.prefix() == 0);
            if !has_default {
                result.routes.push(Route { dst: default_dst(v4), gw: Some(gw), ..route_defaults() });
            }
        }
    }

    configure_container(req, conf, ns, &cont, cont_link.index, &result)?;
    libcni::fault_point("container-configured")?;

    let mut vlan_gateway = None;
    if conf.is_gateway {
        // With a VLAN, the gateway address lives on that VLAN's gateway interface, not the bridge.
        if conf.vlan != 0 && result.ips.iter().any(|ip| ip.gateway.is_some()) {
            vlan_gateway = Some(ensure_vlan_gateway(host, conf, br.index)?);
        }
        let (gw_index, gw_name) = match &vlan_gateway {
            Some(l) => (l.index, format!("VLAN gateway {}", l.name)),
            None => (br.index, format!("bridge {}", conf.bridge)),
        };
        let mut added = false;
        for ip in &result.ips {
            if let Some(gw) = ip.gateway {
                let gw_net = IpNetwork::new(gw, ip.address.prefix())
                    .map_err(|e| Error::config(format!("gateway {gw}/{}: {e}", ip.address.prefix())))?;
                added |= ensure_bridge_addr(host, conf, gw_index, &gw_name, gw_net)?;
            }
        }
        if added && vlan_gateway.is_none() {
            // A bridge takes the lowest MAC of its ports unless one is set; pin it so pods keep their neighbour entry.
            if let Some(mac) = br.mac {
                let _ = host.set_mac(br.index, mac);
            }
        }
        enable_forwarding(&result.ips)?;
        libcni::fault_point("gateway-set")?;
    }

    if conf.ip_masq && !result.ips.is_empty() {
        let fw = firewall_of(conf)?;
        undo.masquerade = true;
        fw.add_masquerade(&Masquerade {
            network: conf.network.clone(),
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            addresses: result.ips.iter().map(|ip| ip.address).collect(),
        })?;
        libcni::fault_point("masquerade-added")?;
    }

    // The host end is not read again: its MAC is the one read after creation, and the kernel
    // builds a host-side veth's link message in time that grows with the namespaces on the node
    // (~0.7 ms with 1000 pods). The bridge's MAC may have moved with its ports unless pinned.
    let br_now = host.link_by_index(br.index)?.unwrap_or(br);
    let cont_now = cont.link_by_index(cont_link.index)?.unwrap_or(cont_link);
    if conf.macspoofchk {
        let mac = mac_string(cont_now.mac)
            .ok_or_else(|| Error::network(format!("{} has no MAC address to pin for macspoofchk", req.ifname)))?;
        undo.macspoof = true;
        firewall::add_macspoof(&conf.network, &req.container_id, &req.ifname, &host_name, &mac)?;
    }
    result.interfaces = vec![
        Interface { name: conf.bridge.clone(), mac: mac_string(br_now.mac), ..Default::default() },
        Interface { name: host_name, mac: mac_string(host_link.mac), ..Default::default() },
        Interface {
            name: req.ifname.clone(),
            mac: mac_string(cont_now.mac),
            sandbox: Some(ns.path().display().to_string()),
            ..Default::default()
        },
    ];
    if let Some(l) = vlan_gateway {
        // Listed after the pod's interface, as the reference does: ips[].interface stays 2.
        result.interfaces.push(Interface { name: l.name.clone(), mac: l.mac_string(), ..Default::default() });
    }
    if let Some(dns) = &conf.dns {
        result.dns = dns.clone();
    }
    Ok(result)
}

/// What ADD outputs when chained: the spec has a plugin given a `prevResult` output it, modified. The
/// earlier plugins' interfaces, addresses and routes stay first, ours are appended (our addresses'
/// interface indices shifted past theirs, theirs unchanged), and their DNS stays unless we set one.
fn chained(prev: Option<&CniResult>, own: CniResult) -> CniResult {
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

fn route_defaults() -> Route {
    Route { dst: default_dst(true), gw: None, mtu: None, advmss: None, priority: None, table: None, scope: None }
}

/// The pod port's VLANs: VLAN 1 (the bridge's default PVID, which a new port joins untagged)
/// removed unless `preserveDefaultVlan`, as the reference does whenever a VLAN is set; the trunk
/// ranges tagged; then `vlan` as PVID, egress untagged. The PVID goes last: adding a range that
/// holds it would clear its PVID flag.
fn configure_vlans(host: &Netlink, conf: &BridgeConf, port: u32) -> Result<()> {
    if !conf.preserve_default_vlan {
        host.bridge_vlan_del(port, 1, false)?;
    }
    for &(lo, hi) in &conf.vlan_trunk {
        host.bridge_vlan_add_range(port, lo, hi, false)?;
    }
    if conf.vlan != 0 {
        host.bridge_vlan_add(port, conf.vlan, true, true, false)?;
    }
    Ok(())
}

/// The bridge-side end of the VLAN gateway pair of `vid` on `bridge`: derived from both, so every
/// ADD finds the same one.
pub fn vlan_gateway_port_name(bridge: &str, vid: u16) -> String {
    let digest = Sha256::digest(format!("vlan-gateway:{bridge}.{vid}").as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("vgw{hex}")
}

/// The host interface that holds the gateway address of the pods on VLAN `conf.vlan`, as the
/// reference makes it: `<bridge>.<vlan>`, one end of a veth pair whose other end is a port of the
/// bridge with that VLAN as PVID, untagged. (The bridge's own address is on its default PVID, which
/// the pods' ports leave.) Made by the first ADD that needs it and shared by every pod of the VLAN;
/// each ADD re-applies the port settings, so one that died half-way is finished by the next. DEL
/// leaves it, as it leaves the bridge and the bridge's gateway address.
fn ensure_vlan_gateway(host: &Netlink, conf: &BridgeConf, br: u32) -> Result<netkit::Link> {
    let name = config::vlan_gateway_name(&conf.bridge, conf.vlan);
    let port_name = vlan_gateway_port_name(&conf.bridge, conf.vlan);
    let gw = match host.link(&name)? {
        Some(l) => l,
        None => {
            let here = NetNs::current()?;
            match host.create_veth(&port_name, &name, &here, conf.mtu, None) {
                Ok(_) => {}
                // Another ADD of the same VLAN made it first.
                Err(e) if netkit::is_exists(&e) => {}
                Err(e) => return Err(e.context(format_args!("create the VLAN {} gateway {name}", conf.vlan))),
            }
            host.link(&name)?.ok_or_else(|| {
                Error::network(format!(
                    "VLAN gateway {name} is missing after its creation: is a link named {port_name} in the way?"
                ))
            })?
        }
    };
    if gw.kind.as_deref() != Some("veth") {
        return Err(Error::network(format!(
            "{name} exists and is not a veth ({}): the gateway of VLAN {} on bridge {} needs that name; rename or \
             delete it",
            gw.kind.as_deref().unwrap_or("a device without a kind"),
            conf.vlan,
            conf.bridge
        )));
    }
    // A peer in another namespace (IFLA_LINK_NETNSID set) has an index that means nothing here.
    let peer_here = gw.link_index.filter(|_| gw.link_netnsid.is_none());
    let port = peer_here
        .and_then(|i| host.link_by_index(i).transpose())
        .transpose()?
        .ok_or_else(|| Error::network(format!("VLAN gateway {name} has no peer in this namespace: delete {name}")))?;
    if port.master != Some(br) {
        host.set_master(port.index, br).map_err(fail(format_args!("attach {} to {}", port.name, conf.bridge)))?;
    }
    if !conf.preserve_default_vlan {
        host.bridge_vlan_del(port.index, 1, false)?;
    }
    host.bridge_vlan_add(port.index, conf.vlan, true, true, false)?;
    if !port.up {
        let _ = sysctl::set_if(&port.name, Family::V6, "disable_ipv6", "1");
        host.set_up(port.index)?;
    }
    if !gw.up {
        // The host routes to the VLAN's subnet through here: no router advertisements wanted.
        let _ = sysctl::set_if(&name, Family::V6, "accept_ra", "0");
        host.set_up(gw.index)?;
    }
    Ok(gw)
}

fn configure_container(
    req: &Request,
    conf: &BridgeConf,
    ns: &NetNs,
    cont: &Netlink,
    index: u32,
    result: &CniResult,
) -> Result<()> {
    if conf.disable_container_interface {
        return Ok(());
    }
    let has_v6 = result.ips.iter().any(|ip| !is_v4(&ip.address));
    {
        let _inside = ns.enter()?;
        if has_v6 {
            if conf.enable_dad {
                sysctl::set_if(&req.ifname, Family::V6, "enhanced_dad", "1").ok();
                sysctl::set_if(&req.ifname, Family::V6, "accept_dad", "1")?;
            } else {
                // The pod's address is unique by construction: skip the multi-second DAD wait.
                sysctl::set_if(&req.ifname, Family::V6, "accept_dad", "0")?;
            }
        }
    }
    if result.ips.iter().any(|ip| is_v4(&ip.address)) {
        // Gratuitous ARP when the link comes up, as the reference sets it (best effort, as there).
        let _ = cont.set_arp_notify(index);
    }
    for ip in &result.ips {
        cont.add_address(index, ip.address, !is_v4(&ip.address) && !conf.enable_dad)
            .map_err(fail(format_args!("add address {} to {}", ip.address, req.ifname)))?;
    }
    cont.set_up(index)?;
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
        match cont.add_route(&spec) {
            Ok(()) => {}
            Err(e) if netkit::is_exists(&e) => {}
            Err(e) => return Err(e.context(format_args!("add route {} in {}", r.dst, ns.path().display()))),
        }
    }
    Ok(())
}

/// Ensure the gateway interface (the bridge, or a VLAN's gateway; `name` says which in messages)
/// holds `gw`; true when this call added it.
fn ensure_bridge_addr(host: &Netlink, conf: &BridgeConf, br: u32, name: &str, gw: IpNetwork) -> Result<bool> {
    // Every pod but the first finds the gateway in place: try the add first, so the common case
    // costs one request instead of a dump of every address on the node (which grows with pods).
    match host.add_address(br, gw, !is_v4(&gw)) {
        Ok(()) => {}
        Err(e) if netkit::is_exists(&e) => return Ok(false),
        Err(e) => return Err(e.context(format_args!("add gateway {gw} to {name}"))),
    }
    // Newly added: settle any other address of the bridge in the same subnet.
    let conflicts: Vec<IpNetwork> = host
        .addresses(br)?
        .into_iter()
        .filter(|a| is_v4(a) == is_v4(&gw) && !(a.ip() == gw.ip() && a.prefix() == gw.prefix()))
        .filter(|a| a.contains(gw.ip()) || gw.contains(a.ip()))
        .collect();
    let Some(first) = conflicts.first() else { return Ok(true) };
    if !conf.force_address {
        let _ = host.del_address(br, gw);
        return Err(Error::config(format!(
            "{name} already has address {first}, different from the gateway {gw}: set forceAddress to replace it"
        )));
    }
    for existing in &conflicts {
        host.del_address(br, *existing)?;
    }
    // Removing a primary IPv4 address takes its secondaries (ours) with it: put the gateway back.
    match host.add_address(br, gw, !is_v4(&gw)) {
        Ok(()) => Ok(true),
        Err(e) if netkit::is_exists(&e) => Ok(true),
        Err(e) => Err(e.context(format_args!("add gateway {gw} to {name}"))),
    }
}

fn enable_forwarding(ips: &[IpConfig]) -> Result<()> {
    if ips.iter().any(|ip| is_v4(&ip.address)) {
        sysctl::enable_forwarding(Family::V4)?;
    }
    if ips.iter().any(|ip| !is_v4(&ip.address)) {
        sysctl::enable_forwarding(Family::V6)?;
    }
    Ok(())
}

/// CHECK of the VLAN keys: filtering on, the port's PVID and trunk VLANs as configured, and VLAN 1
/// gone unless preserved or configured.
fn check_vlans(host: &Netlink, conf: &BridgeConf, br: &netkit::Link, port: &netkit::Link) -> Result<()> {
    let failed = |msg: String| Error::new(code::CHECK_FAILED, msg);
    if br.vlan_filtering != Some(true) {
        return Err(failed(format!("bridge {} has VLAN filtering off, the vlan keys need it on", conf.bridge)));
    }
    let have = host.bridge_vlans(port.index)?;
    let on = |vid: u16| have.iter().find(|v| v.vid == vid);
    if conf.vlan != 0 {
        match on(conf.vlan) {
            Some(v) if v.pvid && v.untagged => {}
            Some(_) => {
                return Err(failed(format!(
                    "bridge port {} has vlan {} but not as its untagged PVID",
                    port.name, conf.vlan
                )))
            }
            None => return Err(failed(format!("bridge port {} is not on vlan {}", port.name, conf.vlan))),
        }
    }
    for &(lo, hi) in &conf.vlan_trunk {
        if let Some(vid) = (lo..=hi).find(|&vid| vid != conf.vlan && on(vid).is_none_or(|v| v.untagged)) {
            return Err(failed(format!("bridge port {} does not carry trunk vlan {vid} tagged", port.name)));
        }
    }
    let configured = |vid: u16| conf.vlan == vid || conf.vlan_trunk.iter().any(|&(lo, hi)| (lo..=hi).contains(&vid));
    if !conf.preserve_default_vlan && !configured(1) && on(1).is_some() {
        return Err(failed(format!(
            "bridge port {} is on the default vlan 1, which preserveDefaultVlan false removes",
            port.name
        )));
    }
    Ok(())
}

fn check(req: &Request, conf: &BridgeConf, prev: &CniResult, ns: &NetNs) -> Result<()> {
    let failed = |msg: String| Error::new(code::CHECK_FAILED, msg);
    let host = Netlink::open()?;
    let br = host.link(&conf.bridge)?.ok_or_else(|| failed(format!("bridge {} does not exist", conf.bridge)))?;
    if br.kind.as_deref() != Some("bridge") {
        return Err(failed(format!("{} is not a bridge", conf.bridge)));
    }
    let cont = Netlink::open_in(ns)?;
    let link = cont
        .link(&req.ifname)?
        .ok_or_else(|| failed(format!("interface {} is missing in {}", req.ifname, ns.path().display())))?;
    let sandbox_idx = prev.interfaces.iter().position(|i| i.name == req.ifname && i.sandbox.is_some());
    if let Some(want) = sandbox_idx.and_then(|i| prev.interfaces[i].mac.clone()) {
        let have = mac_string(link.mac).unwrap_or_default();
        if !have.eq_ignore_ascii_case(&want) {
            return Err(failed(format!("{} has MAC {have}, prevResult says {want}", req.ifname)));
        }
    }
    if !conf.disable_container_interface && !link.up {
        return Err(failed(format!("{} is down", req.ifname)));
    }
    let addrs = cont.addresses(link.index)?;
    for ip in &prev.ips {
        if ip.interface.is_some() && ip.interface != sandbox_idx {
            continue;
        }
        if !addrs.iter().any(|a| a.ip() == ip.address.ip() && a.prefix() == ip.address.prefix()) {
            return Err(failed(format!("{} does not hold {}", req.ifname, ip.address)));
        }
    }
    for r in &prev.routes {
        let family = if is_v4(&r.dst) { netkit::IpFamily::V4 } else { netkit::IpFamily::V6 };
        let routes = cont.routes(family, None)?;
        if !routes
            .iter()
            .any(|have| have.dst == r.dst || (have.dst.ip() == r.dst.ip() && have.dst.prefix() == r.dst.prefix()))
        {
            return Err(failed(format!("route to {} is missing in {}", r.dst, ns.path().display())));
        }
    }
    // Ours are [bridge, host veth, pod interface], after any earlier plugin's interfaces.
    let host_name = sandbox_idx
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| prev.interfaces.get(i))
        .filter(|i| i.sandbox.is_none() && i.name != conf.bridge)
        .or_else(|| prev.interfaces.iter().find(|i| i.sandbox.is_none() && i.name != conf.bridge))
        .map(|i| i.name.clone())
        .unwrap_or_else(|| host_veth_name(&req.container_id, &req.ifname, 0));
    let host_link = host.link(&host_name)?.ok_or_else(|| failed(format!("host veth {host_name} is missing")))?;
    if host_link.master != Some(br.index) {
        return Err(failed(format!("host veth {host_name} is not a port of {}", conf.bridge)));
    }
    if conf.vlan_filtering() {
        check_vlans(&host, conf, &br, &host_link)?;
    }
    if conf.macspoofchk {
        firewall::check_macspoof(&conf.network, &req.container_id, &req.ifname)?;
    }
    if conf.ip_masq {
        firewall_of(conf)?.check_masquerade(&Masquerade {
            network: conf.network.clone(),
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            addresses: prev
                .ips
                .iter()
                .filter(|ip| ip.interface.is_none() || ip.interface == sandbox_idx)
                .map(|ip| ip.address)
                .collect(),
        })?;
    }
    Ok(())
}

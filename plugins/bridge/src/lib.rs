//! bridge: a veth pair from the container to a Linux bridge on the host, addresses from IPAM,
//! routes, optional gateway and masquerade. The steps every interface plugin shares are in
//! [`netkit::iface`]; what is bridge's own is the bridge, its ports (VLANs, hairpin, isolation),
//! the gateway address on the bridge, masquerade and the MAC spoof check.

pub mod config;
mod vlan;

use config::BridgeConf;
use ipnetwork::IpNetwork;
use libcni::invoke;
use libcni::types::{CniResult, Interface, IpConfig};
use libcni::{code, Error, Errors, Plugin, Request, Result};
use netkit::firewall::{self, BackendKind, Firewall};
use netkit::iface::concurrent::{alongside, Deletion};
use netkit::iface::hostnet::{HostNets, Reach};
use netkit::iface::masquerade::{self, MasqueradeDel};
use netkit::iface::result::{is_v4, own_ips, pod_interface, set_gateways};
use netkit::iface::{self, configure, ipam, veth, Pod, Undo};
use netkit::sysctl;
use netkit::Family;
use netkit::{Link, NetNs, Netlink};

pub use netkit::iface::naming::host_veth_name;

pub struct Bridge;

impl Plugin for Bridge {
    fn known_args(&self) -> &'static [&'static str] {
        // IP and GATEWAY are read by the IPAM plugin (host-local IP, static both), which gets our
        // CNI_ARGS, so a bridge + static chain takes them without IgnoreUnknown. (The reference's
        // bridge knows only MAC and refuses both unless IgnoreUnknown is set.)
        &["MAC", "IP", "GATEWAY"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = config::parse(req)?;
        ipam::ready(req, conf.ipam_type.as_deref())?;
        ipam::refuse_addressless_legacy(req, conf.ipam_type.as_deref())?;
        let pod = Pod::open_for_add(req)?;
        let fw = conf.ip_masq.map(|m| firewall::open(m.backend));
        pod.add_chained(|undo| add(&pod, &conf, fw.as_deref(), undo))
    }

    fn del(&self, req: &Request) -> Result<()> {
        let mut plan = DelPlan::new(req);
        // An IPAM that releases through the pod's interface (dhcp's DHCPRELEASE) runs before the
        // veth goes (with the reference's order the release fails and the server keeps the address
        // until the lease expires). Every other IPAM releases from its own state, alongside.
        let early = plan
            .ipam
            .take_if(|t| ipam::releases_through_link(t))
            .and_then(|ipam| invoke::delegate_del(&ipam, req).err());
        // Deleting a veth waits out RCU grace periods in the kernel (~20 ms), and so does removing
        // firewall rules that deletes something (iptables, the MAC spoof check's chain; nftables
        // masquerade only gives its elements an expiry): the rules and the addresses go alongside
        // the veth deletion. The rules' nf_tables commit waits until the veth deletion has been
        // under way for VETH_HEAD_START: committed just before it, its grace period made the
        // kernel's wait for the veth a grace period longer (DEL median 45 -> 39 ms, docs/bench).
        let others = |deletion: &Deletion| {
            let mut errs = Errors::new();
            if let Some(e) = &plan.refused {
                errs.push(e.clone());
            }
            if let Some(ipam) = &plan.ipam {
                errs.record(invoke::delegate_del(ipam, req));
            }
            deletion.under_way_for(VETH_HEAD_START);
            (errs, del_firewall(req, &plan, &firewall::open))
        };
        let (others, link_errs) = alongside("releasing the addresses or removing the rules", others, |starting| {
            veth::del(req, || starting.now())
        });
        let mut errs = match others {
            Ok((mut errs, fw_errs)) => {
                fw_errs.into_iter().for_each(|e| errs.push(e));
                errs
            }
            Err(e) => {
                let mut errs = Errors::new();
                errs.push(e);
                errs
            }
        };
        link_errs.into_iter().for_each(|e| errs.push(e));
        early.into_iter().for_each(|e| errs.push(e));
        errs.finish()
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        let (prev, ns) = iface::check::start(req, conf.ipam_type.as_deref())?;
        let fw = conf.ip_masq.map(|m| firewall::open(m.backend));
        check(req, &conf, prev, &ns, fw.as_deref())
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        masquerade::status(req, conf.ipam_type.as_deref(), conf.ip_masq)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        let (mut errs, keep) = masquerade::gc(req, &conf.network, conf.ipam_type.as_deref(), conf.ip_masq);
        if let Some(keep) = keep.filter(|_| conf.macspoofchk) {
            errs.record(firewall::gc_macspoof(&conf.network, keep));
        }
        errs.finish()
    }
}

/// How long the veth deletion runs before bridge DEL commits its firewall removal (see `del`).
const VETH_HEAD_START: std::time::Duration = std::time::Duration::from_micros(2500);

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
        DelPlan {
            network: conf.network.clone(),
            ipam: conf.ipam_type.clone(),
            masquerade: MasqueradeDel::Configured(conf.ip_masq),
            macspoof: conf.macspoofchk,
            refused: None,
        }
    }
}

/// DEL's firewall part: masquerade (on the backend `open` gives) and MAC spoof check rules; the
/// errors, in order.
fn del_firewall(req: &Request, plan: &DelPlan, open: &dyn Fn(BackendKind) -> Box<dyn Firewall>) -> Vec<Error> {
    let (network, id, ifname) = (&plan.network, &req.container_id, &req.ifname);
    let mut errs = masquerade::del(open, plan.masquerade, network, id, ifname);
    if plan.macspoof {
        errs.extend(firewall::del_macspoof(network, id, ifname).err());
    }
    errs
}

fn add<'a>(pod: &'a Pod, conf: &'a BridgeConf, fw: Option<&'a dyn Firewall>, undo: &mut Undo<'a>) -> Result<CniResult> {
    let (req, ns, cont, host) = (pod.req, &pod.ns, &pod.nl, pod.host()?);
    let (br, created) =
        host.ensure_bridge_with(&conf.bridge, conf.mtu, conf.vlan_filtering(), conf.promisc, &|br| {
            skip_link_local_dad(&br.name)
        })?;
    if created {
        // Registered first, so it runs last, once the veth is gone.
        let index = br.index;
        undo.push(move || remove_unused_bridge(host, index));
    }
    libcni::fault_point("bridge-ensured")?;

    let (host_name, host_link) = veth::create(pod, conf.mtu, conf.mac)?;
    let created = host_name.clone();
    // Deleting one end removes the pair, the container end included.
    undo.push(move || {
        let _ = host.delete_link_by_name(&created);
    });
    libcni::fault_point("veth-created")?;
    host.set_master(host_link.index, br.index)
        .map_err(|e| e.context(format_args!("attach {host_name} to {}", conf.bridge)))?;
    if conf.hairpin || conf.port_isolation {
        host.set_port_flags(host_link.index, Some(conf.hairpin), Some(conf.port_isolation))?;
    }
    if conf.vlan_filtering() {
        vlan::configure_vlans(host, conf, host_link.index)?;
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
        let r = ipam::add(ipam, req, undo)?;
        (result.ips, result.routes, result.dns) = (r.ips, r.routes, r.dns);
    }
    // Our interfaces are [bridge, host veth, pod interface]: the addresses are the pod's.
    set_gateways(&mut result, 2, conf.is_gateway, conf.is_default_gateway);
    if conf.is_gateway && !result.ips.is_empty() {
        gateways_off_node_networks(conf, &result.ips)?;
    }
    if !conf.disable_container_interface {
        configure::apply(pod, cont_link.index, &result, conf.enable_dad)?;
    }
    libcni::fault_point("container-configured")?;

    let mut vlan_gateway = None;
    if conf.is_gateway {
        vlan_gateway = set_gateway(host, conf, &br, &result.ips)?;
        libcni::fault_point("gateway-set")?;
    }
    if let Some(fw) = fw.filter(|_| !result.ips.is_empty()) {
        add_masquerade(fw, req, conf, &result.ips, undo)?;
    }

    // The host end is not read again: its MAC is the one read after creation, and the kernel
    // builds a host-side veth's link message in time that grows with the namespaces on the node
    // (~0.7 ms with 1000 pods). The bridge's MAC may have moved with its ports unless pinned.
    let br_now = host.link_by_index(br.index)?.unwrap_or(br);
    let cont_now = cont.link_by_index(cont_link.index)?.unwrap_or(cont_link);
    if conf.macspoofchk {
        let mac = cont_now
            .mac_string()
            .ok_or_else(|| Error::network(format!("{} has no MAC address to pin for macspoofchk", req.ifname)))?;
        undo.push(move || {
            let _ = firewall::del_macspoof(&conf.network, &req.container_id, &req.ifname);
        });
        firewall::add_macspoof(&conf.network, &req.container_id, &req.ifname, &host_name, &mac)?;
    }
    result.interfaces = vec![
        Interface { name: conf.bridge.clone(), mac: br_now.mac_string(), ..Default::default() },
        Interface { name: host_name, mac: host_link.mac_string(), ..Default::default() },
        pod_interface(&req.ifname, &cont_now, ns),
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

/// A failed ADD's removal of the bridge `index` it created: only while no link is a port of it
/// (another ADD may have attached a pod since), best effort.
fn remove_unused_bridge(host: &Netlink, index: u32) {
    match host.links() {
        Ok(links) if !links.iter().any(|l| l.master == Some(index)) => {
            let _ = host.delete_link(index);
        }
        _ => {}
    }
}

/// Called while the interface the pods' gateway lives on (the bridge, or a VLAN's gateway) is down,
/// just created: it gets its IPv6 link-local address when it comes up, and by default that address
/// then spends 1-2 s in DAD (a random delay up to `router_solicitation_delay`, then one probe and
/// `retrans_time`). While it is tentative the kernel sends no neighbour solicitation for packets it
/// forwards out of that interface (their source is not the interface's, and a solicitation must then
/// come from a usable link-local address; an optimistic one does not count), so the pod's entry stays
/// INCOMPLETE and traffic routed to a node's first pod from another node waits and is then dropped.
/// The address is the interface's own, on a segment only our pods share, as unique as the gateway
/// address added with nodad: no DAD for it. Best effort: without IPv6 in the kernel there is nothing
/// to skip, and a failure only brings the delay back.
pub(crate) fn skip_link_local_dad(ifname: &str) {
    let _ = sysctl::set_if(ifname, Family::V6, "accept_dad", "0");
}

/// ADD's masquerade step, after the pod's interface is configured; a failed ADD removes the rules
/// (registered before the call: a backend that fails half-way may have added some).
fn add_masquerade<'a>(
    fw: &'a dyn Firewall,
    req: &'a Request,
    conf: &'a BridgeConf,
    ips: &[IpConfig],
    undo: &mut Undo<'a>,
) -> Result<()> {
    undo.push(move || {
        let _ = fw.del_masquerade(&conf.network, &req.container_id, &req.ifname);
    });
    fw.add_masquerade(&masquerade::rules(req, &conf.network, ips.iter()))?;
    libcni::fault_point("masquerade-added")
}

/// Refuses (code 7) a gateway `isGateway` would put on the bridge (or on the VLAN's gateway
/// interface) when it is on a network the node is on ([`HostNets`]): the node already holds it on
/// another interface, or reaches it directly through another interface (its subnet is a slice of
/// the LAN, or the LAN itself: the bridge would answer ARP for the LAN router's address, or take a
/// part of the LAN). A pod address the node holds is refused too. The bridge's own address and
/// subnet route (and its VLAN gateway interface's) are its own: every pod after the first finds
/// them there, and a bridge that carries the node's LAN itself is the operator's layout.
fn gateways_off_node_networks(conf: &BridgeConf, ips: &[IpConfig]) -> Result<()> {
    let nets = HostNets::open()?;
    let vlan_gateway = (conf.vlan != 0).then(|| config::vlan_gateway_name(&conf.bridge, conf.vlan));
    let own = |oif: u32| {
        let name = nets.link_name(oif);
        name == conf.bridge || vlan_gateway.as_deref() == Some(name.as_str())
    };
    let what_to_do = "give the pods a subnet (ipam) that is not on the node's networks";
    for ip in ips {
        let Some(gw) = ip.gateway else { continue };
        let subnet = IpNetwork::new(gw, ip.address.prefix())
            .and_then(|n| IpNetwork::new(n.network(), n.prefix()))
            .map_err(|e| Error::config(format!("gateway {gw}/{}: {e}", ip.address.prefix())))?;
        if let Some(reach) = nets.reach(gw)?.filter(|r| !own(r.oif())) {
            return Err(Error::config(format!(
                "gateway {gw} of subnet {subnet} is {}: with isGateway bridge {} would hold it and answer ARP \
                 and neighbour solicitations for it in place of its owner; {what_to_do}",
                nets.describe(&reach),
                conf.bridge
            )));
        }
        if let Some(reach @ Reach::Local { .. }) = nets.reach(ip.address.ip())? {
            return Err(Error::config(format!(
                "address {} from IPAM is {}; {what_to_do}",
                ip.address.ip(),
                nets.describe(&reach)
            )));
        }
    }
    Ok(())
}

/// The gateway addresses of `ips` on the bridge, and forwarding on.
fn set_gateway(host: &Netlink, conf: &BridgeConf, br: &Link, ips: &[IpConfig]) -> Result<Option<Link>> {
    // With a VLAN, the gateway address lives on that VLAN's gateway interface, not the bridge.
    let vlan_gateway = match conf.vlan != 0 && ips.iter().any(|ip| ip.gateway.is_some()) {
        true => Some(vlan::ensure_vlan_gateway(host, conf, br.index)?),
        false => None,
    };
    let (gw_index, gw_name) = match &vlan_gateway {
        Some(l) => (l.index, format!("VLAN gateway {}", l.name)),
        None => (br.index, format!("bridge {}", conf.bridge)),
    };
    let mut added = false;
    for ip in ips {
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
    configure::enable_forwarding(ips)?;
    Ok(vlan_gateway)
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

fn check(req: &Request, conf: &BridgeConf, prev: &CniResult, ns: &NetNs, fw: Option<&dyn Firewall>) -> Result<()> {
    let failed = |msg: String| Error::new(code::CHECK_FAILED, msg);
    let host = Netlink::open()?;
    let br = host.link(&conf.bridge)?.ok_or_else(|| failed(format!("bridge {} does not exist", conf.bridge)))?;
    if !br.is_bridge() {
        return Err(failed(format!("{} is not a bridge", conf.bridge)));
    }
    let (_, sandbox_idx) = iface::check::pod(ns, &req.ifname, prev, !conf.disable_container_interface)?;
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
        vlan::check_vlans(&host, conf, &br, &host_link)?;
    }
    if conf.macspoofchk {
        firewall::check_macspoof(&conf.network, &req.container_id, &req.ifname)?;
    }
    if let Some(fw) = fw {
        fw.check_masquerade(&masquerade::rules(req, &conf.network, own_ips(prev, sandbox_idx)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

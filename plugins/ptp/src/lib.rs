//! ptp: a veth pair from the pod to the host with no bridge, routed at layer 3. The layout is the
//! reference's: the pod's interface holds its IPAM addresses, but its subnet is reached through
//! the gateway (`<subnet> via <gw> src <ip>`, `<gw>/32 dev eth0 scope link src <ip>`, the kernel's
//! own subnet route removed), so every packet leaves through the host; the host end holds the
//! gateway as a /32 (/128) — the same address on every pod's host end — and the host has a /32
//! (/128) route to the pod through it. Optional masquerade (`ipMasq`) and `mtu`. The steps every
//! interface plugin shares are in [`netkit::iface`].

pub mod config;

use config::PtpConf;
use ipnetwork::IpNetwork;
use libcni::invoke;
use libcni::types::{CniResult, Interface, IpConfig};
use libcni::{code, Error, Errors, Plugin, Request, Result};
use netkit::firewall::{self, Firewall};
use netkit::iface::concurrent::alongside;
use netkit::iface::hostnet::{HostNets, Reach};
use netkit::iface::masquerade::{self, MasqueradeDel};
use netkit::iface::naming::host_veth_name;
use netkit::iface::result::{is_v4, own_ips, pod_interface, set_gateways, subnet_gateway};
use netkit::iface::{self, configure, ipam, veth, Pod, Undo};
use netkit::sysctl;
use netkit::{Family, Link, NetNs, Netlink, RouteSpec};
use std::net::IpAddr;

pub struct Ptp;

/// RT_SCOPE_HOST: the reference's host route to the pod (`ip.AddHostRoute`).
const SCOPE_HOST: u8 = 254;
/// RT_SCOPE_LINK: the pod's route to its gateway.
const SCOPE_LINK: u8 = 253;

impl Plugin for Ptp {
    fn known_args(&self) -> &'static [&'static str] {
        // IP is read by host-local, which gets our CNI_ARGS.
        &["IP"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = config::parse(req)?;
        ipam::ready(req, Some(&conf.ipam_type))?;
        let pod = Pod::open_for_add(req)?;
        let fw = conf.ip_masq.map(|m| firewall::open(m.backend));
        pod.add_chained(|undo| add(&pod, &conf, fw.as_deref(), undo))
    }

    /// Releases the addresses, removes the masquerade rules and the veth (which takes the host
    /// end's gateway address and the host route with it), each best effort. A configuration that
    /// no longer validates still removes all three: the rules from every backend. The veth's
    /// deletion waits out RCU grace periods in the kernel, so the release and the rules go
    /// alongside it ([`alongside`]); a release through the pod's interface (dhcp) first.
    fn del(&self, req: &Request) -> Result<()> {
        let mut errs = Errors::new();
        let conf = config::parse(req);
        // invoke refuses a type that names a path.
        let ipam_type = req.conf.ipam_type();
        if let Some(t) = ipam_type.filter(|t| ipam::releases_through_link(t)) {
            errs.record(invoke::delegate_del(t, req));
        }
        let others = |_: &_| {
            let mut errs = Errors::new();
            if let Some(t) = ipam_type.filter(|t| !ipam::releases_through_link(t)) {
                errs.record(invoke::delegate_del(t, req));
            }
            let masq = match &conf {
                Ok(c) => MasqueradeDel::Configured(c.ip_masq),
                Err(e) => {
                    eprintln!(
                        "ptp: DEL removes everything the attachment can hold, as its configuration is invalid: {e}"
                    );
                    MasqueradeDel::Everywhere
                }
            };
            let (network, id, ifname) = (&req.conf.name, &req.container_id, &req.ifname);
            masquerade::del(&firewall::open, masq, network, id, ifname).into_iter().for_each(|e| errs.push(e));
            errs
        };
        let (others, link_errs) =
            alongside("releasing the addresses or removing the rules", others, |_| veth::del(req, || {}));
        // Its errors, joined into one, keep their place (after a dhcp release's, before the link's).
        errs.record(others.and_then(Errors::finish));
        link_errs.into_iter().for_each(|e| errs.push(e));
        errs.finish()
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        let (prev, ns) = iface::check::start(req, Some(&conf.ipam_type))?;
        check(req, &conf, prev, &ns)
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        masquerade::status(req, Some(&conf.ipam_type), conf.ip_masq)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        let conf = config::parse(req)?;
        masquerade::gc(req, &conf.network, Some(&conf.ipam_type), conf.ip_masq).0.finish()
    }
}

fn add<'a>(pod: &'a Pod, conf: &'a PtpConf, fw: Option<&'a dyn Firewall>, undo: &mut Undo<'a>) -> Result<CniResult> {
    let (req, ns, cont) = (pod.req, &pod.ns, &pod.nl);
    // IPAM first, as the reference: a pool that is full costs no veth.
    let r = ipam::add(&conf.ipam_type, req, undo)?;
    let mut result = CniResult { cni_version: req.conf.cni_version.clone(), ..Default::default() };
    (result.ips, result.routes, result.dns) = (r.ips, r.routes, r.dns);
    // Our interfaces are [host veth, pod interface]. The gateways are checked against the node's
    // networks before anything is made, and one IPAM did not give is filled in there.
    set_gateways(&mut result, 1, false, false);
    gateways_off_node_networks(&mut result.ips)?;
    configure::enable_forwarding(&result.ips)?;

    let host = pod.host()?;
    let (host_name, host_link) = veth::create(pod, conf.mtu, None)?;
    let created = host_name.clone();
    // Deleting one end removes the pair, the pod's end included.
    undo.push(move || {
        let _ = host.delete_link_by_name(&created);
    });
    let cont_link = cont
        .link(&req.ifname)?
        .ok_or_else(|| Error::network(format!("veth peer {} is missing in {}", req.ifname, ns.path().display())))?;
    configure::apply(pod, cont_link.index, &result, false)?;
    route_through_gateway(cont, ns, cont_link.index, &result.ips)?;
    if result.ips.iter().any(|ip| !is_v4(&ip.address)) {
        // Without a usable link-local address the host sends no neighbour solicitation on this
        // link, so it could not forward IPv6 to the pod until DAD of its fe80 address ended (a
        // second or two). The link has two ends and the pod's addresses are unique by IPAM.
        sysctl::set_if(&host_name, Family::V6, "accept_dad", "0")?;
    }
    host.set_up(host_link.index)?;
    configure_host_end(host, &host_link, &result.ips)?;

    if let Some(fw) = fw {
        undo.push(move || {
            let _ = fw.del_masquerade(&conf.network, &req.container_id, &req.ifname);
        });
        fw.add_masquerade(&masquerade::rules(req, &conf.network, result.ips.iter()))?;
    }
    let cont_now = cont.link_by_index(cont_link.index)?.unwrap_or(cont_link);
    result.interfaces = vec![
        Interface { name: host_name, mac: host_link.mac_string(), ..Default::default() },
        pod_interface(&req.ifname, &cont_now, ns),
    ];
    if let Some(dns) = &conf.dns {
        result.dns = dns.clone();
    }
    Ok(result)
}

/// Whether `name` is a ptp host veth's: `veth` + 8 lowercase hex digits, as ours
/// ([`host_veth_name`]) and the reference's (random) are named.
fn is_host_veth_name(name: &str) -> bool {
    name.strip_prefix("veth")
        .is_some_and(|hex| hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Gives each address without a gateway its subnet's first address, and refuses (code 7) a gateway
/// or pod address on a network the node is on, before anything is made ([`HostNets`]). The gateway
/// goes on the host end as a /32 (/128), so the node answers ARP for it on every link: the node
/// must not already hold it on another interface (ptp's host veths of the network hold the same
/// one, and are ptp's own) nor reach it directly through another interface (the LAN router's
/// address, say). The subnet's first address is taken under the same rule: ptp "owns" the subnet
/// around it when the node reaches that address through no interface but ptp's own. The pod address
/// gets a host route: the node must not hold it, nor reach it directly through another interface;
/// through another ptp host veth it is code 11, as that pod's DEL is under way.
fn gateways_off_node_networks(ips: &mut [IpConfig]) -> Result<()> {
    let nets = HostNets::open()?;
    let own = |oif: u32| is_host_veth_name(&nets.link_name(oif));
    let what_to_do = "give the pods a subnet and gateway (ipam) that are not on the node's networks";
    for ip in ips.iter_mut() {
        let pod = ip.address.ip();
        let (gw, given) = match ip.gateway {
            Some(gw) => (gw, true),
            None => (subnet_gateway(&ip.address), false),
        };
        if let Some(reach) = nets.reach(gw)?.filter(|r| !own(r.oif())) {
            let whose = if given {
                format!("gateway {gw} (of {})", ip.address)
            } else {
                format!("IPAM gave {} no gateway, and the subnet's first address {gw}", ip.address)
            };
            return Err(Error::config(format!(
                "{whose} is {}: on the host veth the node would answer ARP and neighbour solicitations for it \
                 in place of its owner; {}{what_to_do}",
                nets.describe(&reach),
                if given { "" } else { "set the gateway in the ipam configuration, or " }
            )));
        }
        match nets.reach(pod)? {
            None => {}
            Some(Reach::OnLink { dst, oif }) if own(oif) => {
                return Err(Error::new(
                    code::TRY_AGAIN,
                    format!(
                        "host veth {} still routes {pod} ({dst}): the DEL of its pod is under way; try again",
                        nets.link_name(oif)
                    ),
                ));
            }
            Some(reach) => {
                return Err(Error::config(format!(
                    "address {pod} from IPAM is {}: the host route to the pod would take its traffic; {what_to_do}",
                    nets.describe(&reach)
                )));
            }
        }
        ip.gateway = Some(gw);
    }
    Ok(())
}

/// `addr/32` (or `/128`).
fn host_prefix(addr: IpAddr) -> IpNetwork {
    let bits = if addr.is_ipv4() { 32 } else { 128 };
    IpNetwork::new(addr, bits).unwrap_or(IpNetwork::from(addr))
}

/// The pod's routes to each address's gateway and subnet: the gateway as a link route, the subnet
/// through it, the kernel's subnet route gone (a veth cannot be IFF_POINTTOPOINT; this makes every
/// packet to the subnet go to the host, which routes it to the right pod).
fn route_through_gateway(cont: &Netlink, ns: &NetNs, index: u32, ips: &[IpConfig]) -> Result<()> {
    let in_ns = |e: Error, what: &str| e.context(format_args!("{what} in {}", ns.path().display()));
    for ip in ips {
        let Some(gw) = ip.gateway else { continue };
        let subnet = IpNetwork::new(ip.address.network(), ip.address.prefix()).unwrap_or(ip.address);
        let kernel_route = RouteSpec { oif: Some(index), ..RouteSpec::new(subnet) };
        cont.del_route(&kernel_route).map_err(|e| in_ns(e, "remove the subnet route"))?;
        let to_gw = RouteSpec {
            oif: Some(index),
            scope: Some(SCOPE_LINK),
            src: Some(ip.address.ip()),
            ..RouteSpec::new(host_prefix(gw))
        };
        add_route(cont, &to_gw).map_err(|e| in_ns(e, "add the route to the gateway"))?;
        // A /32 (/128) address has no subnet to route.
        if ip.address.prefix() < host_prefix(gw).prefix() {
            let via_gw =
                RouteSpec { oif: Some(index), gw: Some(gw), src: Some(ip.address.ip()), ..RouteSpec::new(subnet) };
            add_route(cont, &via_gw).map_err(|e| in_ns(e, "add the subnet route via the gateway"))?;
        }
    }
    Ok(())
}

/// Adds a route; one already there is fine.
fn add_route(nl: &Netlink, route: &RouteSpec) -> Result<()> {
    match nl.add_route(route) {
        Err(e) if !netkit::is_exists(&e) => Err(e),
        _ => Ok(()),
    }
}

/// The host end: each gateway as a /32 (/128, no duplicate address detection: every pod's host
/// end holds the same one, and the pod could not reach it while it is tentative), and a host route
/// to each pod address through it.
fn configure_host_end(host: &Netlink, link: &Link, ips: &[IpConfig]) -> Result<()> {
    for ip in ips {
        if let Some(gw) = ip.gateway {
            let gw = host_prefix(gw);
            match host.add_address(link.index, gw, !is_v4(&gw)) {
                Err(e) if !netkit::is_exists(&e) => {
                    return Err(e.context(format_args!("add gateway {gw} to host veth {}", link.name)))
                }
                _ => {}
            }
        }
        let to_pod = RouteSpec {
            oif: Some(link.index),
            scope: is_v4(&ip.address).then_some(SCOPE_HOST),
            ..RouteSpec::new(host_prefix(ip.address.ip()))
        };
        add_route(host, &to_pod)
            .map_err(|e| e.context(format_args!("add host route to {} via {}", ip.address.ip(), link.name)))?;
    }
    Ok(())
}

/// CHECK (code 103 on a difference): the pod's interface, addresses and routes as prevResult
/// says ([`iface::check::pod`]), the host end with each gateway and a route to each pod address,
/// and the masquerade rules.
fn check(req: &Request, conf: &PtpConf, prev: &CniResult, ns: &NetNs) -> Result<()> {
    let failed = |msg: String| Error::new(code::CHECK_FAILED, msg);
    let (link, sandbox_idx) = iface::check::pod(ns, &req.ifname, prev, true)?;
    if link.kind.as_deref() != Some("veth") {
        return Err(failed(format!("{} is not a veth", req.ifname)));
    }
    let host = Netlink::open()?;
    let host_name = prev
        .interfaces
        .iter()
        .find(|i| i.sandbox.as_deref().is_none_or(str::is_empty))
        .map(|i| i.name.clone())
        .unwrap_or_else(|| host_veth_name(&req.container_id, &req.ifname, 0));
    let host_link = host.link(&host_name)?.ok_or_else(|| failed(format!("host veth {host_name} is missing")))?;
    let addrs = host.addresses(host_link.index)?;
    let own: Vec<&IpConfig> = own_ips(prev, sandbox_idx).collect();
    for ip in &own {
        if let Some(gw) = ip.gateway.map(host_prefix) {
            if !addrs.contains(&gw) {
                return Err(failed(format!("host veth {host_name} does not hold the gateway {gw}")));
            }
        }
        let family = Family::of_net(&ip.address);
        let to_pod = host_prefix(ip.address.ip());
        if !host.routes_of(host_link.index, family)?.iter().any(|r| r.dst == to_pod) {
            return Err(failed(format!("the host has no route to {to_pod} through {host_name}")));
        }
    }
    if let Some(m) = conf.ip_masq {
        firewall::open(m.backend).check_masquerade(&masquerade::rules(req, &conf.network, own.into_iter()))?;
    }
    Ok(())
}

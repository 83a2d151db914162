//! portmap: forwards host ports to a container (a chained plugin after bridge/ptp and IPAM).
//!
//! ADD maps to the first IPv4 and the first IPv6 address of prevResult on CNI_IFNAME inside the
//! sandbox and returns prevResult unchanged. DEL removes everything of the container's, found by
//! its id, whether or not it carries the mappings and whether or not the netns is still there.

pub mod config;

use config::Config;
use ipnetwork::IpNetwork;
use libcni::skel::{Plugin, Request};
use libcni::types::CniResult;
use libcni::{Errors, Result};
use netkit::firewall::{self, BackendKind, Protocol};
use netkit::{Family, Netlink};
use std::net::{IpAddr, Ipv4Addr};

/// The plugin.
pub struct PortMap;

/// The first IPv4 and first IPv6 prevResult address on `ifname` in the sandbox. An address
/// without an interface index is taken as the container's, as the reference does.
pub fn container_addresses(prev: &CniResult, ifname: &str) -> (Option<IpNetwork>, Option<IpNetwork>) {
    let mut v4 = None;
    let mut v6 = None;
    for ip in &prev.ips {
        if let Some(iface) = ip.interface.and_then(|i| prev.interfaces.get(i)) {
            let in_sandbox = iface.sandbox.as_deref().is_some_and(|s| !s.is_empty());
            if iface.name != ifname || !in_sandbox {
                continue;
            }
        }
        let slot = if ip.address.is_ipv4() { &mut v4 } else { &mut v6 };
        if slot.is_none() {
            *slot = Some(ip.address);
        }
    }
    (v4, v6)
}

fn rules(req: &Request, conf: &Config, v4: Option<IpNetwork>, v6: Option<IpNetwork>) -> firewall::PortMap {
    firewall::PortMap {
        network: req.conf.name.clone(),
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        mappings: conf.mappings.clone(),
        ipv4: v4,
        ipv6: v6,
        snat: conf.snat,
        masq_all: conf.masq_all,
        mark_masq_bit: conf.mark_masq_bit,
        external_set_mark_chain: conf.external_set_mark_chain.clone(),
        conditions_v4: conf.conditions_v4.clone(),
        conditions_v6: conf.conditions_v6.clone(),
    }
}

/// The name of the host interface a packet to `ip` leaves through, as `ip route get` picks it
/// (policy rules honoured); `None` when the node has no route to it.
fn routing_interface(ip: Ipv4Addr) -> Result<Option<String>> {
    let nl = Netlink::open()?;
    let Some(index) = nl.output_link(IpAddr::V4(ip))? else { return Ok(None) };
    Ok(nl.link_by_index(index)?.map(|l| l.name))
}

/// Lets 127.0.0.1-sourced packets (localhost → hostPort, DNATed) leave through `ifname`.
fn enable_route_localnet(ifname: &str) -> Result<()> {
    netkit::sysctl::ensure(&format!("net/ipv4/conf/{ifname}/route_localnet"), "1")
}

/// Flushes the UDP conntrack entries of the mapped ports in these families: stale entries would
/// keep steering datagrams past a new or removed mapping; failures are logged only.
fn flush_udp(conf: &Config, families: &[Family]) {
    let mut ports: Vec<u16> =
        conf.mappings.iter().filter(|m| m.protocol == Protocol::Udp).map(|m| m.host_port).collect();
    ports.sort_unstable();
    ports.dedup();
    for port in ports {
        for family in families {
            if let Err(e) = firewall::flush_udp_conntrack(port, *family) {
                eprintln!("portmap: {e}");
            }
        }
    }
}

impl Plugin for PortMap {
    fn reads_cni_args(&self) -> bool {
        false
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = Config::parse(req)?;
        let prev = req.prev_result("portmap")?;
        if conf.mappings.is_empty() {
            return Ok(prev.clone());
        }
        let (v4, v6) = container_addresses(prev, &req.ifname);
        if v4.is_none() && v6.is_none() {
            return Ok(prev.clone());
        }
        let fw = firewall::open(conf.backend);
        fw.add_portmap(&rules(req, &conf, v4, v6))?;
        if let (true, Some(IpNetwork::V4(addr))) = (conf.snat, v4) {
            let localnet = routing_interface(addr.ip())
                .and_then(|ifname| ifname.map_or(Ok(()), |ifname| enable_route_localnet(&ifname)));
            if let Err(e) = localnet {
                let mut errs = Errors::new();
                errs.push(e.context("portmap ADD"));
                errs.record(fw.del_portmap(&req.conf.name, &req.container_id, &req.ifname));
                return errs.finish().and(Ok(prev.clone()));
            }
        }
        let families: Vec<Family> = v4.iter().chain(&v6).map(Family::of_net).collect();
        flush_udp(&conf, &families);
        Ok(prev.clone())
    }

    fn del(&self, req: &Request) -> Result<()> {
        let (network, id, ifname) = (&req.conf.name, &req.container_id, &req.ifname);
        let conf = match Config::parse(req) {
            Ok(conf) => conf,
            Err(invalid) => {
                // The rules are found by network, container id and ifname alone: a configuration
                // that does not validate (a bad mapping, an unknown backend) still says which
                // attachment to clean up, just not on which backend, so DEL looks on every one.
                eprintln!("portmap: DEL removes the attachment's rules on every backend, as its configuration is invalid: {invalid}");
                return firewall::del_everywhere(firewall::Rules::PortMap, network, id, ifname);
            }
        };
        firewall::open(conf.backend).del_portmap(network, id, ifname)?;
        if conf.backend_detected && conf.backend == BackendKind::Nftables {
            firewall::del_reference_leftovers(network, id, ifname, true)?;
        }
        flush_udp(&conf, &[Family::V4, Family::V6]);
        Ok(())
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = Config::parse(req)?;
        let prev = req.prev_result("portmap")?;
        if conf.mappings.is_empty() {
            return Ok(());
        }
        let (v4, v6) = container_addresses(prev, &req.ifname);
        if v4.is_none() && v6.is_none() {
            return Ok(());
        }
        firewall::open(conf.backend).check_portmap(&rules(req, &conf, v4, v6))
    }

    fn gc(&self, req: &Request) -> Result<()> {
        let conf = Config::parse(req)?;
        // Without the list of valid attachments we cannot tell garbage from live pods.
        let Some(keep) = req.conf.valid_attachments.as_deref() else { return Ok(()) };
        firewall::open(conf.backend).gc_portmap(&req.conf.name, keep)
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = Config::parse(req)?;
        firewall::open(conf.backend).status()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn picks_first_address_per_family_on_the_sandbox_interface() {
        let prev = CniResult::parse(
            &json!({
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/x"}, {"name": "eth1", "sandbox": "/run/netns/x"}],
                "ips": [
                    {"address": "10.0.0.1/24", "interface": 0},
                    {"address": "10.1.0.5/24", "interface": 3},
                    {"address": "10.0.0.5/24", "interface": 2},
                    {"address": "10.0.0.6/24", "interface": 2},
                    {"address": "fd00::5/64", "interface": 2}
                ]
            }),
            "1.0.0",
        )
        .unwrap();
        let (v4, v6) = container_addresses(&prev, "eth0");
        assert_eq!(v4, Some("10.0.0.5/24".parse().unwrap()));
        assert_eq!(v6, Some("fd00::5/64".parse().unwrap()));
        let (v4, v6) = container_addresses(&prev, "eth9");
        assert_eq!((v4, v6), (None, None));
    }
}

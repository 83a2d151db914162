//! The result algebra: what an interface plugin's ADD outputs, built from IPAM's result (gateways,
//! default routes, the pod's interface), chained after prevResult's, and read back on CHECK.

use crate::{Family, Link, NetNs};
use ipnetwork::IpNetwork;
use libcni::types::{CniResult, Interface, IpConfig, Route};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

/// prevResult's addresses of the interface at `sandbox_idx`, and those naming no interface.
pub fn own_ips(prev: &CniResult, sandbox_idx: Option<usize>) -> impl Iterator<Item = &IpConfig> {
    prev.ips.iter().filter(move |ip| ip.interface.is_none() || ip.interface == sandbox_idx)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

#[test]
fn backend_names() {
    assert_eq!(choose(Some("nft")).unwrap(), BackendKind::Nftables);
    assert_eq!(choose(Some("nftables")).unwrap(), BackendKind::Nftables);
    assert_eq!(choose(Some("iptables")).unwrap(), BackendKind::Iptables);
    assert_eq!(choose(Some("ipfw")).unwrap_err().code, code::INVALID_CONFIG);
}

#[test]
fn mapping_families() {
    let m = PortMapping { host_port: 1, container_port: 1, protocol: Protocol::Tcp, host_ip: None };
    assert!(m.applies_to(Family::V4) && m.applies_to(Family::V6));
    let m = PortMapping { host_ip: Some("0.0.0.0".parse().unwrap()), ..m };
    assert!(m.applies_to(Family::V4) && !m.applies_to(Family::V6));
    assert_eq!(m.bound_ip(), None);
    let m = PortMapping { host_ip: Some("fd00::1".parse().unwrap()), ..m };
    assert!(!m.applies_to(Family::V4) && m.applies_to(Family::V6));
    assert!(m.bound_ip().is_some());
    assert_eq!(Protocol::parse("TCP"), Some(Protocol::Tcp));
    assert_eq!(Protocol::parse("icmp"), None);
}

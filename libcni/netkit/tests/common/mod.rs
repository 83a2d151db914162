//! Firewall inputs shared by the nftables tests and the `nft_growth` example (which includes this
//! file by path).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use netkit::firewall::{PortMap, PortMapping, Protocol};

/// The port mappings of container `id` on `network` to its address `ipv4` (`10.0.0.2/16`), with
/// portmap's defaults (snat, mark bit 13, no conditions).
pub fn portmap(network: &str, id: &str, ipv4: &str, mappings: Vec<PortMapping>) -> PortMap {
    PortMap {
        network: network.into(),
        container_id: id.into(),
        ifname: "eth0".into(),
        mappings,
        ipv4: Some(ipv4.parse().unwrap()),
        ipv6: None,
        snat: true,
        masq_all: false,
        mark_masq_bit: 13,
        external_set_mark_chain: None,
        conditions_v4: vec![],
        conditions_v6: vec![],
    }
}

/// TCP `port` on every host address to the container's port 80.
pub fn tcp(port: u16) -> PortMapping {
    PortMapping { host_port: port, container_port: 80, protocol: Protocol::Tcp, host_ip: None }
}

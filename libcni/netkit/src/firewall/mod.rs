//! Port mapping and IP masquerade behind one trait, with an nftables and an iptables backend.
//!
//! The backend is chosen while a plugin parses its config ([`choose`]) and opened with [`open`].
//! Both backends keep their rules in their own chains and read back only those:
//!
//! - nftables: tables `inet cni_rs_portmap`, `inet cni_rs_masq` and `bridge cni_rs_macspoof`, each
//!   with a fixed set of chains, sets and maps, and per attachment only elements of them (owned
//!   through an owner record keyed on a hash of network, container id and ifname), drawn in
//!   `nftables.rs`. Every verb is netlink in process; DEL, CHECK and GC read the owner record,
//!   so they need neither the container's IPs nor its mappings. Only port mappings with
//!   `conditionsV4`/`V6` (nft text) have a chain of their own, which `nft` fills on ADD.
//! - iptables: the reference plugins' chain names, marks and comments (`CNI-HOSTPORT-DNAT`,
//!   `CNI-DN-<hash>`, `CNI-HOSTPORT-SETMARK`, `CNI-HOSTPORT-MASQ`, `CNI-<hash>`), so pods set up by
//!   the Go plugins are torn down by ours. One `iptables-save -t nat` and one
//!   `iptables-restore --noflush` per family and operation.

mod conntrack;
mod exec;
mod iptables;
pub mod netpol;
pub(crate) mod nfnl;
mod nftables;
pub mod xtables;

use crate::Family;
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{code, Error, Result};
use sha2::{Digest, Sha512};
use std::fmt;
use std::net::IpAddr;

pub use iptables::IptablesBackend;
/// The firewall plugin's FORWARD rules in the reference's iptables layout.
pub mod forward {
    pub use super::iptables::forward::{
        add, check, del, status, ForwardRules, Isolation, DEFAULT_ADMIN_CHAIN, PLUGIN_CHAINS,
    };
}
pub use nftables::{add_macspoof, check_macspoof, del_macspoof, gc_macspoof, NftablesBackend};

/// The firewall implementations we can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Nftables,
    Iptables,
}

impl BackendKind {
    /// The name used in configs: `nftables` or `iptables`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Nftables => "nftables",
            BackendKind::Iptables => "iptables",
        }
    }

    /// Parses a backend name from a config (`nftables`, `nft` or `iptables`); anything else is code 7.
    pub fn parse(name: &str) -> Result<BackendKind> {
        match name {
            "nftables" | "nft" => Ok(BackendKind::Nftables),
            "iptables" => Ok(BackendKind::Iptables),
            other => Err(Error::config(format!(
                "unknown firewall backend {other:?}: use \"nftables\" (or \"nft\") or \"iptables\""
            ))),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The backend a config asked for, or when it asked for none, nftables where the kernel has it and
/// iptables otherwise. A bad name is code 7.
pub fn choose(requested: Option<&str>) -> Result<BackendKind> {
    match requested {
        Some(name) => BackendKind::parse(name),
        None if nftables::usable() => Ok(BackendKind::Nftables),
        None => Ok(BackendKind::Iptables),
    }
}

/// A node that switched from the reference plugins (iptables) to ours on nftables still has the
/// reference's iptables chains for the pods the reference attached. When the backend was detected
/// rather than configured, DEL calls this: it asks the kernel for the container's reference chain
/// (`CNI-DN-<hash>` for port mappings, `CNI-<hash>` for masquerade) in the `ip`/`ip6 nat` tables where
/// iptables-nft keeps them — one netlink request per family, no process — and only if one is there
/// removes the container's rules with the iptables backend. iptables-legacy rules are not looked for.
pub fn del_reference_leftovers(network: &str, container_id: &str, ifname: &str, portmap: bool) -> Result<()> {
    let chain = iptables::chain_name(network, container_id, if portmap { "DN-" } else { "" });
    let nl = nfnl::Conn::new();
    let present = [nfnl::TableFamily::Ip, nfnl::TableFamily::Ip6]
        .into_iter()
        .any(|family| matches!(nl.list_chain(family, "nat", &chain), Ok(Some(_))));
    if !present {
        return Ok(());
    }
    if portmap {
        IptablesBackend.del_portmap(network, container_id, ifname)
    } else {
        IptablesBackend.del_masquerade(network, container_id, ifname)
    }
}

/// Whether nftables works on this node (the kernel answers nf_tables; the `nft` binary is not needed).
pub fn nftables_usable() -> bool {
    nftables::usable()
}

/// What a container's rules are, for [`del_everywhere`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    PortMap,
    Masquerade,
}

/// Removes a container's rules from every backend this node can run: for a DEL whose configuration
/// does not validate, so it cannot say which backend holds them. Rules are found by network,
/// container id and ifname alone, and what is not there is success.
pub fn del_everywhere(rules: Rules, network: &str, container_id: &str, ifname: &str) -> Result<()> {
    let mut errs = libcni::Errors::new();
    let mut backends: Vec<Box<dyn Firewall>> = Vec::new();
    if nftables::usable() {
        backends.push(Box::new(NftablesBackend));
    }
    if exec::find("iptables").is_some() {
        backends.push(Box::new(IptablesBackend));
    }
    for fw in backends {
        errs.record(match rules {
            Rules::PortMap => fw.del_portmap(network, container_id, ifname),
            Rules::Masquerade => fw.del_masquerade(network, container_id, ifname),
        });
    }
    errs.finish()
}

/// The backend of that kind.
pub fn open(kind: BackendKind) -> Box<dyn Firewall> {
    match kind {
        BackendKind::Nftables => Box::new(NftablesBackend),
        BackendKind::Iptables => Box::new(IptablesBackend),
    }
}

/// Masquerade traffic from a pod's addresses to anything outside their subnets (multicast excepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masquerade {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// The pod's addresses with their subnet prefix, like `10.22.0.5/24`.
    pub addresses: Vec<IpNetwork>,
}

/// A transport protocol a port can be mapped for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses `tcp`, `udp` or `sctp` in any case; None for anything else.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One host port forwarded to a container port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
    /// Only traffic to this host address is forwarded; None (or an unspecified address) means any.
    pub host_ip: Option<IpAddr>,
}

impl PortMapping {
    /// Whether this mapping applies to a container address of `family`: a host IP makes it apply
    /// to the host IP's family only.
    pub fn applies_to(&self, family: Family) -> bool {
        self.host_ip.is_none_or(|ip| Family::of(&ip) == family)
    }
    /// The host address to match on, if the mapping is bound to one.
    pub fn bound_ip(&self) -> Option<IpAddr> {
        self.host_ip.filter(|ip| !ip.is_unspecified())
    }
}

/// A container's port mappings, with the addresses they forward to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMap {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub mappings: Vec<PortMapping>,
    /// The container's first IPv4 address with its subnet prefix, like `10.22.0.5/24`.
    pub ipv4: Option<IpNetwork>,
    /// The container's first IPv6 address with its subnet prefix.
    pub ipv6: Option<IpNetwork>,
    /// Masquerade hairpin traffic (from the container's subnet) and IPv4 localhost traffic.
    pub snat: bool,
    /// Masquerade forwarded traffic from any source, not only the container's subnet.
    pub masq_all: bool,
    /// iptables: the mark bit that asks CNI-HOSTPORT-MASQ to masquerade (the reference's 13).
    pub mark_masq_bit: u8,
    /// iptables: a chain of someone else's that marks packets for masquerade, used instead of
    /// CNI-HOSTPORT-SETMARK (and then we create neither SETMARK nor MASQ).
    pub external_set_mark_chain: Option<String>,
    /// Extra match conditions for the entry rules, in the backend's own syntax.
    pub conditions_v4: Vec<String>,
    pub conditions_v6: Vec<String>,
}

impl PortMap {
    /// The container addresses to forward to: IPv4 first.
    pub fn targets(&self) -> impl Iterator<Item = IpNetwork> + '_ {
        self.ipv4.iter().chain(self.ipv6.iter()).copied()
    }

    /// Whether IPv4 localhost may reach these mappings (`snat` with an IPv4 address): portmap
    /// then turns `route_localnet` on, and [`Firewall::add_portmap`] first makes sure packets
    /// to 127.0.0.0/8 from anywhere but the node itself are dropped unless DNATed.
    pub fn localnet(&self) -> bool {
        self.snat && self.ipv4.is_some()
    }
}

/// Port mapping and masquerade for one node. DEL and GC are idempotent: what is not there is success.
pub trait Firewall {
    /// The backend's kind.
    fn kind(&self) -> BackendKind;
    /// Masquerade traffic from each address to anything outside its subnet, except multicast
    /// (224.0.0.0/4, ff00::/8).
    fn add_masquerade(&self, m: &Masquerade) -> Result<()>;
    /// Remove a container's masquerade rules, found by its id alone (no IPs needed).
    fn del_masquerade(&self, network: &str, container_id: &str, ifname: &str) -> Result<()>;
    /// Verify that the masquerade rules of `m` exist (code 103 when not).
    fn check_masquerade(&self, m: &Masquerade) -> Result<()>;
    /// Remove the masquerade rules of every container of `network` that is not in `keep`.
    fn gc_masquerade(&self, network: &str, keep: &[Attachment]) -> Result<()>;
    /// Forward the mapped host ports to the container (replacing what it had). A host port
    /// (protocol, family, host address) another container holds fails it with code 100 and adds
    /// nothing. When [`PortMap::localnet`], it also makes sure the node drops packets to
    /// 127.0.0.0/8 that neither come from 127.0.0.0/8 nor were DNATed (a shared rule, never removed).
    fn add_portmap(&self, p: &PortMap) -> Result<()>;
    /// Remove a container's port mappings, found by its id alone (no IPs or mappings needed).
    fn del_portmap(&self, network: &str, container_id: &str, ifname: &str) -> Result<()>;
    /// Verify that the rules of `p` exist (code 103 when not).
    fn check_portmap(&self, p: &PortMap) -> Result<()>;
    /// Remove the port mappings of every container of `network` that is not in `keep`.
    fn gc_portmap(&self, network: &str, keep: &[Attachment]) -> Result<()>;
    /// Ok when this backend can work on this node; code 50 when not (tool missing, kernel lacks it).
    fn status(&self) -> Result<()>;
}

/// Deletes the UDP conntrack entries of one family whose original destination port is `port`,
/// in every zone, so datagrams that were tracked before a mapping existed stop bypassing it: a
/// ctnetlink dump and a delete of each entry that matches, in the calling thread's network
/// namespace. How many were deleted; none is success.
pub fn flush_udp_conntrack(port: u16, family: Family) -> Result<usize> {
    conntrack::delete(conntrack::Filter::udp_to_port(port, family))
}

/// Makes chain `postrouting` (nat, hook postrouting, priority srcnat) of table `inet <table>` hold
/// exactly one rule per `(source, exempt)` pair: `ip saddr <source> ip daddr != <exempt>
/// masquerade comment "<comment>"` (ip6 for IPv6 pairs). One nf_tables transaction over netlink:
/// the table and chain are added if missing and the chain's rules replaced, so the table is never
/// seen half-written. For the node agent (`cni-rs-node`), which owns the table.
pub fn replace_masquerade_chain(table: &str, pairs: &[(IpNetwork, IpNetwork)], comment: &str) -> Result<()> {
    use nfnl::{BaseChain, Batch, ChainType, Hook, Rule, TableFamily};
    let chain = "postrouting";
    let base = BaseChain { hook: Hook::Postrouting, priority: 100, kind: ChainType::Nat, policy_accept: true };
    let mut batch = Batch::new();
    batch.add_table(TableFamily::Inet, table);
    batch.add_chain(TableFamily::Inet, table, chain, Some(base), None);
    batch.flush_chain(TableFamily::Inet, table, chain);
    for (source, exempt) in pairs {
        let rule = Rule::new(TableFamily::Inet).saddr_in(*source).daddr_not_in(*exempt).masquerade();
        batch.add_rule_with_comment(TableFamily::Inet, table, chain, rule, Some(comment));
    }
    match batch.send_each()?.into_iter().next() {
        None => Ok(()),
        Some(first) => Err(first.error.context(format_args!("masquerade chain of table inet {table}"))),
    }
}

/// Lowercase hex of sha512(input).
fn sha512_hex(input: &str) -> String {
    Sha512::digest(input.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A host port as a conflict names it: `host port 8080/tcp on 10.0.0.1`, or `host port 8080/tcp
/// (any IPv4 host address)` for a mapping on every address of its family.
fn host_port_text(host: Option<IpAddr>, proto: &str, port: u16, family: Family) -> String {
    match host {
        Some(ip) => format!("host port {port}/{proto} on {ip}"),
        None => format!("host port {port}/{proto} (any {family} host address)"),
    }
}

/// A CHECK failure naming what is missing.
fn check_failed(msg: impl Into<String>) -> Error {
    Error::new(code::CHECK_FAILED, msg)
}

#[cfg(test)]
mod tests;

/// The masquerade backend an interface plugin's `ipMasq` uses, chosen once while parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpMasq {
    pub backend: BackendKind,
    /// No `ipMasqBackend` was set: DEL then also removes what the reference plugin left in
    /// iptables, on a node that switched from it to our nftables.
    pub detected: bool,
}

/// `ipMasq` and `ipMasqBackend` as bridge and ptp take them: `None` when masquerade is off; the
/// backend from `backend` (empty is unset), else detected (which probes the kernel: only when on).
pub fn ip_masq(on: bool, backend: Option<&libcni::gojson::Spelled<String>>) -> Result<Option<IpMasq>> {
    let backend = match backend.filter(|b| !b.value.is_empty()) {
        Some(b) => Some(BackendKind::parse(&b.value).map_err(|_| {
            let key = b.key_or("ipMasqBackend");
            Error::config(format!("invalid {key} {:?}: use \"nftables\" or \"iptables\"", b.value))
        })?),
        None => None,
    };
    Ok(match (on, backend) {
        (false, _) => None,
        (true, Some(backend)) => Some(IpMasq { backend, detected: false }),
        (true, None) => Some(IpMasq { backend: choose(None)?, detected: true }),
    })
}

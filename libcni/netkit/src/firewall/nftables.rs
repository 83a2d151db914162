//! The nftables backend: our own `inet` tables, per-container chains named from a hash.
//!
//! Each container gets its own small set of chains; the ones that need a hook are base chains of
//! their own, so nothing shared points at a container and DEL is "delete these chains by name".
//! (A jump rule in a shared chain could only be deleted by its handle, which means listing the
//! chain; a verdict-map element only by its key, which means knowing the ports — and DEL may know
//! neither.) NAT chains are consulted on a connection's first packet only, so a hook per container
//! costs little on the packet path, and ADD/DEL cost stays flat however many pods there are.
//!
//! ```text
//! table inet cni_rs_portmap {
//!   chain pm-<net8>-<id16>-dnat { [ip daddr H] tcp dport 8080 dnat ip to 10.22.0.5:80 ... }
//!   chain pm-<net8>-<id16>-pre  { type nat hook prerouting priority dstnat;
//!                                 meta nfproto ipv4 <conditionsV4> fib daddr type local jump ...-dnat }
//!   chain pm-<net8>-<id16>-out  { type nat hook output priority dstnat; (same as -pre) }
//!   chain pm-<net8>-<id16>-post { type nat hook postrouting priority srcnat;     (snat only)
//!                                 ct status dnat ip daddr 10.22.0.5 ip saddr { 10.22.0.0/16, 127.0.0.1 }
//!                                 meta l4proto tcp ct original proto-dst 8080 masquerade }
//! }
//! table inet cni_rs_masq {
//!   chain mq-<net8>-<id16> { type nat hook postrouting priority srcnat;
//!                            ip saddr 10.22.0.5 ip daddr != 10.22.0.0/16 ip daddr != 224.0.0.0/4 masquerade }
//! }
//! ```
//! `<net8>` hashes the network name (so GC can tell a network's chains apart) and `<id16>` hashes
//! (network, container id, ifname). Removing a chain that may be absent is `add chain; flush chain;
//! delete chain` in one batch, which always succeeds, so DEL twice and parallel DELs are fine.

use super::exec::{self, one_line, run, run_ok};
use super::{check_failed, sha512_hex, BackendKind, Firewall, Masquerade, PortMap};
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{code, Error, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;

pub(crate) const PORTMAP_TABLE: &str = "cni_rs_portmap";
pub(crate) const MASQ_TABLE: &str = "cni_rs_masq";
const FAMILY: &str = "inet";
const PORTMAP_PREFIX: &str = "pm";
const MASQ_PREFIX: &str = "mq";
const PORTMAP_SUFFIXES: [&str; 4] = ["pre", "out", "post", "dnat"];

/// The nftables backend (stateless; every call is one `nft` process).
#[derive(Debug, Clone, Copy, Default)]
pub struct NftablesBackend;

/// `nft` is installed and the kernel has nf_tables.
pub(crate) fn usable() -> bool {
    if exec::find("nft").is_none() {
        return false;
    }
    // /sys/module/nf_tables exists only when nf_tables is a module; a built-in one is asked
    // directly (one netlink round trip, where running `nft list tables` costs a process, ~6 ms).
    std::path::Path::new("/sys/module/nf_tables").exists()
        || kernel_has_nf_tables()
        || run("nft", &["list", "tables"], None).map(|o| o.success).unwrap_or(false)
}

/// Whether the kernel answers an nf_tables request: NFT_MSG_GETGEN on a netfilter netlink socket.
/// False when it cannot tell (no socket, an error, no answer within a second).
fn kernel_has_nf_tables() -> bool {
    const NETLINK_NETFILTER: libc::c_int = 12;
    const NFNL_SUBSYS_NFTABLES: u16 = 10;
    const NFT_MSG_NEWGEN: u16 = 15;
    const NFT_MSG_GETGEN: u16 = 16;
    // SAFETY: plain socket(2); the fd is owned (and closed) by `sock` below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
    if fd < 0 {
        return false;
    }
    // SAFETY: fd is a fresh socket we own.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    let timeout = libc::timeval { tv_sec: 1, tv_usec: 0 };
    // SAFETY: a valid timeval of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    // nlmsghdr (16 bytes) + nfgenmsg (family AF_UNSPEC, version 0, res_id 0).
    let mut req = [0u8; 20];
    req[0..4].copy_from_slice(&20u32.to_ne_bytes());
    req[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN).to_ne_bytes());
    req[6..8].copy_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // SAFETY: all-zero is a valid sockaddr_nl; the family is set below (port 0: the kernel).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: req and kernel are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            fd,
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent != req.len() as isize {
        return false;
    }
    let mut buf = [0u8; 8192];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 16 {
        return false;
    }
    let ty = u16::from_ne_bytes([buf[4], buf[5]]);
    ty == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN
}

fn network_hash(network: &str) -> String {
    sha512_hex(network)[..8].to_string()
}

/// `<prefix>-<net8>-<id16>`: the common part of a container's chain names.
fn chain_base(prefix: &str, network: &str, container_id: &str, ifname: &str) -> String {
    let id = sha512_hex(&format!("{network}\0{container_id}\0{ifname}"));
    format!("{prefix}-{}-{}", network_hash(network), &id[..16])
}

/// A chain comment for humans; nft strings cannot hold quotes, so those are replaced.
fn comment(kind: &str, network: &str, container_id: &str, ifname: &str) -> String {
    let text = format!("cni-rs {kind} net={network} id={container_id} if={ifname}");
    let mut clean: String =
        text.chars().map(|c| if c == '"' || c == '\\' || c.is_control() { '_' } else { c }).collect();
    // NFT_USERDATA_MAXLEN is 256 bytes; stay well inside it.
    if clean.len() > 200 {
        let mut cut = 200;
        while !clean.is_char_boundary(cut) {
            cut -= 1;
        }
        clean.truncate(cut);
    }
    clean
}

/// Lines that remove the chains (if present) in one batch: every chain is created if missing,
/// then all are flushed (dropping jumps between them), then all deleted.
fn remove_chains(out: &mut String, table: &str, chains: &[String]) {
    let _ = writeln!(out, "add table {FAMILY} {table}");
    for c in chains {
        let _ = writeln!(out, "add chain {FAMILY} {table} {c}");
    }
    for c in chains {
        let _ = writeln!(out, "flush chain {FAMILY} {table} {c}");
    }
    for c in chains {
        let _ = writeln!(out, "delete chain {FAMILY} {table} {c}");
    }
}

fn portmap_chains(network: &str, container_id: &str, ifname: &str) -> Vec<String> {
    let base = chain_base(PORTMAP_PREFIX, network, container_id, ifname);
    PORTMAP_SUFFIXES.iter().map(|s| format!("{base}-{s}")).collect()
}

/// `10.22.0.0/16` for `10.22.0.5/16`.
fn subnet(a: &IpNetwork) -> String {
    format!("{}/{}", a.network(), a.prefix())
}

fn family_words(addr: &IpNetwork) -> (&'static str, &'static str) {
    if addr.is_ipv6() {
        ("ip6", "ipv6")
    } else {
        ("ip", "ipv4")
    }
}

/// The rules of a container's port mappings, per chain suffix, in order.
fn portmap_rules(p: &PortMap, base: &str) -> BTreeMap<&'static str, Vec<String>> {
    let mut rules: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for addr in p.targets() {
        let v6 = addr.is_ipv6();
        let (ipx, nfproto) = family_words(&addr);
        let mappings: Vec<_> = p.mappings.iter().filter(|m| m.applies_to(v6)).collect();
        if mappings.is_empty() {
            continue;
        }
        let conditions = if v6 { &p.conditions_v6 } else { &p.conditions_v4 };
        let mut entry = format!("meta nfproto {nfproto}");
        for c in conditions.iter().filter(|c| !c.trim().is_empty()) {
            entry.push(' ');
            entry.push_str(c.trim());
        }
        let _ = write!(entry, " fib daddr type local jump {base}-dnat");
        rules.entry("pre").or_default().push(entry.clone());
        rules.entry("out").or_default().push(entry);
        let pod = addr.ip();
        for m in &mappings {
            let mut r = String::new();
            if let Some(h) = m.bound_ip() {
                let _ = write!(r, "{ipx} daddr {h} ");
            }
            let to = if v6 { format!("[{pod}]:{}", m.container_port) } else { format!("{pod}:{}", m.container_port) };
            let _ = write!(r, "{} dport {} dnat {ipx} to {to}", m.protocol, m.host_port);
            rules.entry("dnat").or_default().push(r);
            if p.snat {
                // Hairpin (a pod of the subnet reaching the mapped port) and IPv4 localhost need
                // masquerading, or the reply would bypass the DNAT. Only connections this
                // mapping DNATed are matched, never other traffic to the pod.
                let mut r = format!("ct status dnat {ipx} daddr {pod}");
                if !p.masq_all {
                    if v6 {
                        let _ = write!(r, " {ipx} saddr {}", subnet(&addr));
                    } else {
                        let _ = write!(r, " {ipx} saddr {{ {}, 127.0.0.1 }}", subnet(&addr));
                    }
                }
                let _ = write!(r, " meta l4proto {} ct original proto-dst {}", m.protocol, m.host_port);
                if let Some(h) = m.bound_ip() {
                    let _ = write!(r, " ct original {ipx} daddr {h}");
                }
                r.push_str(" masquerade");
                rules.entry("post").or_default().push(r);
            }
        }
    }
    rules
}

/// Lines that create the chains if missing and empty them if present. Unlike removal, this never
/// deletes anything the first time, and a transaction that deletes nothing skips the kernel's wait
/// for an RCU grace period (about 10 ms here): that is what keeps ADD fast.
fn reset_chains(out: &mut String, table: &str, chains: &[(String, Option<&str>)]) {
    let _ = writeln!(out, "add table {FAMILY} {table}");
    for (c, spec) in chains {
        match spec {
            Some(spec) => {
                let _ = writeln!(out, "add chain {FAMILY} {table} {c} {{ {spec} }}");
            }
            None => {
                let _ = writeln!(out, "add chain {FAMILY} {table} {c}");
            }
        }
    }
    for (c, _) in chains {
        let _ = writeln!(out, "flush chain {FAMILY} {table} {c}");
    }
}

/// The whole ADD batch for port mappings: the container's chains, emptied if they existed, then
/// filled anew. A chain that snat does not need stays empty; DEL removes all four.
pub(crate) fn portmap_add_batch(p: &PortMap) -> String {
    let base = chain_base(PORTMAP_PREFIX, &p.network, &p.container_id, &p.ifname);
    let mut out = String::new();
    let rules = portmap_rules(p, &base);
    if rules.is_empty() {
        remove_chains(&mut out, PORTMAP_TABLE, &portmap_chains(&p.network, &p.container_id, &p.ifname));
        return out;
    }
    let note = comment("portmap", &p.network, &p.container_id, &p.ifname);
    let dnat_spec = format!("comment \"{note}\";");
    reset_chains(
        &mut out,
        PORTMAP_TABLE,
        &[
            (format!("{base}-dnat"), Some(dnat_spec.as_str())),
            (format!("{base}-pre"), Some("type nat hook prerouting priority -100; policy accept;")),
            (format!("{base}-out"), Some("type nat hook output priority -100; policy accept;")),
            (format!("{base}-post"), Some("type nat hook postrouting priority 100; policy accept;")),
        ],
    );
    let t = format!("{FAMILY} {PORTMAP_TABLE}");
    // The jump target must exist before the jump: dnat first.
    for suffix in ["dnat", "pre", "out", "post"] {
        for r in rules.get(suffix).into_iter().flatten() {
            let _ = writeln!(out, "add rule {t} {base}-{suffix} {r}");
        }
    }
    out
}

pub(crate) fn portmap_del_batch(network: &str, container_id: &str, ifname: &str) -> String {
    let mut out = String::new();
    remove_chains(&mut out, PORTMAP_TABLE, &portmap_chains(network, container_id, ifname));
    out
}

fn masq_rules(m: &Masquerade) -> Vec<String> {
    m.addresses
        .iter()
        .map(|a| {
            let (ipx, _) = family_words(a);
            let multicast = if a.is_ipv6() { "ff00::/8" } else { "224.0.0.0/4" };
            format!("{ipx} saddr {} {ipx} daddr != {} {ipx} daddr != {multicast} masquerade", a.ip(), subnet(a))
        })
        .collect()
}

pub(crate) fn masq_add_batch(m: &Masquerade) -> String {
    let chain = chain_base(MASQ_PREFIX, &m.network, &m.container_id, &m.ifname);
    let mut out = String::new();
    let rules = masq_rules(m);
    if rules.is_empty() {
        remove_chains(&mut out, MASQ_TABLE, std::slice::from_ref(&chain));
        return out;
    }
    let note = comment("masquerade", &m.network, &m.container_id, &m.ifname);
    let spec = format!("type nat hook postrouting priority 100; policy accept; comment \"{note}\";");
    reset_chains(&mut out, MASQ_TABLE, &[(chain.clone(), Some(spec.as_str()))]);
    let t = format!("{FAMILY} {MASQ_TABLE}");
    for r in rules {
        let _ = writeln!(out, "add rule {t} {chain} {r}");
    }
    out
}

pub(crate) fn masq_del_batch(network: &str, container_id: &str, ifname: &str) -> String {
    let mut out = String::new();
    remove_chains(&mut out, MASQ_TABLE, &[chain_base(MASQ_PREFIX, network, container_id, ifname)]);
    out
}

/// MAC spoof check (bridge `macspoofchk`): frames from the pod's host port must carry the pod's MAC.
/// nftables only, as in the reference; one base chain per attachment in our own `bridge` table.
pub(crate) const MACSPOOF_TABLE: &str = "cni_rs_macspoof";
const MACSPOOF_PREFIX: &str = "ms";

fn nft_string(s: &str) -> String {
    s.chars().filter(|c| !matches!(c, '"' | '\\') && !c.is_control()).collect()
}

pub(crate) fn macspoof_add_batch(network: &str, container_id: &str, ifname: &str, port: &str, mac: &str) -> String {
    let chain = chain_base(MACSPOOF_PREFIX, network, container_id, ifname);
    let note = comment("macspoofchk", network, container_id, ifname);
    let t = format!("bridge {MACSPOOF_TABLE}");
    let mut out = String::new();
    let _ = writeln!(out, "add table {t}");
    let _ = writeln!(
        out,
        "add chain {t} {chain} {{ type filter hook prerouting priority -300; policy accept; comment \"{note}\"; }}"
    );
    let _ = writeln!(out, "flush chain {t} {chain}");
    let _ = writeln!(out, "add rule {t} {chain} iifname \"{}\" ether saddr != {} drop", nft_string(port), nft_string(mac));
    out
}

pub(crate) fn macspoof_del_batch(network: &str, container_id: &str, ifname: &str) -> String {
    let chain = chain_base(MACSPOOF_PREFIX, network, container_id, ifname);
    let t = format!("bridge {MACSPOOF_TABLE}");
    format!("add table {t}\nadd chain {t} {chain}\nflush chain {t} {chain}\ndelete chain {t} {chain}\n")
}

/// Drop frames entering the bridge from `port` (the pod's host veth) unless their source MAC is `mac`.
pub fn add_macspoof(network: &str, container_id: &str, ifname: &str, port: &str, mac: &str) -> Result<()> {
    apply(
        &macspoof_add_batch(network, container_id, ifname, port, mac),
        &format!("add MAC spoof check for container {container_id}"),
    )
}

/// Remove the spoof check of an attachment; absent is success.
pub fn del_macspoof(network: &str, container_id: &str, ifname: &str) -> Result<()> {
    apply(
        &macspoof_del_batch(network, container_id, ifname),
        &format!("delete MAC spoof check of container {container_id}"),
    )
}

/// The spoof check of an attachment exists with its rule.
pub fn check_macspoof(network: &str, container_id: &str, ifname: &str) -> Result<()> {
    let chain = chain_base(MACSPOOF_PREFIX, network, container_id, ifname);
    let out = run("nft", &["-j", "list", "table", "bridge", MACSPOOF_TABLE], None)?;
    let rules = if out.success { parse_table_listing(&out.stdout).unwrap_or_default() } else { BTreeMap::new() };
    match rules.get(&chain) {
        Some(1) => Ok(()),
        _ => Err(check_failed(format!("MAC spoof check of container {container_id}: chain {chain} missing or changed"))),
    }
}

/// Runs one batch atomically.
fn apply(batch: &str, what: &str) -> Result<()> {
    run_ok("nft", &["-f", "-"], Some(batch), what).map(|_| ())
}

/// Chain name → number of rules, for one of our tables; an absent table is empty.
fn list_table(table: &str) -> Result<BTreeMap<String, usize>> {
    let out = run("nft", &["-j", "list", "table", FAMILY, table], None)?;
    if !out.success {
        if out.stderr.contains("No such file or directory") {
            return Ok(BTreeMap::new());
        }
        return Err(Error::network(format!("list table {FAMILY} {table}: nft failed: {}", one_line(&out.stderr))));
    }
    parse_table_listing(&out.stdout)
        .map_err(|e| Error::network(format!("list table {FAMILY} {table}: unreadable nft JSON: {e}")))
}

pub(crate) fn parse_table_listing(json: &str) -> std::result::Result<BTreeMap<String, usize>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let items = v.get("nftables").and_then(Value::as_array).ok_or("no \"nftables\" array")?;
    let mut chains = BTreeMap::new();
    for item in items {
        if let Some(name) = item.get("chain").and_then(|c| c.get("name")).and_then(Value::as_str) {
            chains.entry(name.to_string()).or_insert(0);
        }
        if let Some(name) = item.get("rule").and_then(|r| r.get("chain")).and_then(Value::as_str) {
            *chains.entry(name.to_string()).or_insert(0) += 1;
        }
    }
    Ok(chains)
}

/// Checks that each expected chain exists with the expected number of rules.
fn check_chains(table: &str, expected: &[(String, usize)], what: &str) -> Result<()> {
    let present = list_table(table)?;
    for (chain, rules) in expected {
        match present.get(chain) {
            None => return Err(check_failed(format!("{what}: chain {chain} missing from table {FAMILY} {table}"))),
            Some(n) if n != rules => {
                return Err(check_failed(format!(
                    "{what}: chain {chain} in table {FAMILY} {table} has {n} rules, expected {rules}"
                )))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The chain bases of `prefix` in `table` that belong to `network` but to none of `keep`.
fn stale_bases(table: &str, prefix: &str, network: &str, keep: &[Attachment]) -> Result<BTreeSet<String>> {
    let kept: HashSet<String> = keep.iter().map(|a| chain_base(prefix, network, &a.container_id, &a.ifname)).collect();
    let ours = format!("{prefix}-{}-", network_hash(network));
    let mut stale = BTreeSet::new();
    for chain in list_table(table)?.into_keys() {
        let Some(rest) = chain.strip_prefix(&ours) else { continue };
        let id = rest.get(..16).unwrap_or(rest);
        let base = format!("{ours}{id}");
        if !kept.contains(&base) {
            stale.insert(base);
        }
    }
    Ok(stale)
}

impl Firewall for NftablesBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Nftables
    }

    fn add_masquerade(&self, m: &Masquerade) -> Result<()> {
        apply(&masq_add_batch(m), &format!("add masquerade for container {}", m.container_id))
    }

    fn del_masquerade(&self, network: &str, container_id: &str, ifname: &str) -> Result<()> {
        apply(&masq_del_batch(network, container_id, ifname), &format!("delete masquerade of container {container_id}"))
    }

    fn check_masquerade(&self, m: &Masquerade) -> Result<()> {
        let chain = chain_base(MASQ_PREFIX, &m.network, &m.container_id, &m.ifname);
        let what = format!("masquerade of container {}", m.container_id);
        check_chains(MASQ_TABLE, &[(chain, masq_rules(m).len())], &what)
    }

    fn gc_masquerade(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        let stale = stale_bases(MASQ_TABLE, MASQ_PREFIX, network, keep)?;
        if stale.is_empty() {
            return Ok(());
        }
        let mut batch = String::new();
        remove_chains(&mut batch, MASQ_TABLE, &stale.into_iter().collect::<Vec<_>>());
        apply(&batch, &format!("garbage-collect masquerade chains of network {network}"))
    }

    fn add_portmap(&self, p: &PortMap) -> Result<()> {
        apply(&portmap_add_batch(p), &format!("add port mappings for container {}", p.container_id))
    }

    fn del_portmap(&self, network: &str, container_id: &str, ifname: &str) -> Result<()> {
        apply(
            &portmap_del_batch(network, container_id, ifname),
            &format!("delete port mappings of container {container_id}"),
        )
    }

    fn check_portmap(&self, p: &PortMap) -> Result<()> {
        let base = chain_base(PORTMAP_PREFIX, &p.network, &p.container_id, &p.ifname);
        let expected: Vec<(String, usize)> = portmap_rules(p, &base)
            .into_iter()
            .map(|(suffix, rules)| (format!("{base}-{suffix}"), rules.len()))
            .collect();
        check_chains(PORTMAP_TABLE, &expected, &format!("port mappings of container {}", p.container_id))
    }

    fn gc_portmap(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        let stale = stale_bases(PORTMAP_TABLE, PORTMAP_PREFIX, network, keep)?;
        if stale.is_empty() {
            return Ok(());
        }
        let chains: Vec<String> =
            stale.iter().flat_map(|b| PORTMAP_SUFFIXES.iter().map(move |s| format!("{b}-{s}"))).collect();
        let mut batch = String::new();
        remove_chains(&mut batch, PORTMAP_TABLE, &chains);
        apply(&batch, &format!("garbage-collect port-mapping chains of network {network}"))
    }

    fn status(&self) -> Result<()> {
        let out = run("nft", &["list", "tables"], None)?;
        if out.success {
            Ok(())
        } else {
            Err(Error::new(code::NOT_AVAILABLE, format!("nftables is not usable here: {}", one_line(&out.stderr))))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::{PortMapping, Protocol};
    use super::*;

    fn pm() -> PortMap {
        PortMap {
            network: "net1".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            mappings: vec![
                PortMapping { host_port: 8080, container_port: 80, protocol: Protocol::Tcp, host_ip: None },
                PortMapping {
                    host_port: 5353,
                    container_port: 53,
                    protocol: Protocol::Udp,
                    host_ip: Some("192.168.1.1".parse().unwrap()),
                },
            ],
            ipv4: Some("10.22.0.5/16".parse().unwrap()),
            ipv6: Some("fd00:22::5/64".parse().unwrap()),
            snat: true,
            masq_all: false,
            mark_masq_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: vec!["ip saddr != 10.0.0.0/8".into()],
            conditions_v6: vec![],
        }
    }

    #[test]
    fn names_are_stable_and_scoped_by_network() {
        let a = chain_base("pm", "net1", "c1", "eth0");
        assert_eq!(a.len(), "pm-".len() + 8 + 1 + 16);
        assert_eq!(a, chain_base("pm", "net1", "c1", "eth0"));
        assert_ne!(a, chain_base("pm", "net1", "c1", "eth1"));
        assert_ne!(a[3..11], chain_base("pm", "net2", "c1", "eth0")[3..11]);
    }

    #[test]
    fn portmap_batch() {
        let b = portmap_add_batch(&pm());
        let base = chain_base("pm", "net1", "c1", "eth0");
        assert!(b.starts_with("add table inet cni_rs_portmap\n"));
        // ADD empties the chains instead of deleting them: a deletion costs an RCU grace period.
        assert!(!b.contains("delete"), "{b}");
        assert!(b.contains(&format!("flush chain inet cni_rs_portmap {base}-dnat\n")));
        assert!(b.contains(&format!(
            "add rule inet cni_rs_portmap {base}-pre meta nfproto ipv4 ip saddr != 10.0.0.0/8 fib daddr type local jump {base}-dnat\n"
        )));
        assert!(
            b.contains(&format!("add rule inet cni_rs_portmap {base}-dnat tcp dport 8080 dnat ip to 10.22.0.5:80\n"))
        );
        assert!(b.contains(&format!(
            "add rule inet cni_rs_portmap {base}-dnat ip daddr 192.168.1.1 udp dport 5353 dnat ip to 10.22.0.5:53\n"
        )));
        assert!(b.contains(&format!(
            "add rule inet cni_rs_portmap {base}-dnat tcp dport 8080 dnat ip6 to [fd00:22::5]:80\n"
        )));
        // The UDP mapping is bound to an IPv4 host address: no IPv6 rule for it.
        assert!(!b.contains("dnat ip6 to [fd00:22::5]:53"));
        assert!(b.contains(
            "ct status dnat ip daddr 10.22.0.5 ip saddr { 10.22.0.0/16, 127.0.0.1 } meta l4proto udp ct original proto-dst 5353 ct original ip daddr 192.168.1.1 masquerade"
        ));
        assert!(b.contains("ct status dnat ip6 daddr fd00:22::5 ip6 saddr fd00:22::/64 meta l4proto tcp"));
        let rules = portmap_rules(&pm(), &base);
        assert_eq!(rules["dnat"].len(), 3);
        assert_eq!(rules["pre"].len(), 2);
        assert_eq!(rules["post"].len(), 3);

        let no_snat = PortMap { snat: false, ..pm() };
        assert!(!portmap_add_batch(&no_snat).contains(&format!("add rule inet cni_rs_portmap {base}-post")));
        let all = PortMap { masq_all: true, ..pm() };
        assert!(!portmap_add_batch(&all).contains("ip saddr {"));
    }

    #[test]
    fn delete_is_by_name_only() {
        let d = portmap_del_batch("net1", "c1", "eth0");
        let base = chain_base("pm", "net1", "c1", "eth0");
        assert_eq!(d.lines().count(), 1 + 4 * 3);
        assert!(d.contains(&format!("flush chain inet cni_rs_portmap {base}-pre\n")));
        let flushes = d.find("flush").unwrap();
        let deletes = d.find("delete").unwrap();
        assert!(flushes < deletes);
    }

    #[test]
    fn masquerade_batch() {
        let m = Masquerade {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth\"0".into(),
            addresses: vec!["10.1.2.3/24".parse().unwrap(), "fd00::3/64".parse().unwrap()],
        };
        let b = masq_add_batch(&m);
        assert!(b.contains("ip saddr 10.1.2.3 ip daddr != 10.1.2.0/24 ip daddr != 224.0.0.0/4 masquerade"));
        assert!(b.contains("ip6 saddr fd00::3 ip6 daddr != fd00::/64 ip6 daddr != ff00::/8 masquerade"));
        assert!(b.contains("if=eth_0"));
        assert!(!b.contains("delete"), "{b}");
    }

    #[test]
    fn macspoof_batch() {
        let b = macspoof_add_batch("n", "c", "eth0", "veth1234abcd", "0a:58:0a:00:00:02");
        assert!(b.contains("type filter hook prerouting priority -300;"), "{b}");
        assert!(b.contains("iifname \"veth1234abcd\" ether saddr != 0a:58:0a:00:00:02 drop"), "{b}");
        assert!(!b.contains("delete"), "{b}");
        let d = macspoof_del_batch("n", "c", "eth0");
        assert!(d.ends_with(&format!("delete chain bridge cni_rs_macspoof {}\n", chain_base("ms", "n", "c", "eth0"))));
    }

    #[test]
    fn netlink_probe_agrees_with_nft() {
        // Only where nft itself can list (root, nf_tables present) is the answer known.
        let nft_lists = exec::find("nft").is_some() && run("nft", &["list", "tables"], None).is_ok_and(|o| o.success);
        if nft_lists {
            assert!(kernel_has_nf_tables());
        }
    }

    #[test]
    fn listing() {
        let json = r#"{"nftables":[{"metainfo":{}},{"table":{"name":"t"}},{"chain":{"name":"a"}},{"chain":{"name":"b"}},
            {"rule":{"chain":"a","expr":[]}},{"rule":{"chain":"a","expr":[]}}]}"#;
        let m = parse_table_listing(json).unwrap();
        assert_eq!(m["a"], 2);
        assert_eq!(m["b"], 0);
    }
}

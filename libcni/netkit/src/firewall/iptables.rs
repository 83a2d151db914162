//! The iptables backend, compatible with the reference plugins' chains, marks and comments.
//!
//! One kernel transport ([`transport`]) for what needs no process: the firewall plugin's FORWARD
//! rules ([`forward`]) and bridge's and ptp's masquerade ([`masq`]) are written in process, over
//! nf_tables netlink encoded as iptables-nft 1.8.9 encodes them where `iptables` is iptables-nft,
//! through the legacy tables' socket options ([`crate::firewall::xtables`]) where it is
//! iptables-legacy. Port mappings still run `iptables-save` and `iptables-restore` (see "Why port
//! mappings run iptables" below).
//!
//! Port mappings (nat table, per family):
//! ```text
//! PREROUTING, OUTPUT:  -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
//! CNI-HOSTPORT-DNAT:   -p tcp -m comment --comment "dnat name: \"<net>\" id: \"<cid>\"" -m multiport --dports 8080,8081 -j CNI-DN-<hash>
//! CNI-DN-<hash>:       -s <pod subnet> -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK   (hairpin)
//!                      -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK   (IPv4 localhost)
//!                      -p tcp -m tcp --dport 8080 -j DNAT --to-destination <pod>:80
//! CNI-HOSTPORT-SETMARK: -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
//! POSTROUTING (first): -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
//! CNI-HOSTPORT-MASQ:   -m mark --mark 0x2000/0x2000 -j MASQUERADE
//! ```
//! Masquerade: see [`masq`].
//!
//! Localhost hostPorts (filter table, IPv4): portmap turns `route_localnet` on, so the node drops
//! what reaches its loopback from elsewhere, with kube-proxy's rule (CVE-2020-8558), in a chain of
//! ours that INPUT jumps to first:
//! ```text
//! INPUT (first):  -j CNI-LOCALNET
//! CNI-LOCALNET:   ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections"
//!                 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
//! ```
//!
//! Hashes are the reference's: `CNI-` (or `CNI-DN-`) followed by sha512(network + container id) in
//! hex, cut to 28 characters. Every port-mapping operation reads the nat table once
//! (`iptables-save -t nat`) and applies its whole change with one `iptables-restore --noflush`.
//! Declaring a chain in a restore file flushes it, so shared chains are declared only when the
//! save shows them missing, and a lock file keeps our own read-modify-write cycles from
//! interleaving.
//!
//! # Why port mappings run iptables
//! In process, each of these rules would have to be encoded byte for byte as iptables 1.8.9
//! encodes it, twice (nf_tables expressions for iptables-nft, x_tables entries for
//! iptables-legacy), and decoded again from the kernel for the conflict check, which reads the
//! ports other containers' (also the reference's) `CNI-DN-` chains DNAT; the masquerade rules
//! needed only `-s`/`-d` with prefixes and negation, `comment` and the MASQUERADE target. What the
//! port-mapping rules add, by rule:
//! - PREROUTING and OUTPUT's jumps: the `addrtype` match (rev 1, `xt_addrtype_info_v1`).
//! - `CNI-HOSTPORT-DNAT`'s jumps: `-p tcp|udp|sctp` (NFTA_RULE_COMPAT's protocol and a `meta
//!   l4proto` compare for iptables-nft, the entry's protocol for legacy) and the `multiport` match
//!   (rev 1, `xt_multiport_v1`), plus `conditionsV4`/`conditionsV6`, which are free iptables
//!   arguments: any match iptables knows, which only iptables' own parser can turn into a rule.
//! - `CNI-DN-<hash>`: `-m tcp|udp --dport` (native payload compares for iptables-nft, `xt_tcp` /
//!   `xt_udp` for legacy), `-m sctp --dport` (`xt_sctp_info` for both), and the DNAT target (rev 2,
//!   `nf_nat_range2`, the address and port to translate to, IPv6 in brackets).
//! - `CNI-HOSTPORT-SETMARK`: the MARK target (rev 2, `xt_mark_tginfo2`); `CNI-HOSTPORT-MASQ`: the
//!   `mark` match (rev 1, `xt_mark_mtinfo1`).
//! - `CNI-LOCALNET` (filter table): `! -s` and the `conntrack` match (rev 3) with an inverted state
//!   set including DNAT.
//!
//! What it takes: each encoding for both flavours, checked as [`masq`]'s tests check theirs
//! (iptables writes the rule and we must read it back as we encode it; we write it and
//! `iptables-save` must print the reference's line and `iptables -C` find it), decoders of the
//! DNAT rules for the conflict check, and `iptables-restore` kept for mappings with conditions.
//! On the default backend (nftables) no port mapping runs a process unless it has conditions.

use super::exec::{one_line, run, run_ok};
use super::{check_failed, host_port_text, sha512_hex, BackendKind, Firewall, Masquerade, PortMap, PortMapping};
use crate::Family;
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{code, Error, Errors, Result};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};

const TOP_DNAT: &str = "CNI-HOSTPORT-DNAT";
const SETMARK: &str = "CNI-HOSTPORT-SETMARK";
const MARK_MASQ: &str = "CNI-HOSTPORT-MASQ";
const LOCALNET: &str = "CNI-LOCALNET";
/// The drop as iptables-save prints it.
const LOCALNET_RULE: &str = "-A CNI-LOCALNET ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP";
const LOCK_FILE: &str = "/run/cni-rs/iptables.lock";
const XTABLES_LOCK: &str = "/run/xtables.lock";
/// multiport takes at most 15 ports per rule.
const MULTIPORT_MAX: usize = 15;
const ATTEMPTS: usize = 3;

/// The iptables backend (stateless; every call runs iptables-save/-restore).
#[derive(Debug, Clone, Copy, Default)]
pub struct IptablesBackend;

/// `MustFormatChainNameWithPrefix`: "CNI-" + prefix + sha512(network + id) in hex, 28 characters.
pub(crate) fn chain_name(network: &str, container_id: &str, prefix: &str) -> String {
    let mut s = format!("CNI-{prefix}{}", sha512_hex(&format!("{network}{container_id}")));
    s.truncate(28);
    s
}

/// `FormatComment`: `name: "<net>" id: "<cid>"` (Go's %q; our names never need escapes).
pub(crate) fn masq_comment(network: &str, container_id: &str) -> String {
    format!("name: \"{network}\" id: \"{container_id}\"")
}

fn dnat_comment(network: &str, container_id: &str) -> String {
    let mut c = format!("dnat name: \"{network}\" id: \"{container_id}\"");
    if c.len() > 255 {
        c.truncate(253);
        c.push_str("...");
    }
    c
}

/// A token as iptables-save prints it: quoted (with `\"` escapes) when it holds blanks or quotes.
fn quote(token: &str) -> String {
    if !token.is_empty() && !token.chars().any(|c| c.is_whitespace() || c == '"' || c == '\\' || c == '\'') {
        return token.to_string();
    }
    let mut out = String::from("\"");
    for c in token.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `<ip>/32` or `<ip>/128`.
pub(crate) fn host(ip: IpAddr) -> String {
    format!("{ip}/{}", Family::of(&ip).bits())
}

pub(crate) fn subnet(a: &IpNetwork) -> String {
    format!("{}/{}", a.network(), a.prefix())
}

/// The nat table as `iptables-save -t nat` printed it.
#[derive(Debug, Default)]
pub(crate) struct NatTable {
    pub chains: BTreeSet<String>,
    /// `-A CHAIN ...` lines, in order.
    pub rules: Vec<String>,
}

impl NatTable {
    /// The chains and rules of `table` (`nat`, `filter`) in an iptables-save output.
    pub(crate) fn parse(save: &str, table: &str) -> NatTable {
        let mut t = NatTable::default();
        let mut in_nat = false;
        let head = format!("*{table}");
        for line in save.lines() {
            let line = line.trim_end();
            if line.starts_with('*') {
                in_nat = line == head;
            } else if !in_nat {
                continue;
            } else if let Some(decl) = line.strip_prefix(':') {
                if let Some(name) = decl.split_whitespace().next() {
                    t.chains.insert(name.to_string());
                }
            } else if line.starts_with("-A ") {
                t.rules.push(line.to_string());
            }
        }
        t
    }

    fn has_chain(&self, chain: &str) -> bool {
        self.chains.contains(chain)
    }

    fn has_rule(&self, line: &str) -> bool {
        self.rules.iter().any(|r| r == line)
    }

    /// Rules of `chain`.
    fn rules_of<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        let head = format!("-A {chain} ");
        self.rules.iter().filter(move |r| r.starts_with(&head))
    }

    /// Rules anywhere that jump to `target`.
    fn jumps_to<'a>(&'a self, target: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        let tail = format!(" -j {target}");
        self.rules.iter().filter(move |r| r.ends_with(&tail))
    }
}

/// Lines that delete every jump to `chain`.
fn unjump<'a>(t: &'a NatTable, chain: &'a str) -> impl Iterator<Item = String> + 'a {
    t.jumps_to(chain).map(|r| format!("-D {}", &r[3..]))
}

/// Lines that remove `chain` and every jump to it (nothing when neither is there).
fn remove_chain_lines(t: &NatTable, chain: &str, out: &mut Vec<String>) {
    out.extend(unjump(t, chain));
    if t.has_chain(chain) {
        out.push(format!("-F {chain}"));
        out.push(format!("-X {chain}"));
    }
}

fn restore_text(table: &str, lines: &[String]) -> String {
    let mut s = format!("*{table}\n");
    for l in lines {
        s.push_str(l);
        s.push('\n');
    }
    s.push_str("COMMIT\n");
    s
}

fn save_table(ipv: Family, table: &str) -> Result<NatTable> {
    let out = run_ok(&format!("{}-save", ipv.tool()), &["-t", table], None, &format!("read the {table} table"))?;
    Ok(NatTable::parse(&out, table))
}

fn restore(ipv: Family, table: &str, lines: &[String], what: &str) -> Result<()> {
    run_ok(&format!("{}-restore", ipv.tool()), &["--noflush", "-w"], Some(&restore_text(table, lines)), what)
        .map(|_| ())
}

/// Serializes our read-modify-write cycles with [`LOCK_FILE`] (the xtables lock covers one
/// process only), and our in-process writes with iptables' own with [`XTABLES_LOCK`] (what `-w`
/// takes). Without a writable /run we go on unlocked: the retry below still converges.
fn lock(path: &str) -> Option<nix::fcntl::Flock<File>> {
    let _ = std::path::Path::new(path).parent().map(std::fs::create_dir_all);
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).ok()?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).ok()
}

/// Whether the `iptables` on PATH (or in the system directories) is iptables-nft: it resolves to
/// `xtables-nft-multi` or `iptables-nft`. Found without running it; false when there is none.
pub(crate) fn nft_based() -> bool {
    #[cfg(test)]
    if tests::LEGACY.get() {
        return false;
    }
    super::exec::find("iptables").is_some_and(|p| resolves_to_nft(&p))
}

/// Whether `iptables` resolves (through its symlinks) to `xtables-nft-multi` or `iptables-nft`.
fn resolves_to_nft(iptables: &std::path::Path) -> bool {
    let target = std::fs::canonicalize(iptables).ok();
    let name = target.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    name.is_some_and(|n| n.starts_with("xtables-nft") || n.starts_with("iptables-nft"))
}

/// Reads the table and applies the lines `plan` derives from it; a failed restore (someone else
/// changed the table between the two) is retried from a fresh read.
fn transact(ipv: Family, what: &str, plan: impl Fn(&NatTable) -> Vec<String>) -> Result<()> {
    let _guard = lock(LOCK_FILE);
    apply(ipv, "nat", what, None, |t| Ok(plan(t)))
}

/// [`transact`]'s cycle for a caller that holds the lock, on `table` (`nat`, `filter`), starting
/// from `saved` when the caller has just read the table. An error from `plan` ends it.
fn apply(
    ipv: Family,
    table: &str,
    what: &str,
    mut saved: Option<NatTable>,
    plan: impl Fn(&NatTable) -> Result<Vec<String>>,
) -> Result<()> {
    let read = || saved.take().map_or_else(|| save_table(ipv, table), Ok);
    cycle(what, read, plan, |_, lines| restore(ipv, table, &lines, what), |_| true)
}

/// Reads a table, plans a change from it and writes the change (nothing when the plan is empty);
/// a write refused with an error `again` accepts (the table changed since it was read) is planned
/// again from a fresh read, up to [`ATTEMPTS`] times.
fn cycle<T, C>(
    what: &str,
    mut read: impl FnMut() -> Result<T>,
    plan: impl Fn(&T) -> Result<Vec<C>>,
    write: impl Fn(&T, Vec<C>) -> Result<()>,
    again: impl Fn(&Error) -> bool,
) -> Result<()> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let t = read().map_err(|e| e.context(what))?;
        let change = plan(&t)?;
        if change.is_empty() {
            return Ok(());
        }
        match write(&t, change) {
            Ok(()) => return Ok(()),
            Err(e) if again(&e) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::network(format!("{what}: failed"))))
}

/// Whether the family's nat table can be read at all (ip6tables may be absent or IPv6 disabled).
fn usable(ipv: Family) -> std::result::Result<(), Error> {
    let out = run(&format!("{}-save", ipv.tool()), &["-t", "nat"], None)?;
    if out.success {
        Ok(())
    } else {
        Err(Error::new(code::NOT_AVAILABLE, format!("{}-save -t nat failed: {}", ipv.tool(), one_line(&out.stderr))))
    }
}

/// Runs a teardown on both families, tolerating a family whose tools are unusable as long as one works.
fn both_families(mut f: impl FnMut(Family) -> Result<()>) -> Result<()> {
    let mut errs = Errors::new();
    let mut unusable = Vec::new();
    for ipv in [Family::V4, Family::V6] {
        if let Err(e) = usable(ipv) {
            unusable.push(e);
            continue;
        }
        errs.record(f(ipv));
    }
    if unusable.len() == 2 {
        for e in unusable {
            errs.push(e);
        }
    }
    errs.finish()
}

/// The per-container DNAT chain's rules and the entry rules into it, for one address.
pub(crate) struct DnatPlan {
    pub chain: String,
    pub rules: Vec<String>,
    pub entries: Vec<String>,
}

pub(crate) fn dnat_plan(p: &PortMap, addr: &IpNetwork) -> DnatPlan {
    let family = Family::of_net(addr);
    let chain = chain_name(&p.network, &p.container_id, "DN-");
    let mark_chain = p.external_set_mark_chain.clone().unwrap_or_else(|| SETMARK.to_string());
    let mappings: Vec<&PortMapping> = p.mappings.iter().filter(|m| m.applies_to(family)).collect();
    let mut rules = Vec::new();
    for m in &mappings {
        let dst = m.bound_ip().map(|h| format!(" -d {}", host(h))).unwrap_or_default();
        let ports = format!("-p {proto} -m {proto} --dport {}", m.host_port, proto = m.protocol);
        if p.snat {
            if p.masq_all {
                rules.push(format!("-A {chain}{dst} {ports} -j {mark_chain}"));
            } else {
                rules.push(format!("-A {chain} -s {}{dst} {ports} -j {mark_chain}", subnet(addr)));
                if family == Family::V4 {
                    rules.push(format!("-A {chain} -s 127.0.0.1/32{dst} {ports} -j {mark_chain}"));
                }
            }
        }
        // `10.0.0.5:80`, `[fd00::5]:80`.
        let to = SocketAddr::new(addr.ip(), m.container_port);
        rules.push(format!("-A {chain}{dst} {ports} -j DNAT --to-destination {to}"));
    }
    let mut by_proto: BTreeMap<&str, Vec<u16>> = BTreeMap::new();
    for m in &mappings {
        by_proto.entry(m.protocol.name()).or_default().push(m.host_port);
    }
    let conditions = family.pick(&p.conditions_v4, &p.conditions_v6);
    let conditions: String = conditions.iter().map(|c| format!(" {}", quote(c))).collect();
    let note = quote(&dnat_comment(&p.network, &p.container_id));
    let mut entries = Vec::new();
    for (proto, ports) in by_proto {
        for group in ports.chunks(MULTIPORT_MAX) {
            let list: Vec<String> = group.iter().map(u16::to_string).collect();
            entries.push(format!(
                "-A {TOP_DNAT} -p {proto} -m comment --comment {note} -m multiport --dports {}{conditions} -j {chain}",
                list.join(",")
            ));
        }
    }
    DnatPlan { chain, rules, entries }
}

fn mark_value(bit: u8) -> String {
    let v = 1u64 << bit;
    format!("{v:#x}/{v:#x}")
}

fn setmark_rule(bit: u8) -> String {
    format!("-A {SETMARK} -m comment --comment \"CNI portfwd masquerade mark\" -j MARK --set-xmark {}", mark_value(bit))
}

fn markmasq_rule(bit: u8) -> String {
    format!("-A {MARK_MASQ} -m mark --mark {} -j MASQUERADE", mark_value(bit))
}

const MARKMASQ_ENTRY: &str = "-m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ";
const DNAT_ENTRY: &str = "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT";

/// The restore lines of a portmap ADD for one address, given the table as it is.
pub(crate) fn portmap_add_lines(t: &NatTable, p: &PortMap, addr: &IpNetwork) -> Vec<String> {
    let plan = dnat_plan(p, addr);
    let mut decl = Vec::new();
    let mut lines = Vec::new();
    let shared_masq = p.snat && p.external_set_mark_chain.is_none();
    if shared_masq {
        for c in [SETMARK, MARK_MASQ] {
            if !t.has_chain(c) {
                decl.push(format!(":{c} - [0:0]"));
            }
        }
        let setmark = setmark_rule(p.mark_masq_bit);
        if !t.has_rule(&setmark) {
            lines.push(setmark);
        }
        let masq = markmasq_rule(p.mark_masq_bit);
        if !t.has_rule(&masq) {
            lines.push(masq);
        }
        if t.rules_of("POSTROUTING").all(|r| !r.ends_with(" -j CNI-HOSTPORT-MASQ")) {
            lines.push(format!("-I POSTROUTING 1 {MARKMASQ_ENTRY}"));
        }
    }
    if !t.has_chain(TOP_DNAT) {
        decl.push(format!(":{TOP_DNAT} - [0:0]"));
    }
    for entry_chain in ["PREROUTING", "OUTPUT"] {
        if t.rules_of(entry_chain).all(|r| !r.ends_with(" -j CNI-HOSTPORT-DNAT")) {
            lines.push(format!("-A {entry_chain} {DNAT_ENTRY}"));
        }
    }
    // Replace whatever the container had: drop the old jumps, and (re)declaring the chain flushes it.
    decl.push(format!(":{} - [0:0]", plan.chain));
    let mut all = decl;
    all.extend(unjump(t, &plan.chain));
    all.extend(lines);
    all.extend(plan.rules);
    all.extend(plan.entries);
    all
}

/// The filter-table lines that make INPUT drop packets to 127.0.0.0/8 from elsewhere that were
/// not DNATed (nothing when the table has them). Declaring the chain flushes it, so a chain
/// holding anything else than the drop is refilled. The jump goes first in INPUT, before any
/// ACCEPT, and is only checked for presence afterwards.
pub(crate) fn localnet_lines(t: &NatTable) -> Vec<String> {
    let mut out = Vec::new();
    if t.rules_of(LOCALNET).ne([LOCALNET_RULE]) {
        out.push(format!(":{LOCALNET} - [0:0]"));
        out.push(LOCALNET_RULE.to_string());
    }
    if !t.has_rule(&format!("-A INPUT -j {LOCALNET}")) {
        out.push(format!("-I INPUT 1 -j {LOCALNET}"));
    }
    out
}

/// The host port a `-j DNAT` rule of a per-container chain maps: (host address, protocol, port),
/// as ours and the reference's write it (`[-d <host>/32] -p <proto> -m <proto> --dport <port> -j
/// DNAT ...`).
fn dnat_port(rule: &str) -> Option<(Option<IpAddr>, String, u16)> {
    let tokens: Vec<&str> = rule.split_whitespace().collect();
    let after = |flag: &str| tokens.iter().position(|t| *t == flag).and_then(|i| tokens.get(i + 1)).copied();
    let host = match after("-d") {
        Some(d) => Some(d.split('/').next()?.parse::<IpAddr>().ok()?),
        None => None,
    };
    Some((host, after("-p")?.to_ascii_lowercase(), after("--dport")?.parse().ok()?))
}

/// A host port of `p` (for `addr`'s family) that another container maps, found in the DNAT
/// chains `CNI-HOSTPORT-DNAT` leads to (the reference's too): refused with code 100, naming the
/// port and, from the jump's comment, the container that holds it. The same (host address or
/// any, protocol, port) conflicts; a mapping bound to one host address and one on any address do
/// not, as on the nftables backend. One pass over the table's rules, whatever the pod count.
pub(crate) fn held_port(t: &NatTable, p: &PortMap, addr: &IpNetwork, what: &str) -> Result<()> {
    let family = Family::of_net(addr);
    let ours = chain_name(&p.network, &p.container_id, "DN-");
    let wanted: Vec<(Option<IpAddr>, String, u16)> = p
        .mappings
        .iter()
        .filter(|m| m.applies_to(family))
        .map(|m| (m.bound_ip(), m.protocol.name().to_string(), m.host_port))
        .collect();
    let live: HashSet<&str> = t
        .rules_of(TOP_DNAT)
        .filter_map(|r| r.rsplit_once(" -j ").map(|(_, c)| c.trim()))
        .filter(|c| *c != ours)
        .collect();
    for r in &t.rules {
        let Some(chain) = r.strip_prefix("-A ").and_then(|r| r.split_whitespace().next()) else { continue };
        if !live.contains(chain) || !r.contains(" -j DNAT ") {
            continue;
        }
        let Some((host, proto, port)) = dnat_port(r).filter(|held| wanted.contains(held)) else { continue };
        let port = host_port_text(host, &proto, port, family);
        let holder = t
            .jumps_to(chain)
            .find_map(|r| saved_comment(r).and_then(|(c, _)| parse_owner(&c)))
            .map(|(net, cid)| format!("container {cid:?} of network {net:?}"))
            .unwrap_or_else(|| format!("another container (chain {chain})"));
        return Err(Error::network(format!("{what}: {port} already mapped by {holder}")));
    }
    Ok(())
}

/// The restore lines that remove a container's port mappings (the DN chain and the old SN one).
fn portmap_del_lines(t: &NatTable, network: &str, container_id: &str) -> Vec<String> {
    let mut out = Vec::new();
    remove_chain_lines(t, &chain_name(network, container_id, "DN-"), &mut out);
    remove_chain_lines(t, &chain_name(network, container_id, "SN-"), &mut out);
    out
}

/// The `-m comment --comment <c>` match of a saved rule: `c` unescaped, and the match's byte
/// range in the rule (from the blank before `-m` to the end of `c`).
pub(crate) fn saved_comment(rule: &str) -> Option<(String, std::ops::Range<usize>)> {
    const FLAG: &str = " -m comment --comment ";
    let start = rule.find(FLAG)?;
    let body = &rule[start + FLAG.len()..];
    let Some(quoted) = body.strip_prefix('"') else {
        let word = body.split(' ').next().unwrap_or_default();
        return Some((word.to_string(), start..start + FLAG.len() + word.len()));
    };
    let mut text = String::new();
    let mut chars = quoted.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => text.extend(chars.next().map(|(_, c)| c)),
            '"' => return Some((text, start..start + FLAG.len() + i + 2)),
            c => text.push(c),
        }
    }
    None
}

/// (network, container id) from a `[dnat ]name: "<net>" id: "<cid>"` comment.
pub(crate) fn parse_owner(comment: &str) -> Option<(String, String)> {
    let rest = comment.strip_prefix("dnat ").unwrap_or(comment);
    let rest = rest.strip_prefix("name: \"")?;
    let (net, rest) = rest.split_once('"')?;
    let rest = rest.strip_prefix(" id: \"")?;
    let (cid, _) = rest.split_once('"')?;
    Some((net.to_string(), cid.to_string()))
}

/// Per-container DNAT chains of `network`'s containers not in `keep`.
pub(crate) fn stale_chains(t: &NatTable, network: &str, keep: &[Attachment]) -> BTreeSet<String> {
    let kept: HashSet<&str> = keep.iter().map(|a| a.container_id.as_str()).collect();
    let mut stale = BTreeSet::new();
    for r in &t.rules {
        let Some((net, cid)) = saved_comment(r).and_then(|(c, _)| parse_owner(&c)) else { continue };
        if net != network || kept.contains(cid.as_str()) {
            continue;
        }
        let chain = chain_name(network, &cid, "DN-");
        // Only chains whose name proves they are this container's.
        if t.has_chain(&chain) || t.jumps_to(&chain).next().is_some() {
            stale.insert(chain);
        }
    }
    stale
}

fn check_lines(t: &NatTable, wanted: &[String], what: &str) -> Result<()> {
    for w in wanted {
        if !t.has_rule(w) {
            return Err(check_failed(format!("{what}: rule missing from the nat table: {w}")));
        }
    }
    Ok(())
}

impl Firewall for IptablesBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Iptables
    }

    fn add_masquerade(&self, m: &Masquerade) -> Result<()> {
        masq::add(m)
    }

    fn del_masquerade(&self, network: &str, container_id: &str, _ifname: &str) -> Result<()> {
        // Like the reference, the chain is per (network, container): ifname plays no part.
        masq::del(network, container_id)
    }

    fn check_masquerade(&self, m: &Masquerade) -> Result<()> {
        masq::check(m)
    }

    fn gc_masquerade(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        masq::gc(network, keep)
    }

    fn add_portmap(&self, p: &PortMap) -> Result<()> {
        let what = format!("add port mappings for container {}", p.container_id);
        let _guard = lock(LOCK_FILE);
        // Every family is read and checked for a port another container holds before anything is
        // added, so a refused ADD adds nothing; each restore then checks again on what it applies to.
        let mut saved = Vec::new();
        for addr in p.targets() {
            let ipv = Family::of(&addr.ip());
            if !p.mappings.iter().any(|m| m.applies_to(ipv)) {
                continue;
            }
            let t = save_table(ipv, "nat").map_err(|e| e.context(&what))?;
            held_port(&t, p, &addr, &what)?;
            saved.push((ipv, addr, t));
        }
        if p.localnet() {
            let what = format!("{what}: drop packets to 127.0.0.0/8 from elsewhere");
            apply(Family::V4, "filter", &what, None, |t| Ok(localnet_lines(t)))?;
        }
        for (ipv, addr, t) in saved {
            apply(ipv, "nat", &what, Some(t), |t| {
                held_port(t, p, &addr, &what)?;
                Ok(portmap_add_lines(t, p, &addr))
            })?;
        }
        Ok(())
    }

    fn del_portmap(&self, network: &str, container_id: &str, _ifname: &str) -> Result<()> {
        let what = format!("delete port mappings of container {container_id}");
        both_families(|ipv| transact(ipv, &what, |t| portmap_del_lines(t, network, container_id)))
    }

    fn check_portmap(&self, p: &PortMap) -> Result<()> {
        let what = format!("port mappings of container {}", p.container_id);
        if p.localnet() && !localnet_lines(&save_table(Family::V4, "filter")?).is_empty() {
            return Err(check_failed(format!(
                "{what}: the filter table's {LOCALNET} chain (the drop of packets to 127.0.0.0/8 from elsewhere) or INPUT's jump to it is missing or changed"
            )));
        }
        for addr in p.targets() {
            let ipv = Family::of(&addr.ip());
            if !p.mappings.iter().any(|m| m.applies_to(ipv)) {
                continue;
            }
            let t = save_table(ipv, "nat")?;
            let plan = dnat_plan(p, &addr);
            if !t.has_chain(&plan.chain) {
                return Err(check_failed(format!("{what}: chain {} missing from the nat table", plan.chain)));
            }
            check_lines(&t, &plan.rules, &what)?;
            if t.rules_of(TOP_DNAT).filter(|r| r.ends_with(&format!(" -j {}", plan.chain))).count() < plan.entries.len()
            {
                return Err(check_failed(format!("{what}: no jump from {TOP_DNAT} to {}", plan.chain)));
            }
            for entry_chain in ["PREROUTING", "OUTPUT"] {
                if t.rules_of(entry_chain).all(|r| !r.ends_with(" -j CNI-HOSTPORT-DNAT")) {
                    return Err(check_failed(format!("{what}: no jump from {entry_chain} to {TOP_DNAT}")));
                }
            }
        }
        Ok(())
    }

    fn gc_portmap(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        gc_portmaps(network, keep, &format!("garbage-collect port-mapping chains of network {network}"))
    }

    /// In process: the kernel takes IPv4 nat rules the way this node's iptables writes them, and
    /// the tools port mappings run are there (found, not run).
    fn status(&self) -> Result<()> {
        let unusable = |why: String| Error::new(code::NOT_AVAILABLE, format!("iptables is not usable here: {why}"));
        masq::usable(Family::V4).map_err(|e| unusable(e.msg))?;
        for tool in ["iptables-save", "iptables-restore"] {
            if super::exec::find(tool).is_none() {
                return Err(unusable(format!("{tool} is not installed")));
            }
        }
        Ok(())
    }
}

/// Removes the port-mapping chains of every container of `network` not in `keep`.
fn gc_portmaps(network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    both_families(|ipv| {
        transact(ipv, what, |t| {
            let mut out = Vec::new();
            for chain in stale_chains(t, network, keep) {
                remove_chain_lines(t, &chain, &mut out);
            }
            out
        })
    })
}

pub(crate) mod forward;
pub(crate) mod masq;
pub(crate) mod transport;

#[cfg(test)]
mod tests;

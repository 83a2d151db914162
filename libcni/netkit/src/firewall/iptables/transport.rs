//! One transport for the iptables backend's in-process rules (the firewall plugin's FORWARD rules
//! in [`super::forward`], masquerade in [`super::masq`]): a rule in the shapes iptables takes
//! ([`XRule`]), encoded as iptables 1.8.9 encodes it for each flavour, a table as read ([`View`]:
//! the chains listed over nf_tables netlink, or the legacy table), the changes planned from it
//! ([`Op`]) and [`transact`], which reads, plans and writes under the xtables lock, again from a
//! fresh read when the table changed in between.
//!
//! Where `iptables` is iptables-nft ([`super::nft_based`]): each rule encoded as iptables-nft
//! 1.8.9 encodes it (payload, bitwise for a prefix off a byte boundary, and cmp for `-s`/`-d`,
//! meta and cmp of the name and its NUL for `-i`/`-o`, the xtables `comment` and `conntrack`
//! (rev 3) matches, a counter, the verdict or the `MASQUERADE` target, and NFTA_RULE_COMPAT) into
//! the `ip`/`ip6` `filter` or `nat` table iptables-nft uses, creating the table and its builtin
//! chain (FORWARD: hook forward, priority 0; POSTROUTING: hook postrouting, priority 100, type
//! nat; policy accept) as iptables-nft does when they are missing. An operation lists the chains
//! it touches and sends its change as one batch tied to the ruleset generation it read (a
//! concurrent change makes the kernel refuse it), on one netlink socket. A rule is found by
//! comparing expressions, as `iptables -C`/`-D` find it, and deleted by handle.
//!
//! Where it is iptables-legacy: the family's x_tables table read from the kernel
//! ([`crate::firewall::xtables`], the socket options libiptc uses), its chains changed and the
//! table written back whole with the counters of the rules it kept, each rule encoded as
//! iptables-legacy 1.8.9 encodes it, so `iptables -C`/`-D` find ours and we theirs.

use super::forward::FORWARD;
use super::{cycle, lock, quote, subnet, Family};
use crate::firewall::nfnl::{self, BaseChain, Batch, ChainType, CmpOp, Conn, Expr, Hook, TableFamily, Verdict};
use crate::firewall::xtables;
use ipnetwork::IpNetwork;
use libcni::{Error, Result};
use std::collections::BTreeMap;

/// `IPT_INV_VIA_OUT`, `IPT_INV_DSTIP` (the same bits for IPv6).
const IPT_INV_VIA_OUT: u8 = 0x02;
const IPT_INV_DSTIP: u8 = 0x10;
const POSTROUTING: &str = "POSTROUTING";

/// One rule of the layout, in the shapes iptables takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct XRule {
    pub chain: String,
    /// `-i <name>`.
    pub iif: Option<String>,
    /// `-o <name>`, or `! -o <name>` when negated.
    pub oif: Option<(String, bool)>,
    /// `-s <net>`, `-d <net>` (a host as <ip>/32 or /128); `! -d <net>` when `not_dst`.
    pub src: Option<IpNetwork>,
    pub dst: Option<IpNetwork>,
    pub not_dst: bool,
    /// `-m conntrack --ctstate RELATED,ESTABLISHED`.
    pub related: bool,
    /// `-m comment --comment <text>`.
    pub comment: Option<String>,
    /// `-j <target>`: ACCEPT, DROP, RETURN, MASQUERADE or a chain.
    pub target: String,
}

impl XRule {
    /// The rule as iptables-save prints it after `-A <chain> `.
    pub(crate) fn text(&self) -> String {
        let mut s: Vec<String> = Vec::new();
        s.extend(self.src.map(|net| format!("-s {}", subnet(&net))));
        s.extend(self.dst.map(|net| format!("{}-d {}", if self.not_dst { "! " } else { "" }, subnet(&net))));
        s.extend(self.iif.as_ref().map(|i| format!("-i {i}")));
        s.extend(self.oif.as_ref().map(|(o, not)| format!("{}-o {o}", if *not { "! " } else { "" })));
        s.extend(self.comment.as_ref().map(|c| format!("-m comment --comment {}", quote(c))));
        if self.related {
            s.push("-m conntrack --ctstate RELATED,ESTABLISHED".into());
        }
        s.push(format!("-j {}", self.target));
        s.join(" ")
    }

    /// The rule's expressions as iptables-nft writes them into a table of `family`.
    pub(crate) fn nft(&self, family: TableFamily) -> nfnl::Rule {
        let r = self.iif.iter().fold(nfnl::Rule::new(family), |r, i| r.ifname(false, i, CmpOp::Eq));
        let r = self.oif.iter().fold(r, |r, (o, not)| r.ifname(true, o, if *not { CmpOp::Neq } else { CmpOp::Eq }));
        let r = self.src.into_iter().fold(r, |r, net| r.addr_prefix(true, net, CmpOp::Eq));
        let dst_op = if self.not_dst { CmpOp::Neq } else { CmpOp::Eq };
        let r = self.dst.into_iter().fold(r, |r, net| r.addr_prefix(false, net, dst_op));
        let comment = |c: &String| Expr::Match { name: "comment", rev: 0, info: comment_info(c) };
        let r = self.comment.iter().map(comment).fold(r, nfnl::Rule::expr);
        let r = if self.related { r.expr(Expr::Match { name: "conntrack", rev: 3, info: related_info() }) } else { r };
        let verdict = match self.target.as_str() {
            "ACCEPT" => Verdict::Accept,
            "DROP" => Verdict::Drop,
            "RETURN" => Verdict::Return,
            MASQUERADE => {
                // iptables-nft writes into `ip` and `ip6` tables only.
                let info = masquerade_info(if family == TableFamily::Ip6 { Family::V6 } else { Family::V4 });
                return r.expr(Expr::Counter).expr(Expr::Target { name: MASQUERADE, rev: 0, info });
            }
            chain => Verdict::Jump(chain.into()),
        };
        r.expr(Expr::Counter).verdict(verdict)
    }

    /// The rule as iptables-legacy 1.8.9 writes it into the kernel's table of `family`: an
    /// address with its prefix's mask, an interface name with a mask over the name and its NUL,
    /// `! -o` as IPT_INV_VIA_OUT, `! -d` as IPT_INV_DSTIP, the comment (rev 0) and conntrack
    /// (rev 3) matches, and a standard target or MASQUERADE (rev 0).
    pub(crate) fn legacy(&self, family: Family) -> xtables::Rule {
        let (len, ifaces) = family.pick((4, 16), (16, 64));
        let mut ip = vec![0u8; family.ip_len()];
        for (i, net) in [self.src, self.dst].into_iter().enumerate() {
            let Some(net) = net else { continue };
            ip[i * len..(i + 1) * len].copy_from_slice(&nfnl::ip_bytes(net.network()));
            ip[(i + 2) * len..(i + 3) * len].copy_from_slice(&nfnl::ip_bytes(net.mask()));
        }
        for (i, name) in [self.iif.as_ref(), self.oif.as_ref().map(|(o, _)| o)].into_iter().enumerate() {
            let Some(name) = name.map(|n| &n.as_bytes()[..n.len().min(15)]) else { continue };
            let at = ifaces + 16 * i;
            ip[at..at + name.len()].copy_from_slice(name);
            ip[at + 32..at + 33 + name.len()].fill(0xff);
        }
        let invflags = family.ip_len() - family.pick(1, 4);
        if self.oif.as_ref().is_some_and(|(_, not)| *not) {
            ip[invflags] |= IPT_INV_VIA_OUT;
        }
        if self.not_dst {
            ip[invflags] |= IPT_INV_DSTIP;
        }
        let mut matches =
            self.comment.as_ref().map(|c| xtables::entry_match("comment", 0, &comment_info(c))).unwrap_or_default();
        if self.related {
            matches.extend(xtables::entry_match("conntrack", 3, &related_info()));
        }
        let target = match self.target.as_str() {
            "ACCEPT" => xtables::Target::Verdict(xtables::ACCEPT),
            "DROP" => xtables::Target::Verdict(xtables::DROP),
            "RETURN" => xtables::Target::Verdict(xtables::RETURN),
            MASQUERADE => xtables::Target::Other(xtables::entry_target(MASQUERADE, 0, &masquerade_info(family))),
            chain => xtables::Target::Jump(chain.into()),
        };
        xtables::Rule::new(family, &ip, &matches, target)
    }
}

const MASQUERADE: &str = "MASQUERADE";

/// MASQUERADE rev 0's struct as iptables 1.8.9 fills it, padded to XT_ALIGN: for IPv4
/// `nf_nat_ipv4_multi_range_compat` with rangesize 1 and an empty range (24 bytes), for IPv6
/// an empty `nf_nat_range` (40 bytes).
fn masquerade_info(family: Family) -> Vec<u8> {
    if family == Family::V6 {
        return vec![0; 40];
    }
    let mut info = vec![0; 24];
    info[..4].copy_from_slice(&1u32.to_ne_bytes());
    info
}

/// `struct xt_comment_info`: the text in 256 bytes, NUL padded.
fn comment_info(c: &str) -> Vec<u8> {
    c.bytes().take(255).chain(std::iter::repeat(0)).take(256).collect()
}

/// `struct xt_conntrack_mtinfo3` (168 bytes) of `--ctstate RELATED,ESTABLISHED`: match_flags
/// XT_CONNTRACK_STATE at 146, state_mask RELATED|ESTABLISHED at 150 (host byte order).
fn related_info() -> Vec<u8> {
    let mut info = vec![0u8; 168];
    info[146..148].copy_from_slice(&1u16.to_ne_bytes());
    info[150..152].copy_from_slice(&6u16.to_ne_bytes());
    info
}

/// A change to a family's filter or nat table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// `-N <chain>`; for a builtin chain (FORWARD, POSTROUTING: iptables-nft without it yet) the
    /// table and base chain, as iptables-nft creates them.
    Chain(String),
    /// `-F <chain>`.
    Flush(String),
    /// `-F <chain>` and `-X <chain>`.
    DropChain(String),
    /// `-D` of every rule of the table that jumps to `<chain>`, whatever else it matches.
    Unjump(String),
    /// `-I <chain> 1 <rule>`.
    Insert(XRule),
    /// `-A <chain> <rule>`.
    Append(XRule),
    /// `-D <chain> <rule>`.
    Delete(XRule),
}

/// A family's filter or nat table as read: the legacy table, or the chains listed over netlink.
pub(crate) trait View {
    fn has_chain(&self, chain: &str) -> bool;
    fn has(&self, r: &XRule) -> bool;
    /// Each rule of `chain` (of every chain read when None): its chain, its `-m comment` text
    /// and the chain it jumps to, if any.
    fn rules_of(&self, chain: Option<&str>) -> Vec<(String, Option<String>, Option<String>)>;
}

impl View for xtables::Table {
    fn has_chain(&self, chain: &str) -> bool {
        self.chain(chain).is_some()
    }
    fn has(&self, r: &XRule) -> bool {
        let want = r.legacy(self.family);
        self.chain(&r.chain).is_some_and(|c| c.rules.iter().any(|x| x.same(&want)))
    }
    fn rules_of(&self, chain: Option<&str>) -> Vec<(String, Option<String>, Option<String>)> {
        let comment = |r: &xtables::Rule| r.match_data(self.family, "comment").map(text_of);
        let jump = |r: &xtables::Rule| match &r.target {
            xtables::Target::Jump(c) => Some(c.clone()),
            _ => None,
        };
        let chains = self.chains.iter().filter(|c| chain.is_none_or(|n| c.name == n));
        chains.flat_map(|c| c.rules.iter().map(|r| (c.name.clone(), comment(r), jump(r)))).collect()
    }
}

/// A NUL-terminated text in a fixed-size struct.
fn text_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or_default()).into_owned()
}

/// `t` with `ops` applied at chain level (what the kernel is then given whole).
pub(crate) fn changed(t: &xtables::Table, ops: &[Op]) -> Result<xtables::Table> {
    let mut t = t.clone();
    for op in ops {
        let r = match op {
            Op::Chain(c) => {
                // A builtin chain is always there.
                t.add_chain(c);
                continue;
            }
            Op::Flush(c) => {
                t.chain_mut(c).iter_mut().for_each(|c| c.rules.clear());
                continue;
            }
            Op::DropChain(c) => {
                t.chains.retain(|x| x.hook.is_some() || x.name != *c);
                continue;
            }
            Op::Unjump(c) => {
                let jump = xtables::Target::Jump(c.clone());
                t.chains.iter_mut().for_each(|x| x.rules.retain(|r| r.target != jump));
                continue;
            }
            Op::Insert(r) | Op::Append(r) | Op::Delete(r) => r,
        };
        let rule = r.legacy(t.family);
        let family = t.family;
        let Some(chain) = t.chain_mut(&r.chain) else {
            return Err(Error::network(format!(
                "chain {} is missing from the {} {} table",
                r.chain,
                family.tool(),
                t.name
            )));
        };
        match op {
            Op::Insert(_) => chain.rules.insert(0, rule),
            Op::Append(_) => chain.rules.push(rule),
            _ => {
                if let Some(at) = chain.rules.iter().position(|x| x.same(&rule)) {
                    chain.rules.remove(at);
                }
            }
        }
    }
    Ok(t)
}

/// Chains of an `ip`/`ip6` `filter` or `nat` table listed over netlink, at one ruleset generation.
pub(crate) struct Listed {
    pub family: TableFamily,
    pub table: &'static str,
    pub generation: u32,
    pub chains: BTreeMap<String, nfnl::ChainListing>,
}

/// A builtin chain as iptables-nft 1.8.9 creates it: FORWARD of the filter table (hook forward,
/// priority 0), POSTROUTING of the nat table (hook postrouting, priority 100, type nat), policy
/// accept.
fn builtin(table: &str, chain: &str) -> Option<BaseChain> {
    match (table, chain) {
        ("filter", FORWARD) => {
            Some(BaseChain { hook: Hook::Forward, priority: 0, kind: ChainType::Filter, policy_accept: true })
        }
        ("nat", POSTROUTING) => {
            Some(BaseChain { hook: Hook::Postrouting, priority: 100, kind: ChainType::Nat, policy_accept: true })
        }
        _ => None,
    }
}

impl Listed {
    pub(crate) fn read(nl: &Conn, ipv: Family, table: &'static str, chains: &[&str]) -> Result<Listed> {
        let family = ipv.pick(TableFamily::Ip, TableFamily::Ip6);
        let generation = nl.generation()?;
        let mut listed = Listed { family, table, generation, chains: BTreeMap::new() };
        for c in chains {
            if let Some(l) = nl.list_chain(family, table, c)? {
                listed.chains.insert(c.to_string(), l);
            }
        }
        Ok(listed)
    }

    fn handle(&self, r: &XRule) -> Option<u64> {
        let want = r.nft(self.family).encoded();
        self.chains.get(&r.chain)?.rules.iter().find(|(_, e)| *e == want).map(|(h, _)| *h)
    }

    /// The batch that applies `ops`, tied to the generation read.
    pub(crate) fn batch(&self, ops: &[Op]) -> Batch {
        let mut b = Batch::new();
        b.genid = Some(self.generation);
        let (family, table) = (self.family, self.table);
        for op in ops {
            match op {
                Op::Chain(c) => match builtin(table, c) {
                    Some(base) => {
                        b.add_table(family, table);
                        b.add_chain(family, table, c, Some(base), None);
                    }
                    None => b.add_chain(family, table, c, None, None),
                },
                Op::Flush(c) => b.flush_chain(family, table, c),
                Op::DropChain(c) => {
                    b.flush_chain(family, table, c);
                    b.delete_chain(family, table, c);
                }
                Op::Unjump(target) => {
                    for (chain, listing) in &self.chains {
                        for (handle, _) in
                            listing.rules.iter().filter(|(_, e)| nfnl::rule_jump(e) == Some(target.clone()))
                        {
                            b.delete_rule((family, table, chain), *handle);
                        }
                    }
                }
                Op::Insert(r) | Op::Append(r) => {
                    b.add_xt_rule((family, table, &r.chain), &r.nft(family), matches!(op, Op::Append(_)))
                }
                Op::Delete(r) => b.delete_rule((family, table, &r.chain), self.handle(r).unwrap_or(0)),
            }
        }
        b
    }
}

impl View for Listed {
    fn has_chain(&self, chain: &str) -> bool {
        self.chains.contains_key(chain)
    }
    fn has(&self, r: &XRule) -> bool {
        self.handle(r).is_some()
    }
    fn rules_of(&self, chain: Option<&str>) -> Vec<(String, Option<String>, Option<String>)> {
        let chains = self.chains.iter().filter(|(c, _)| chain.is_none_or(|n| *c == n));
        chains
            .flat_map(|(c, l)| l.rules.iter().map(|(_, e)| (c.clone(), nfnl::rule_xt_comment(e), nfnl::rule_jump(e))))
            .collect()
    }
}

/// Reads the family's `table` (`filter`, `nat`; over netlink only `chains` of it), plans with
/// `plan` and applies it, under the xtables lock: over netlink where iptables is iptables-nft,
/// else by replacing the legacy table; again from a fresh read when the table changed in between.
pub(crate) fn transact(
    ipv: Family,
    table: &'static str,
    chains: &[&str],
    what: &str,
    plan: impl Fn(&dyn View) -> Vec<Op>,
) -> Result<()> {
    let _guard = lock(super::XTABLES_LOCK);
    if !super::nft_based() {
        let read = || xtables::Table::read(ipv, table);
        let write = |t: &xtables::Table, ops: Vec<Op>| changed(t, &ops)?.replace().map_err(|e| e.context(what));
        return cycle(what, read, |t| Ok(plan(t)), write, |e| e.errno == Some(libc::EAGAIN));
    }
    // One socket for the listings, the generation and the batch, every attempt.
    let nl = Conn::new();
    let write = |l: &Listed, ops: Vec<Op>| nl.send(&l.batch(&ops)).map_err(|e| e.context(what));
    cycle(
        what,
        || Listed::read(&nl, ipv, table, chains),
        |l| Ok(plan(l)),
        write,
        |e| e.errno == Some(nfnl::GENERATION_CHANGED),
    )
}

//! The firewall plugin's iptables rules, in the reference plugin's layout (filter table, per family):
//! ```text
//! FORWARD (first):        -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
//! CNI-FORWARD (first):    -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN
//! CNI-FORWARD, per IP:    -d <ip>/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
//!                         -s <ip>/32 -j ACCEPT                          (/128 for IPv6)
//! ```
//! `CNI-ADMIN` (or the configured admin chain) is created empty and left to the administrator.
//! `ingressPolicy` same-bridge / isolated adds, per bridge, before `CNI-FORWARD`:
//! ```text
//! FORWARD (first):        -m comment --comment C -j CNI-ISOLATION-STAGE-1
//! CNI-ISOLATION-STAGE-1:  [isolated] -i <br> -o <br> -m comment --comment C -j DROP
//!                         -i <br> ! -o <br> -m comment --comment C -j CNI-ISOLATION-STAGE-2
//!                         ...                                        (other bridges)
//!                         -m comment --comment C -j RETURN
//! CNI-ISOLATION-STAGE-2:  -o <br> -m comment --comment C -j DROP
//!                         -m comment --comment C -j RETURN
//! ```
//! With same-bridge every comment C is `CNI firewall plugin rules (ingressPolicy: same-bridge)`,
//! as the reference 1.1.1 writes; with isolated (newer upstream only) the per-bridge rules say
//! `isolated` and the shared ones `same-bridge|isolated`, as upstream writes them. A rule that is
//! already there with another of these comments counts as present, so a node whose rules were
//! written by either upstream version gets no duplicates.
//!
//! The per-IP rules carry no owner (the reference's shape), so DEL removes the rules of the
//! addresses it is given; the shared chains and the isolation rules stay (other pods use them).
//!
//! Where `iptables` is iptables-nft ([`super::nft_based`]), the rules are written over nf_tables
//! netlink in process, each encoded as iptables-nft 1.8.9 encodes it (payload + cmp for `-s`/`-d`,
//! meta + cmp of the name and its NUL for `-i`/`-o`, the xtables `comment` and `conntrack` (rev 3)
//! matches, a counter, the verdict, and NFTA_RULE_COMPAT), into the `ip`/`ip6 filter` tables
//! iptables-nft uses, creating the table and the FORWARD base chain (hook forward, priority 0,
//! policy accept) as iptables-nft does when they are missing. Every operation lists the chains it
//! touches and sends its change as one batch tied to the ruleset generation it read (a concurrent
//! change makes the kernel refuse it, and it is read and planned again), under the xtables lock.
//! A rule is found by comparing expressions, as `iptables -C`/`-D` find it, and deleted by handle.
//! Where `iptables` is iptables-legacy, each operation reads the family's filter table once
//! (`iptables-save -t filter`) and applies its change with one `iptables-restore --noflush`.

use super::{apply, host, lock, quote, Ipv, NatTable};
use crate::firewall::check_failed;
use crate::firewall::nfnl::{self, BaseChain, Batch, ChainType, CmpOp, Expr, Family, Hook, Verdict};
use libcni::{Errors, Result};
use std::collections::BTreeMap;
use std::net::IpAddr;

const FORWARD: &str = "FORWARD";
const PRIV_CHAIN: &str = "CNI-FORWARD";
const STAGE1: &str = "CNI-ISOLATION-STAGE-1";
const STAGE2: &str = "CNI-ISOLATION-STAGE-2";
const PRIV_COMMENT: &str = "CNI firewall plugin rules";
const ADMIN_COMMENT: &str = "CNI firewall plugin admin overrides";
const SAME_BRIDGE: &str = "CNI firewall plugin rules (ingressPolicy: same-bridge)";
const ISOLATED: &str = "CNI firewall plugin rules (ingressPolicy: isolated)";
const SHARED_ISOLATED: &str = "CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)";
/// The reference's default admin chain.
pub const DEFAULT_ADMIN_CHAIN: &str = "CNI-ADMIN";
const ATTEMPTS: usize = 3;

/// How traffic into a bridge's pods from elsewhere is treated (`ingressPolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    /// The bridge the pod is attached to (prevResult's first interface).
    pub bridge: String,
    /// `isolated`: pods on the same bridge cannot reach each other either.
    pub isolated: bool,
}

/// One pod's forwarding rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardRules {
    /// The admin override chain (`iptablesAdminChainName`, default `CNI-ADMIN`).
    pub admin_chain: String,
    /// The pod's addresses (every IP of prevResult).
    pub addresses: Vec<IpAddr>,
    /// `ingressPolicy` same-bridge or isolated; None for open.
    pub isolation: Option<Isolation>,
}

/// One rule of the layout, in the shapes iptables takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct XRule {
    pub chain: String,
    /// `-i <name>`.
    pub iif: Option<String>,
    /// `-o <name>`, or `! -o <name>` when negated.
    pub oif: Option<(String, bool)>,
    /// `-s <ip>/32`, `-d <ip>/32` (/128 for IPv6).
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    /// `-m conntrack --ctstate RELATED,ESTABLISHED`.
    pub related: bool,
    /// `-m comment --comment <text>`.
    pub comment: Option<String>,
    /// `-j <target>`: ACCEPT, DROP, RETURN or a chain.
    pub target: String,
}

fn rule(chain: &str, comment: Option<&str>, target: &str) -> XRule {
    XRule { chain: chain.into(), comment: comment.map(Into::into), target: target.into(), ..XRule::default() }
}

impl XRule {
    /// The rule as iptables-save prints it after `-A <chain> `.
    pub(crate) fn text(&self) -> String {
        let mut s: Vec<String> = Vec::new();
        s.extend(self.src.map(|ip| format!("-s {}", host(ip))));
        s.extend(self.dst.map(|ip| format!("-d {}", host(ip))));
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
    pub(crate) fn nft(&self, family: Family) -> nfnl::Rule {
        let mut r = nfnl::Rule::new(family);
        if let Some(i) = &self.iif {
            r = r.ifname(false, i, CmpOp::Eq);
        }
        if let Some((o, not)) = &self.oif {
            r = r.ifname(true, o, if *not { CmpOp::Neq } else { CmpOp::Eq });
        }
        if let Some(ip) = self.src {
            r = r.saddr(ip);
        }
        if let Some(ip) = self.dst {
            r = r.daddr(ip);
        }
        if let Some(c) = &self.comment {
            // struct xt_comment_info: the text in 256 bytes, NUL padded.
            let mut info = vec![0u8; 256];
            info[..c.len().min(255)].copy_from_slice(&c.as_bytes()[..c.len().min(255)]);
            r = r.expr(Expr::Match { name: "comment", rev: 0, info });
        }
        if self.related {
            // struct xt_conntrack_mtinfo3 (168 bytes): match_flags XT_CONNTRACK_STATE at 146,
            // state_mask RELATED|ESTABLISHED at 150.
            let mut info = vec![0u8; 168];
            info[146..148].copy_from_slice(&1u16.to_ne_bytes());
            info[150..152].copy_from_slice(&6u16.to_ne_bytes());
            r = r.expr(Expr::Match { name: "conntrack", rev: 3, info });
        }
        let verdict = match self.target.as_str() {
            "ACCEPT" => Verdict::Accept,
            "DROP" => Verdict::Drop,
            "RETURN" => Verdict::Return,
            chain => Verdict::Jump(chain.into()),
        };
        r.expr(Expr::Counter).verdict(verdict)
    }
}

/// A change to a family's filter table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// `-N <chain>`; for FORWARD (iptables-nft without it yet) the table and base chain.
    Chain(String),
    /// `-I <chain> 1 <rule>`.
    Insert(XRule),
    /// `-A <chain> <rule>`.
    Append(XRule),
    /// `-D <chain> <rule>`.
    Delete(XRule),
}

impl Op {
    /// The op as an iptables-restore line.
    pub(crate) fn line(&self) -> String {
        match self {
            Op::Chain(c) => format!("-N {c}"),
            Op::Insert(r) => format!("-I {} 1 {}", r.chain, r.text()),
            Op::Append(r) => format!("-A {} {}", r.chain, r.text()),
            Op::Delete(r) => format!("-D {} {}", r.chain, r.text()),
        }
    }
}

/// A family's filter table as read: iptables-save's text, or the chains listed over netlink.
pub(crate) trait View {
    fn has_chain(&self, chain: &str) -> bool;
    fn has(&self, r: &XRule) -> bool;
    /// `r` with any of the isolation comments either upstream version writes.
    fn has_like(&self, r: &XRule) -> bool {
        [SAME_BRIDGE, ISOLATED, SHARED_ISOLATED].iter().any(|c| self.has(&XRule { comment: Some(c.to_string()), ..r.clone() }))
    }
}

impl View for NatTable {
    fn has_chain(&self, chain: &str) -> bool {
        NatTable::has_chain(self, chain)
    }
    fn has(&self, r: &XRule) -> bool {
        self.has_rule(&format!("-A {} {}", r.chain, r.text()))
    }
}

/// Chains of an `ip`/`ip6 filter` table listed over netlink, at one ruleset generation.
pub(crate) struct Listed {
    pub family: Family,
    pub generation: u32,
    pub chains: BTreeMap<String, nfnl::ChainListing>,
}

impl Listed {
    fn read(family: Family, chains: &[&str]) -> Result<Listed> {
        let generation = nfnl::generation()?;
        let mut listed = Listed { family, generation, chains: BTreeMap::new() };
        for c in chains {
            if let Some(l) = nfnl::list_chain(family, "filter", c)? {
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
        b.at_generation(self.generation);
        for op in ops {
            match op {
                Op::Chain(c) if c == FORWARD => {
                    b.add_table(self.family, "filter");
                    let base = BaseChain { hook: Hook::Forward, priority: 0, kind: ChainType::Filter, policy_accept: true };
                    b.add_chain(self.family, "filter", FORWARD, Some(base), None);
                }
                Op::Chain(c) => b.add_chain(self.family, "filter", c, None, None),
                Op::Insert(r) | Op::Append(r) => {
                    b.add_xt_rule((self.family, "filter", &r.chain), &r.nft(self.family), matches!(op, Op::Append(_)))
                }
                Op::Delete(r) => b.delete_rule((self.family, "filter", &r.chain), self.handle(r).unwrap_or(0)),
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
}

fn family(ipv: Ipv) -> Family {
    match ipv {
        Ipv::V4 => Family::Ip,
        Ipv::V6 => Family::Ip6,
    }
}

/// Reads the family's table, plans with `plan` and applies it: over netlink where iptables is
/// iptables-nft (again from a fresh read when the ruleset changed in between), else with
/// iptables-save/-restore.
fn transact(ipv: Ipv, chains: &[&str], what: &str, plan: impl Fn(&dyn View) -> Vec<Op>) -> Result<()> {
    if !super::nft_based() {
        let _guard = lock();
        return apply(ipv, "filter", what, None, |t| Ok(plan(t).iter().map(Op::line).collect()));
    }
    let _guard = super::xtables_lock();
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let listed = Listed::read(family(ipv), chains).map_err(|e| e.context(what))?;
        let ops = plan(&listed);
        if ops.is_empty() {
            return Ok(());
        }
        match listed.batch(&ops).send() {
            Ok(()) => return Ok(()),
            Err(e) if e.errno == Some(nfnl::GENERATION_CHANGED) => last = Some(e),
            Err(e) => return Err(e.context(what)),
        }
    }
    Err(last.map_or_else(|| libcni::Error::network(what), |e| e.context(what)))
}

fn priv_rule() -> XRule {
    rule(FORWARD, Some(PRIV_COMMENT), PRIV_CHAIN)
}

fn admin_rule(admin: &str) -> XRule {
    rule(PRIV_CHAIN, Some(ADMIN_COMMENT), admin)
}

/// The two per-IP rules.
fn pod_rules(ip: &IpAddr) -> [XRule; 2] {
    let related = XRule { dst: Some(*ip), related: true, ..rule(PRIV_CHAIN, None, "ACCEPT") };
    [related, XRule { src: Some(*ip), ..rule(PRIV_CHAIN, None, "ACCEPT") }]
}

fn of_family(addresses: &[IpAddr], ipv: Ipv) -> Vec<&IpAddr> {
    addresses.iter().filter(|ip| Ipv::of(ip) == ipv).collect()
}

/// What adds `r`'s rules for `ipv` to the table `t` shows (nothing already there).
pub(crate) fn add_ops(t: &dyn View, r: &ForwardRules, ipv: Ipv) -> Vec<Op> {
    let mut out = Vec::new();
    let ips = of_family(&r.addresses, ipv);
    if ips.is_empty() {
        return out;
    }
    for chain in [FORWARD, PRIV_CHAIN, r.admin_chain.as_str()] {
        if !t.has_chain(chain) {
            out.push(Op::Chain(chain.to_string()));
        }
    }
    if !t.has(&priv_rule()) {
        out.push(Op::Insert(priv_rule()));
    }
    if !t.has(&admin_rule(&r.admin_chain)) {
        out.push(Op::Insert(admin_rule(&r.admin_chain)));
    }
    for ip in &ips {
        for rule in pod_rules(ip) {
            if !t.has(&rule) && !out.contains(&Op::Append(rule.clone())) {
                out.push(Op::Append(rule));
            }
        }
    }
    if let Some(iso) = &r.isolation {
        isolation_ops(t, iso, &mut out);
    }
    out
}

fn isolation_ops(t: &dyn View, iso: &Isolation, out: &mut Vec<Op>) {
    let br = &iso.bridge;
    let (pc, sc) = if iso.isolated { (ISOLATED, SHARED_ISOLATED) } else { (SAME_BRIDGE, SAME_BRIDGE) };
    for chain in [STAGE1, STAGE2] {
        if !t.has_chain(chain) {
            out.push(Op::Chain(chain.to_string()));
        }
    }
    // The jump to stage 1 goes first in FORWARD, before the jump to CNI-FORWARD.
    let bridge = |chain, oif: Option<(String, bool)>, comment, target| XRule {
        iif: (chain == STAGE1).then(|| br.clone()),
        oif,
        ..rule(chain, Some(comment), target)
    };
    let mut first = vec![rule(FORWARD, Some(sc), STAGE1), bridge(STAGE1, Some((br.clone(), true)), pc, STAGE2)];
    if iso.isolated {
        first.push(bridge(STAGE1, Some((br.clone(), false)), pc, "DROP"));
    }
    first.push(bridge(STAGE2, Some((br.clone(), false)), sc, "DROP"));
    out.extend(first.into_iter().filter(|r| !t.has_like(r)).map(Op::Insert));
    for chain in [STAGE1, STAGE2] {
        if !t.has_like(&rule(chain, Some(sc), "RETURN")) {
            out.push(Op::Append(rule(chain, Some(sc), "RETURN")));
        }
    }
}

/// What removes the per-IP rules of `addresses` for `ipv` that are there.
pub(crate) fn del_ops(t: &dyn View, addresses: &[IpAddr], ipv: Ipv) -> Vec<Op> {
    let mut out = Vec::new();
    for rule in of_family(addresses, ipv).into_iter().flat_map(pod_rules) {
        if t.has(&rule) && !out.contains(&Op::Delete(rule.clone())) {
            out.push(Op::Delete(rule));
        }
    }
    out
}

/// The first rule of `r` for `ipv` the table lacks (CHECK), as an error naming it.
pub(crate) fn check_table(t: &dyn View, r: &ForwardRules, ipv: Ipv) -> Result<()> {
    let ips = of_family(&r.addresses, ipv);
    if ips.is_empty() {
        return Ok(());
    }
    let family = match ipv {
        Ipv::V4 => "iptables",
        Ipv::V6 => "ip6tables",
    };
    for chain in [PRIV_CHAIN, r.admin_chain.as_str()] {
        if !t.has_chain(chain) {
            return Err(check_failed(format!("firewall: chain {chain} is missing from the {family} filter table")));
        }
    }
    let mut wanted = vec![priv_rule(), admin_rule(&r.admin_chain)];
    wanted.extend(ips.into_iter().flat_map(pod_rules));
    match wanted.iter().find(|w| !t.has(w)) {
        Some(m) => Err(check_failed(format!(
            "firewall: rule missing from the {family} filter table: -A {} {}",
            m.chain,
            m.text()
        ))),
        None => Ok(()),
    }
}

fn families(addresses: &[IpAddr]) -> Vec<Ipv> {
    [Ipv::V4, Ipv::V6].into_iter().filter(|v| addresses.iter().any(|ip| Ipv::of(ip) == *v)).collect()
}

/// The chains an operation reads.
fn chains(admin: &str) -> [&str; 5] {
    [FORWARD, PRIV_CHAIN, admin, STAGE1, STAGE2]
}

/// Adds `r`'s rules; a family that fails leaves the pod's rules of the families done before removed.
pub fn add(r: &ForwardRules) -> Result<()> {
    let what = "firewall: add the pod's forwarding rules";
    let mut done = Vec::new();
    for ipv in families(&r.addresses) {
        if let Err(e) = transact(ipv, &chains(&r.admin_chain), what, |t| add_ops(t, r, ipv)) {
            for undo in done {
                let _ = transact(undo, &[PRIV_CHAIN], what, |t| del_ops(t, &r.addresses, undo));
            }
            return Err(e);
        }
        done.push(ipv);
    }
    Ok(())
}

/// Removes the per-IP rules of `addresses`; what is not there is success.
pub fn del(addresses: &[IpAddr]) -> Result<()> {
    let mut errs = Errors::new();
    for ipv in families(addresses) {
        let what = "firewall: delete the pod's forwarding rules";
        errs.record(transact(ipv, &[PRIV_CHAIN], what, |t| del_ops(t, addresses, ipv)));
    }
    errs.finish()
}

/// Code 103 naming the first of `r`'s rules (chains, jumps, per-IP rules) that is missing.
pub fn check(r: &ForwardRules) -> Result<()> {
    for ipv in families(&r.addresses) {
        if super::nft_based() {
            check_table(&Listed::read(family(ipv), &chains(&r.admin_chain))?, r, ipv)?;
        } else {
            check_table(&super::save_table(ipv, "filter")?, r, ipv)?;
        }
    }
    Ok(())
}

/// Ok when the rules can be written: the kernel answers nf_tables where iptables is
/// iptables-nft, the iptables tools are installed otherwise (code 50 naming what is missing).
pub fn status() -> Result<()> {
    if super::nft_based() {
        return match nfnl::kernel_answers() {
            true => Ok(()),
            false => Err(libcni::Error::new(
                libcni::code::NOT_AVAILABLE,
                "firewall: iptables is iptables-nft but the kernel does not answer nf_tables requests",
            )),
        };
    }
    for tool in ["iptables-save", "iptables-restore", "ip6tables-save", "ip6tables-restore"] {
        if super::super::exec::find(tool).is_none() {
            return Err(libcni::Error::new(
                libcni::code::NOT_AVAILABLE,
                format!("firewall: {tool} not found in PATH or the system directories"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn rules(ips: &[&str], iso: Option<(&str, bool)>) -> ForwardRules {
        ForwardRules {
            admin_chain: DEFAULT_ADMIN_CHAIN.to_string(),
            addresses: ips.iter().map(|s| s.parse().unwrap()).collect(),
            isolation: iso.map(|(b, i)| Isolation { bridge: b.to_string(), isolated: i }),
        }
    }

    fn lines(ops: Vec<Op>) -> Vec<String> {
        ops.iter().map(Op::line).collect()
    }

    #[test]
    fn empty_table_gets_the_reference_layout() {
        let t = NatTable::parse("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\nCOMMIT\n", "filter");
        let added = lines(add_ops(&t, &rules(&["10.1.0.2", "fd00::2"], Some(("br0", false))), Ipv::V4));
        assert_eq!(
            added,
            vec![
                "-N CNI-FORWARD",
                "-N CNI-ADMIN",
                "-I FORWARD 1 -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD",
                "-I CNI-FORWARD 1 -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN",
                "-A CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-A CNI-FORWARD -s 10.1.0.2/32 -j ACCEPT",
                "-N CNI-ISOLATION-STAGE-1",
                "-N CNI-ISOLATION-STAGE-2",
                "-I FORWARD 1 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-1",
                "-I CNI-ISOLATION-STAGE-1 1 -i br0 ! -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-2",
                "-I CNI-ISOLATION-STAGE-2 1 -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j DROP",
                "-A CNI-ISOLATION-STAGE-1 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j RETURN",
                "-A CNI-ISOLATION-STAGE-2 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j RETURN",
            ]
        );
        let v6 = lines(add_ops(&t, &rules(&["10.1.0.2", "fd00::2"], None), Ipv::V6));
        assert!(v6.contains(&"-A CNI-FORWARD -s fd00::2/128 -j ACCEPT".to_string()), "{v6:?}");
        assert!(add_ops(&t, &rules(&["10.1.0.2"], None), Ipv::V6).is_empty());
    }

    #[test]
    fn present_rules_are_not_added_again_whatever_their_upstream_comment() {
        let save = "*filter\n:FORWARD DROP [0:0]\n:CNI-FORWARD - [0:0]\n:CNI-ADMIN - [0:0]\n\
            :CNI-ISOLATION-STAGE-1 - [0:0]\n:CNI-ISOLATION-STAGE-2 - [0:0]\n\
            -A FORWARD -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j CNI-ISOLATION-STAGE-1\n\
            -A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD\n\
            -A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN\n\
            -A CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
            -A CNI-FORWARD -s 10.1.0.2/32 -j ACCEPT\n\
            -A CNI-ISOLATION-STAGE-1 -i br0 ! -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-2\n\
            -A CNI-ISOLATION-STAGE-1 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j RETURN\n\
            -A CNI-ISOLATION-STAGE-2 -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j DROP\n\
            -A CNI-ISOLATION-STAGE-2 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j RETURN\nCOMMIT\n";
        let t = NatTable::parse(save, "filter");
        assert!(add_ops(&t, &rules(&["10.1.0.2"], Some(("br0", false))), Ipv::V4).is_empty());
        assert!(check_table(&t, &rules(&["10.1.0.2"], None), Ipv::V4).is_ok());
        let err = check_table(&t, &rules(&["10.1.0.3"], None), Ipv::V4).unwrap_err();
        assert_eq!(err.code, libcni::code::CHECK_FAILED);
        assert!(err.msg.contains("-d 10.1.0.3/32 -m conntrack"), "{}", err.msg);
        // A second bridge gets its own stage rules, first in each chain.
        let other = lines(add_ops(&t, &rules(&["10.2.0.2"], Some(("br1", false))), Ipv::V4));
        assert!(other.iter().any(|l| l.starts_with("-I CNI-ISOLATION-STAGE-1 1 -i br1 ! -o br1 ")), "{other:?}");
        assert!(other.iter().any(|l| l.starts_with("-I CNI-ISOLATION-STAGE-2 1 -o br1 ")), "{other:?}");
        assert!(!other.iter().any(|l| l.contains("RETURN") || l.starts_with("-I FORWARD")), "{other:?}");
        assert_eq!(
            lines(del_ops(&t, &["10.1.0.2".parse().unwrap(), "10.9.9.9".parse().unwrap()], Ipv::V4)),
            vec![
                "-D CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-D CNI-FORWARD -s 10.1.0.2/32 -j ACCEPT"
            ]
        );
    }

    /// The messages iptables-nft 1.8.9 sent for each rule shape (iptables-nft-1.8.9.txt).
    fn captured() -> BTreeMap<String, (u16, u16, Vec<u8>)> {
        let hex = |h: &str| (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect();
        let num = |s: &str| u16::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        include_str!("iptables-nft-1.8.9.txt")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[0].to_string(), (num(f[1]) & 0xff, num(f[2]), hex(f[3])))
            })
            .collect()
    }

    /// The NEWRULE and base NEWCHAIN messages of an ADD into empty tables, named by shape.
    fn ours(family: Family, r: &ForwardRules, ipv: Ipv, names: &[&str]) -> Vec<(String, (u16, u16, Vec<u8>))> {
        let empty = Listed { family, generation: 0, chains: BTreeMap::new() };
        let msgs = empty.batch(&add_ops(&empty, r, ipv)).messages();
        // NFT_MSG_NEWCHAIN with a hook (the base chain) and NFT_MSG_NEWRULE, as iptables sends them.
        let wanted = msgs.into_iter().filter(|(ty, _, a)| *ty == 6 || (*ty == 3 && a.len() > 40));
        names.iter().zip(wanted).map(|(n, (ty, flags, a))| (n.to_string(), (ty, flags | 1, a))).collect()
    }

    #[test]
    fn rules_encode_byte_for_byte_as_iptables_nft_1_8_9_writes_them() {
        let cap = captured();
        let same = rules(&["10.1.0.2", "fd00::2"], Some(("cni-br0", false)));
        let mut got = ours(Family::Ip, &same, Ipv::V4, &[
            "forward_base", "forward_jump", "admin_jump", "v4_related", "v4_source", "stage1_jump",
            "stage1_bridge", "stage2_bridge", "", "stage_return",
        ]);
        got.extend(ours(Family::Ip6, &same, Ipv::V6, &["", "", "", "v6_related", "v6_source"]));
        let isolated = rules(&["10.1.0.2"], Some(("cni-br0", true)));
        got.extend(ours(Family::Ip, &isolated, Ipv::V4, &["", "", "", "", "", "", "", "stage1_isolated"]));
        let got: BTreeMap<_, _> = got.into_iter().filter(|(n, _)| !n.is_empty()).collect();
        assert_eq!(got.len(), cap.len());
        for (name, want) in &cap {
            let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
            let mine = &got[name];
            assert_eq!((mine.0, mine.1, hex(&mine.2)), (want.0, want.1, hex(&want.2)), "{name}");
        }
    }
}

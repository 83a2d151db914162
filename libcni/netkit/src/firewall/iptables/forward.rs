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
//! The rules go into the `ip`/`ip6 filter` tables in process, on the backend's transport
//! ([`super::transport`]): over nf_tables netlink where `iptables` is iptables-nft (the table and
//! the FORWARD base chain created as iptables-nft creates them when missing), into the legacy
//! filter table through its socket options where it is iptables-legacy; each rule encoded as
//! iptables 1.8.9 encodes it, so iptables' own `-C`/`-D` find ours and we theirs.

use super::transport::{transact, Listed, Op, View, XRule};
use super::Family;
use crate::firewall::check_failed;
use crate::firewall::nfnl::{self, Conn};
use crate::firewall::xtables;
use ipnetwork::IpNetwork;
use libcni::{Errors, Result};
use std::net::IpAddr;

pub(crate) const FORWARD: &str = "FORWARD";
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
/// The chains the plugin fills itself: an admin chain by one of these names would mix the
/// administrator's rules with ours (and CNI-FORWARD would jump to itself).
pub const PLUGIN_CHAINS: [&str; 3] = [PRIV_CHAIN, STAGE1, STAGE2];

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

fn rule(chain: &str, comment: Option<&str>, target: &str) -> XRule {
    XRule { chain: chain.into(), comment: comment.map(Into::into), target: target.into(), ..XRule::default() }
}

/// Whether `t` has `r` with any of the isolation comments either upstream version writes.
fn has_like(t: &dyn View, r: &XRule) -> bool {
    [SAME_BRIDGE, ISOLATED, SHARED_ISOLATED].iter().any(|c| t.has(&XRule { comment: Some(c.to_string()), ..r.clone() }))
}

fn priv_rule() -> XRule {
    rule(FORWARD, Some(PRIV_COMMENT), PRIV_CHAIN)
}

fn admin_rule(admin: &str) -> XRule {
    rule(PRIV_CHAIN, Some(ADMIN_COMMENT), admin)
}

/// The two per-IP rules.
fn pod_rules(ip: &IpAddr) -> [XRule; 2] {
    let host = Some(IpNetwork::from(*ip));
    let related = XRule { dst: host, related: true, ..rule(PRIV_CHAIN, None, "ACCEPT") };
    [related, XRule { src: host, ..rule(PRIV_CHAIN, None, "ACCEPT") }]
}

fn of_family(addresses: &[IpAddr], ipv: Family) -> Vec<&IpAddr> {
    addresses.iter().filter(|ip| Family::of(ip) == ipv).collect()
}

/// What adds `r`'s rules for `ipv` to the table `t` shows (nothing already there).
pub(crate) fn add_ops(t: &dyn View, r: &ForwardRules, ipv: Family) -> Vec<Op> {
    let mut out = Vec::new();
    let ips = of_family(&r.addresses, ipv);
    if ips.is_empty() {
        return out;
    }
    out.extend(
        [FORWARD, PRIV_CHAIN, &r.admin_chain].into_iter().filter(|c| !t.has_chain(c)).map(|c| Op::Chain(c.into())),
    );
    out.extend([priv_rule(), admin_rule(&r.admin_chain)].into_iter().filter(|x| !t.has(x)).map(Op::Insert));
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
    out.extend([STAGE1, STAGE2].into_iter().filter(|c| !t.has_chain(c)).map(|c| Op::Chain(c.into())));
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
    out.extend(first.into_iter().filter(|r| !has_like(t, r)).map(Op::Insert));
    for chain in [STAGE1, STAGE2] {
        if !has_like(t, &rule(chain, Some(sc), "RETURN")) {
            out.push(Op::Append(rule(chain, Some(sc), "RETURN")));
        }
    }
}

/// What removes the per-IP rules of `addresses` for `ipv` that are there.
pub(crate) fn del_ops(t: &dyn View, addresses: &[IpAddr], ipv: Family) -> Vec<Op> {
    let mut out = Vec::new();
    for rule in of_family(addresses, ipv).into_iter().flat_map(pod_rules) {
        if t.has(&rule) && !out.contains(&Op::Delete(rule.clone())) {
            out.push(Op::Delete(rule));
        }
    }
    out
}

/// The first rule of `r` for `ipv` the table lacks (CHECK), as an error naming it.
pub(crate) fn check_table(t: &dyn View, r: &ForwardRules, ipv: Family) -> Result<()> {
    let ips = of_family(&r.addresses, ipv);
    if ips.is_empty() {
        return Ok(());
    }
    let family = ipv.pick("iptables", "ip6tables");
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

fn families(addresses: &[IpAddr]) -> Vec<Family> {
    [Family::V4, Family::V6].into_iter().filter(|v| addresses.iter().any(|ip| Family::of(ip) == *v)).collect()
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
        if let Err(e) = transact(ipv, "filter", &chains(&r.admin_chain), what, |t| add_ops(t, r, ipv)) {
            for undo in done {
                let _ = transact(undo, "filter", &[PRIV_CHAIN], what, |t| del_ops(t, &r.addresses, undo));
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
        errs.record(transact(ipv, "filter", &[PRIV_CHAIN], what, |t| del_ops(t, addresses, ipv)));
    }
    errs.finish()
}

/// Code 103 naming the first of `r`'s rules (chains, jumps, per-IP rules) that is missing.
pub fn check(r: &ForwardRules) -> Result<()> {
    for ipv in families(&r.addresses) {
        if super::nft_based() {
            check_table(&Listed::read(&Conn::new(), ipv, "filter", &chains(&r.admin_chain))?, r, ipv)?;
        } else {
            check_table(&xtables::Table::read(ipv, "filter")?, r, ipv)?;
        }
    }
    Ok(())
}

/// Ok when the rules can be written: the kernel answers nf_tables where iptables is
/// iptables-nft, and has the legacy filter table otherwise (code 50 naming what is missing).
pub fn status() -> Result<()> {
    if super::nft_based() {
        let nft = |e: libcni::Error| format!("firewall: iptables is iptables-nft, but nf_tables: {}", e.msg);
        return nfnl::generation().map(|_| ()).map_err(|e| libcni::Error::new(libcni::code::NOT_AVAILABLE, nft(e)));
    }
    xtables::Table::available(Family::V4, "filter").map_err(|e| e.context("firewall: iptables is iptables-legacy"))
}

#[cfg(test)]
pub(crate) mod tests;

//! Masquerade (bridge's and ptp's `ipMasq`) on the iptables backend, in the reference's layout
//! (nat table, per family the pod has an address in):
//! ```text
//! POSTROUTING:   -s <pod>/32 -m comment --comment C -j CNI-<hash>          (/128 for IPv6)
//! CNI-<hash>:    -d <pod subnet> -m comment --comment C -j ACCEPT          (per address)
//!                ! -d 224.0.0.0/4 -m comment --comment C -j MASQUERADE     (ff00::/8 for IPv6)
//! ```
//! C is `name: "<net>" id: "<cid>"` and the hash the reference's ([`super::chain_name`]).
//!
//! Written in process on the transport the firewall plugin's FORWARD rules use
//! ([`super::transport`]): over
//! nf_tables netlink, each rule encoded as iptables-nft 1.8.9 encodes it (payload, bitwise for a
//! prefix off a byte boundary, cmp; the `comment` match; a counter; the `MASQUERADE` rev 0 target
//! or the jump; NFTA_RULE_COMPAT), creating the `ip`/`ip6 nat` table and its POSTROUTING base
//! chain as iptables-nft does when they are missing; or, on an iptables-legacy node, into the
//! legacy nat table through x_tables socket options, as iptables-legacy 1.8.9 encodes it. Either
//! way `iptables-save` prints the reference's lines and the reference's own DEL (`iptables -D`,
//! `-F`, `-X`) removes ours, and ours the reference's: a jump is found by the chain it leads to,
//! whatever else the rule matches.
//!
//! ADD replaces what the container had (the chain flushed or created, old jumps removed, the
//! rules appended) in one transaction per family; DEL removes the jumps and the chain; GC removes
//! those of the network's containers not kept, found from the comments of POSTROUTING's jumps.

use super::transport::{transact, Listed, Op, View, XRule};
use super::{chain_name, masq_comment, parse_owner, Family};
use crate::firewall::{check_failed, nfnl, xtables, Masquerade};
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{code, Error, Errors, Result};
use std::collections::{BTreeSet, HashSet};

const POSTROUTING: &str = "POSTROUTING";

fn rule(chain: &str, comment: &str, target: &str) -> XRule {
    XRule { chain: chain.into(), comment: Some(comment.into()), target: target.into(), ..XRule::default() }
}

/// The container chain's rules and POSTROUTING's jumps to it, for `ipv`'s addresses.
pub(crate) fn rules(m: &Masquerade, ipv: Family) -> (Vec<XRule>, Vec<XRule>) {
    let chain = chain_name(&m.network, &m.container_id, "");
    let note = masq_comment(&m.network, &m.container_id);
    let (mut own, mut entries) = (Vec::new(), Vec::new());
    for a in m.addresses.iter().filter(|a| Family::of(&a.ip()) == ipv) {
        let net = IpNetwork::new(a.network(), a.prefix()).unwrap_or(*a);
        let accept = XRule { dst: Some(net), ..rule(&chain, &note, "ACCEPT") };
        if !own.contains(&accept) {
            own.push(accept);
        }
        let entry = XRule { src: Some(IpNetwork::from(a.ip())), ..rule(POSTROUTING, &note, &chain) };
        if !entries.contains(&entry) {
            entries.push(entry);
        }
    }
    let multicast = ipv.pick("224.0.0.0/4", "ff00::/8").parse().ok();
    own.push(XRule { dst: multicast, not_dst: true, ..rule(&chain, &note, "MASQUERADE") });
    (own, entries)
}

/// Whether a rule of the table read jumps to `chain`.
fn jumped_to(t: &dyn View, chain: &str) -> bool {
    t.rules_of(None).iter().any(|(_, _, jump)| jump.as_deref() == Some(chain))
}

/// What makes `t` hold exactly `m`'s rules for `ipv`: the chain flushed (or created), every jump
/// to it removed, the rules and jumps appended.
pub(crate) fn add_ops(t: &dyn View, m: &Masquerade, ipv: Family) -> Vec<Op> {
    let chain = chain_name(&m.network, &m.container_id, "");
    let mut out = Vec::new();
    if !t.has_chain(POSTROUTING) {
        out.push(Op::Chain(POSTROUTING.into()));
    }
    out.push(if t.has_chain(&chain) { Op::Flush(chain.clone()) } else { Op::Chain(chain.clone()) });
    if jumped_to(t, &chain) {
        out.push(Op::Unjump(chain));
    }
    let (own, entries) = rules(m, ipv);
    out.extend(own.into_iter().chain(entries).map(Op::Append));
    out
}

/// What removes `chain` and every jump to it (nothing when neither is there).
pub(crate) fn del_ops(t: &dyn View, chain: &str) -> Vec<Op> {
    let mut out = Vec::new();
    if jumped_to(t, chain) {
        out.push(Op::Unjump(chain.into()));
    }
    if t.has_chain(chain) {
        out.push(Op::DropChain(chain.into()));
    }
    out
}

/// Masquerade chains of `network`'s containers not in `keep`, named by the comments of the rules
/// read (POSTROUTING's jumps; over netlink also the chains read).
pub(crate) fn stale(t: &dyn View, network: &str, keep: &[Attachment]) -> BTreeSet<String> {
    let kept: HashSet<&str> = keep.iter().map(|a| a.container_id.as_str()).collect();
    let mut out = BTreeSet::new();
    for (_, comment, _) in t.rules_of(None) {
        let Some((net, cid)) = comment.as_deref().and_then(parse_owner) else { continue };
        if net != network || kept.contains(cid.as_str()) {
            continue;
        }
        // Only a chain whose name proves it is this container's.
        let chain = chain_name(network, &cid, "");
        if t.has_chain(&chain) || jumped_to(t, &chain) {
            out.insert(chain);
        }
    }
    out
}

/// Whether the family's nat table can be written: nf_tables answers where iptables is
/// iptables-nft, the legacy nat table is there otherwise (ip6tables' may be absent).
pub(crate) fn usable(ipv: Family) -> Result<()> {
    if super::nft_based() {
        return nfnl::generation().map(|_| ()).map_err(|e| {
            Error::new(code::NOT_AVAILABLE, format!("iptables is iptables-nft, but nf_tables: {}", e.msg))
        });
    }
    xtables::Table::available(ipv, "nat")
}

/// Runs a teardown on both families, tolerating a family whose nat table is unusable as long as
/// one works.
fn both_families(mut f: impl FnMut(Family) -> Result<()>) -> Result<()> {
    let mut errs = Errors::new();
    let mut unusable = Vec::new();
    for ipv in [Family::V4, Family::V6] {
        match usable(ipv) {
            Ok(()) => {
                errs.record(f(ipv));
            }
            Err(e) => unusable.push(e),
        }
    }
    if unusable.len() == 2 {
        unusable.into_iter().for_each(|e| errs.push(e));
    }
    errs.finish()
}

fn families(m: &Masquerade) -> impl Iterator<Item = Family> + '_ {
    [Family::V4, Family::V6].into_iter().filter(|v| m.addresses.iter().any(|a| Family::of(&a.ip()) == *v))
}

/// Adds `m`'s rules, replacing what the container had.
pub(crate) fn add(m: &Masquerade) -> Result<()> {
    let what = format!("add masquerade for container {}", m.container_id);
    let chain = chain_name(&m.network, &m.container_id, "");
    for ipv in families(m) {
        transact(ipv, "nat", &[POSTROUTING, &chain], &what, |t| add_ops(t, m, ipv))?;
    }
    Ok(())
}

/// Removes a container's chain and the jumps to it, on both families; absent is success.
pub(crate) fn del(network: &str, container_id: &str) -> Result<()> {
    let chain = chain_name(network, container_id, "");
    let what = format!("delete masquerade of container {container_id}");
    both_families(|ipv| transact(ipv, "nat", &[POSTROUTING, &chain], &what, |t| del_ops(t, &chain)))
}

/// Code 103 naming the first of `m`'s rules that is missing.
pub(crate) fn check(m: &Masquerade) -> Result<()> {
    let what = format!("masquerade of container {}", m.container_id);
    let chain = chain_name(&m.network, &m.container_id, "");
    for ipv in families(m) {
        let (own, entries) = rules(m, ipv);
        let missing = |t: &dyn View| own.iter().chain(&entries).find(|r| !t.has(r)).cloned();
        let missing = if super::nft_based() {
            missing(&Listed::read(&nfnl::Conn::new(), ipv, "nat", &[POSTROUTING, &chain])?)
        } else {
            missing(&xtables::Table::read(ipv, "nat")?)
        };
        if let Some(r) = missing {
            let tool = ipv.pick("iptables", "ip6tables");
            return Err(check_failed(format!(
                "{what}: rule missing from the {tool} nat table: -A {} {}",
                r.chain,
                r.text()
            )));
        }
    }
    Ok(())
}

/// Removes the chains of every container of `network` not in `keep`.
pub(crate) fn gc(network: &str, keep: &[Attachment]) -> Result<()> {
    let what = format!("garbage-collect masquerade chains of network {network}");
    both_families(|ipv| {
        transact(ipv, "nat", &[POSTROUTING], &what, |t| {
            let mut ops = Vec::new();
            for chain in stale(t, network, keep) {
                // Over netlink only POSTROUTING is read: a jump to a chain proves it exists.
                let jumped = jumped_to(t, &chain);
                if jumped {
                    ops.push(Op::Unjump(chain.clone()));
                }
                if jumped || t.has_chain(&chain) {
                    ops.push(Op::DropChain(chain));
                }
            }
            ops
        })
    })
}

#[cfg(test)]
mod tests;

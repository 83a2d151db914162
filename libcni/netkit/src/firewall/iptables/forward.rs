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
//! Each operation reads the family's filter table once (`iptables-save -t filter`) and applies
//! its change with one `iptables-restore --noflush`, under the backend's lock.

use super::{apply, host, lock, quote, saved_comment, Ipv, NatTable};
use crate::firewall::check_failed;
use libcni::{Errors, Result};
use std::net::IpAddr;

const FORWARD: &str = "FORWARD";
const PRIV_CHAIN: &str = "CNI-FORWARD";
const STAGE1: &str = "CNI-ISOLATION-STAGE-1";
const STAGE2: &str = "CNI-ISOLATION-STAGE-2";
const PRIV_COMMENT: &str = "CNI firewall plugin rules";
const ADMIN_COMMENT: &str = "CNI firewall plugin admin overrides";
/// The reference's default admin chain.
pub const DEFAULT_ADMIN_CHAIN: &str = "CNI-ADMIN";

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

/// `-m comment --comment "<c>"` as iptables-save prints it.
fn comment(c: &str) -> String {
    format!("-m comment --comment {}", quote(c))
}

fn priv_rule() -> String {
    format!("{} -j {PRIV_CHAIN}", comment(PRIV_COMMENT))
}

fn admin_rule(admin: &str) -> String {
    format!("{} -j {admin}", comment(ADMIN_COMMENT))
}

/// The two per-IP rules (chain-relative, as after `-A CNI-FORWARD `).
fn pod_rules(ip: &IpAddr) -> [String; 2] {
    let h = host(*ip);
    [format!("-d {h} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"), format!("-s {h} -j ACCEPT")]
}

fn policy_comment(isolated: bool) -> String {
    let name = if isolated { "isolated" } else { "same-bridge" };
    format!("CNI firewall plugin rules (ingressPolicy: {name})")
}

fn shared_comment(isolated: bool) -> String {
    if isolated {
        "CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)".to_string()
    } else {
        policy_comment(false)
    }
}

/// A saved rule without its `-m comment --comment ...` match, for comparisons that accept either
/// upstream version's comments.
fn without_comment(rule: &str) -> String {
    match saved_comment(rule) {
        Some((_, span)) => format!("{}{}", &rule[..span.start], &rule[span.end..]),
        None => rule.to_string(),
    }
}

fn has_uncommented(t: &NatTable, line: &str) -> bool {
    let want = without_comment(line);
    t.rules.iter().any(|r| without_comment(r) == want)
}

/// The restore lines that add `r`'s rules for `ipv` to the table `t` shows (nothing already there).
pub(crate) fn add_lines(t: &NatTable, r: &ForwardRules, ipv: Ipv) -> Vec<String> {
    let mut out = Vec::new();
    let ips: Vec<&IpAddr> = r.addresses.iter().filter(|ip| Ipv::of(ip) == ipv).collect();
    if ips.is_empty() {
        return out;
    }
    for chain in [PRIV_CHAIN, r.admin_chain.as_str()] {
        if !t.has_chain(chain) {
            out.push(format!("-N {chain}"));
        }
    }
    if !t.has_rule(&format!("-A {FORWARD} {}", priv_rule())) {
        out.push(format!("-I {FORWARD} 1 {}", priv_rule()));
    }
    if !t.has_rule(&format!("-A {PRIV_CHAIN} {}", admin_rule(&r.admin_chain))) {
        out.push(format!("-I {PRIV_CHAIN} 1 {}", admin_rule(&r.admin_chain)));
    }
    for ip in &ips {
        for rule in pod_rules(ip) {
            let line = format!("-A {PRIV_CHAIN} {rule}");
            if !t.has_rule(&line) && !out.contains(&line) {
                out.push(line);
            }
        }
    }
    if let Some(iso) = &r.isolation {
        isolation_lines(t, iso, &mut out);
    }
    out
}

fn isolation_lines(t: &NatTable, iso: &Isolation, out: &mut Vec<String>) {
    let (br, pc, sc) = (&iso.bridge, comment(&policy_comment(iso.isolated)), comment(&shared_comment(iso.isolated)));
    for chain in [STAGE1, STAGE2] {
        if !t.has_chain(chain) {
            out.push(format!("-N {chain}"));
        }
    }
    // The jump to stage 1 goes first in FORWARD, before the jump to CNI-FORWARD.
    if t.rules_of(FORWARD).all(|r| !r.ends_with(&format!(" -j {STAGE1}"))) {
        out.push(format!("-I {FORWARD} 1 {sc} -j {STAGE1}"));
    }
    let insert_first = |chain: &str, rule: String, out: &mut Vec<String>| {
        if !has_uncommented(t, &format!("-A {chain} {rule}")) {
            out.push(format!("-I {chain} 1 {rule}"));
        }
    };
    insert_first(STAGE1, format!("-i {br} ! -o {br} {pc} -j {STAGE2}"), out);
    if iso.isolated {
        insert_first(STAGE1, format!("-i {br} -o {br} {pc} -j DROP"), out);
    }
    insert_first(STAGE2, format!("-o {br} {sc} -j DROP"), out);
    for chain in [STAGE1, STAGE2] {
        if !has_uncommented(t, &format!("-A {chain} {sc} -j RETURN")) {
            out.push(format!("-A {chain} {sc} -j RETURN"));
        }
    }
}

/// The restore lines that remove the per-IP rules of `addresses` for `ipv` that are there.
pub(crate) fn del_lines(t: &NatTable, addresses: &[IpAddr], ipv: Ipv) -> Vec<String> {
    let mut out = Vec::new();
    for ip in addresses.iter().filter(|ip| Ipv::of(ip) == ipv) {
        for rule in pod_rules(ip) {
            let line = format!("-D {PRIV_CHAIN} {rule}");
            if t.has_rule(&format!("-A {PRIV_CHAIN} {rule}")) && !out.contains(&line) {
                out.push(line);
            }
        }
    }
    out
}

/// The first rule of `r` for `ipv` the table lacks (CHECK), as an error naming it.
pub(crate) fn check_table(t: &NatTable, r: &ForwardRules, ipv: Ipv) -> Result<()> {
    let ips: Vec<&IpAddr> = r.addresses.iter().filter(|ip| Ipv::of(ip) == ipv).collect();
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
    let mut wanted =
        vec![format!("-A {FORWARD} {}", priv_rule()), format!("-A {PRIV_CHAIN} {}", admin_rule(&r.admin_chain))];
    for ip in ips {
        wanted.extend(pod_rules(ip).into_iter().map(|rule| format!("-A {PRIV_CHAIN} {rule}")));
    }
    match wanted.iter().find(|w| !t.has_rule(w)) {
        Some(missing) => Err(check_failed(format!("firewall: rule missing from the {family} filter table: {missing}"))),
        None => Ok(()),
    }
}

fn families(addresses: &[IpAddr]) -> Vec<Ipv> {
    [Ipv::V4, Ipv::V6].into_iter().filter(|v| addresses.iter().any(|ip| Ipv::of(ip) == *v)).collect()
}

/// Adds `r`'s rules; a family that fails leaves the pod's rules of the families done before removed.
pub fn add(r: &ForwardRules) -> Result<()> {
    let _guard = lock();
    let what = "firewall: add the pod's forwarding rules";
    let mut done = Vec::new();
    for ipv in families(&r.addresses) {
        if let Err(e) = apply(ipv, "filter", what, None, |t| Ok(add_lines(t, r, ipv))) {
            for undo in done {
                let _ = apply(undo, "filter", what, None, |t| Ok(del_lines(t, &r.addresses, undo)));
            }
            return Err(e);
        }
        done.push(ipv);
    }
    Ok(())
}

/// Removes the per-IP rules of `addresses`; what is not there is success.
pub fn del(addresses: &[IpAddr]) -> Result<()> {
    let _guard = lock();
    let mut errs = Errors::new();
    for ipv in families(addresses) {
        errs.record(apply(ipv, "filter", "firewall: delete the pod's forwarding rules", None, |t| {
            Ok(del_lines(t, addresses, ipv))
        }));
    }
    errs.finish()
}

/// Code 103 naming the first of `r`'s rules (chains, jumps, per-IP rules) that is missing.
pub fn check(r: &ForwardRules) -> Result<()> {
    for ipv in families(&r.addresses) {
        let t = super::save_table(ipv, "filter")?;
        check_table(&t, r, ipv)?;
    }
    Ok(())
}

/// Ok when the iptables tools are installed (code 50 naming the missing one when not).
pub fn status() -> Result<()> {
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

    #[test]
    fn empty_table_gets_the_reference_layout() {
        let t = NatTable::parse("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\nCOMMIT\n", "filter");
        let lines = add_lines(&t, &rules(&["10.1.0.2", "fd00::2"], Some(("br0", false))), Ipv::V4);
        assert_eq!(
            lines,
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
        let v6 = add_lines(&t, &rules(&["10.1.0.2", "fd00::2"], None), Ipv::V6);
        assert!(v6.contains(&"-A CNI-FORWARD -s fd00::2/128 -j ACCEPT".to_string()), "{v6:?}");
        assert!(add_lines(&t, &rules(&["10.1.0.2"], None), Ipv::V6).is_empty());
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
        assert!(add_lines(&t, &rules(&["10.1.0.2"], Some(("br0", false))), Ipv::V4).is_empty());
        assert!(check_table(&t, &rules(&["10.1.0.2"], None), Ipv::V4).is_ok());
        let err = check_table(&t, &rules(&["10.1.0.3"], None), Ipv::V4).unwrap_err();
        assert_eq!(err.code, libcni::code::CHECK_FAILED);
        assert!(err.msg.contains("-d 10.1.0.3/32 -m conntrack"), "{}", err.msg);
        // A second bridge gets its own stage rules, first in each chain.
        let other = add_lines(&t, &rules(&["10.2.0.2"], Some(("br1", false))), Ipv::V4);
        assert!(other.iter().any(|l| l.starts_with("-I CNI-ISOLATION-STAGE-1 1 -i br1 ! -o br1 ")), "{other:?}");
        assert!(other.iter().any(|l| l.starts_with("-I CNI-ISOLATION-STAGE-2 1 -o br1 ")), "{other:?}");
        assert!(!other.iter().any(|l| l.contains("RETURN") || l.starts_with("-I FORWARD")), "{other:?}");
        assert_eq!(
            del_lines(&t, &["10.1.0.2".parse().unwrap(), "10.9.9.9".parse().unwrap()], Ipv::V4),
            vec![
                "-D CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-D CNI-FORWARD -s 10.1.0.2/32 -j ACCEPT"
            ]
        );
    }

    #[test]
    fn comments_are_stripped_with_their_quotes() {
        assert_eq!(without_comment("-A X -o br0 -m comment --comment \"a \\\" b\" -j DROP"), "-A X -o br0 -j DROP");
        assert_eq!(without_comment("-A X -m comment --comment plain -j RETURN"), "-A X -j RETURN");
        assert_eq!(without_comment("-A X -j RETURN"), "-A X -j RETURN");
    }
}

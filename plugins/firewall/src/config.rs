//! firewall's keys, parsed and validated once.

use libcni::gojson::{self, Spelled};
use libcni::{Error, Result};
use netkit::firewall::forward::{DEFAULT_ADMIN_CHAIN, PLUGIN_CHAINS};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize, Default)]
struct Raw {
    backend: Option<Spelled<String>>,
    #[serde(rename = "iptablesAdminChainName")]
    iptables_admin_chain_name: Option<Spelled<String>>,
    #[serde(rename = "firewalldZone")]
    firewalld_zone: Option<Spelled<String>>,
    #[serde(rename = "ingressPolicy")]
    ingress_policy: Option<Spelled<String>>,
}

/// Where the rules go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The reference's filter-table chains, through iptables-save/-restore.
    Iptables,
}

/// `ingressPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressPolicy {
    /// Everything may reach the pod (the default).
    Open,
    /// Only pods on the same bridge (and the node) may reach the pod.
    SameBridge,
    /// Like same-bridge, and pods on the same bridge may not reach each other either.
    Isolated,
}

/// firewall's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub backend: Backend,
    /// `iptablesAdminChainName` (default `CNI-ADMIN`).
    pub admin_chain: String,
    pub ingress_policy: IngressPolicy,
}

fn text(v: &Option<Spelled<String>>) -> Option<(&str, &str)> {
    v.as_ref().map(|s| (s.key_or(""), s.value.as_str())).filter(|(_, v)| !v.is_empty())
}

/// Parses the netconf with Go's key matching. An empty string means "not set", as in the reference.
pub fn parse(raw: &Value) -> Result<Config> {
    let r: Raw = gojson::from_value(raw).map_err(|e| Error::config(format!("invalid firewall configuration: {e}")))?;
    let backend = match text(&r.backend) {
        None => Backend::Iptables,
        Some((_, "iptables")) => Backend::Iptables,
        Some((key, "firewalld")) => {
            return Err(Error::config(format!(
                "firewall: {} \"firewalld\" is not supported by cni-rs (it needs firewalld's D-Bus service): \
                 use \"iptables\" (the default), or the reference plugin on firewalld nodes",
                key_name(key, "backend")
            )))
        }
        Some((key, "nftables" | "nft")) => {
            return Err(Error::config(format!(
                "firewall: {} \"nftables\" is not offered: an accept in a table of its own cannot pass a drop in \
                 another table (nftables consults every forward base chain), so the accept belongs in the node's \
                 own forward chain (see docs/plugins.md, firewall); use \"iptables\" when the drop is iptables'",
                key_name(key, "backend")
            )))
        }
        Some((key, other)) => {
            return Err(Error::config(format!(
                "firewall: unknown {} {other:?}: use \"iptables\" (the default)",
                key_name(key, "backend")
            )))
        }
    };
    let admin_chain = match text(&r.iptables_admin_chain_name) {
        None => DEFAULT_ADMIN_CHAIN.to_string(),
        Some((key, name)) => {
            if let Some(why) = admin_chain_refusal(name) {
                return Err(Error::config(format!(
                    "firewall: {} {name:?} {why}: use a chain of the administrator's own, such as \"{DEFAULT_ADMIN_CHAIN}\" \
                     (the default)",
                    key_name(key, "iptablesAdminChainName")
                )));
            }
            name.to_string()
        }
    };
    // firewalldZone only matters to the firewalld backend; it is accepted and unused.
    let _ = &r.firewalld_zone;
    let ingress_policy = match text(&r.ingress_policy) {
        None | Some((_, "open")) => IngressPolicy::Open,
        Some((_, "same-bridge")) => IngressPolicy::SameBridge,
        Some((_, "isolated")) => IngressPolicy::Isolated,
        Some((key, other)) => {
            return Err(Error::config(format!(
                "firewall: unknown {} {other:?}: use \"open\" (the default), \"same-bridge\" or \"isolated\"",
                key_name(key, "ingressPolicy")
            )))
        }
    };
    Ok(Config { backend, admin_chain, ingress_policy })
}

/// The built-in chains of iptables' tables: the admin chain is jumped to from CNI-FORWARD, and a
/// jump to a built-in chain is refused by iptables.
const BUILTIN_CHAINS: [&str; 5] = ["INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"];

/// Every name iptables or ip6tables resolves as a target, which `iptables -N` refuses ("chain name
/// may not clash with target name"), and a `-j` to which would run the target instead of a chain:
/// the built-in verdicts, `standard` (libxt_standard.so), and the upper-case name of every target
/// extension that iptables 1.8.9 (Debian 1.8.9-2) installs in /usr/lib/x86_64-linux-gnu/xtables as
/// lib{xt,ipt,ip6t}_<NAME>.so. Each was checked with `iptables -N` and `ip6tables -N` in a fresh
/// namespace: a family's own target (TTL, ECN, CLUSTERIP, ULOG for IPv4; HL, DNPT, SNPT for IPv6) is
/// refused by that family's tool only, and the admin chain is made in both. libxt_NAT.so is not in
/// the list: it holds SNAT and DNAT, and no target is named NAT.
const IPTABLES_TARGETS: [&str; 43] = [
    "ACCEPT",
    "DROP",
    "QUEUE",
    "RETURN",
    "standard",
    "AUDIT",
    "CHECKSUM",
    "CLASSIFY",
    "CLUSTERIP",
    "CONNMARK",
    "CONNSECMARK",
    "CT",
    "DNAT",
    "DNPT",
    "DSCP",
    "ECN",
    "HL",
    "HMARK",
    "IDLETIMER",
    "LED",
    "LOG",
    "MARK",
    "MASQUERADE",
    "NETMAP",
    "NFLOG",
    "NFQUEUE",
    "NOTRACK",
    "RATEEST",
    "REDIRECT",
    "REJECT",
    "SECMARK",
    "SET",
    "SNAT",
    "SNPT",
    "SYNPROXY",
    "TCPMSS",
    "TCPOPTSTRIP",
    "TEE",
    "TOS",
    "TPROXY",
    "TRACE",
    "TTL",
    "ULOG",
];

/// Why `name` cannot be the admin chain, or None when it can.
fn admin_chain_refusal(name: &str) -> Option<&'static str> {
    // iptables itself refuses over 28 bytes, a leading '-' or '!', and whitespace; the rest of
    // punctuation it takes is refused too, so nothing in a rule line can read as more than a name.
    if name.len() > 28
        || name.starts_with(['-', '.'])
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Some(
            "is not a usable iptables chain name (at most 28 letters, digits, '-', '_' or '.', not starting \
             with '-' or '.')",
        );
    }
    if BUILTIN_CHAINS.contains(&name) {
        return Some("is a built-in iptables chain");
    }
    if IPTABLES_TARGETS.contains(&name) {
        return Some("is the name of an iptables target, which iptables refuses as a chain name");
    }
    if PLUGIN_CHAINS.contains(&name) {
        return Some("is a chain the firewall plugin fills itself");
    }
    None
}

fn key_name<'a>(spelled: &'a str, name: &'a str) -> &'a str {
    if spelled.is_empty() {
        name
    } else {
        spelled
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(extra: Value) -> Value {
        let mut c = json!({"cniVersion": "1.0.0", "name": "n", "type": "firewall"});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    #[test]
    fn defaults() {
        let c = parse(&conf(json!({}))).unwrap();
        assert_eq!(
            c,
            Config { backend: Backend::Iptables, admin_chain: "CNI-ADMIN".into(), ingress_policy: IngressPolicy::Open }
        );
        // Empty strings are "not set", as Go's zero values.
        let c = parse(&conf(json!({"backend": "", "iptablesAdminChainName": "", "ingressPolicy": ""}))).unwrap();
        assert_eq!(c.admin_chain, "CNI-ADMIN");
    }

    #[test]
    fn every_key() {
        let c = parse(&conf(json!({
            "backend": "iptables", "iptablesAdminChainName": "MY-ADMIN", "firewalldZone": "public",
            "ingressPolicy": "same-bridge"
        })))
        .unwrap();
        assert_eq!(
            c,
            Config {
                backend: Backend::Iptables,
                admin_chain: "MY-ADMIN".into(),
                ingress_policy: IngressPolicy::SameBridge
            }
        );
        assert_eq!(parse(&conf(json!({"ingressPolicy": "isolated"}))).unwrap().ingress_policy, IngressPolicy::Isolated);
        assert_eq!(parse(&conf(json!({"ingressPolicy": "open"}))).unwrap().ingress_policy, IngressPolicy::Open);
        // Go's encoding/json matches keys case-insensitively.
        let c = parse(&conf(json!({"IptablesAdminChainName": "X", "IngressPolicy": "isolated"}))).unwrap();
        assert_eq!((c.admin_chain.as_str(), c.ingress_policy), ("X", IngressPolicy::Isolated));
    }

    #[test]
    fn errors_name_the_key() {
        for (extra, needle) in [
            (json!({"backend": "firewalld"}), "backend \"firewalld\" is not supported"),
            (json!({"backend": "pf"}), "unknown backend \"pf\""),
            (json!({"backend": "nftables"}), "backend \"nftables\" is not offered"),
            (json!({"Backend": "pf"}), "unknown Backend \"pf\""),
            (json!({"ingressPolicy": "closed"}), "unknown ingressPolicy \"closed\""),
            (json!({"iptablesAdminChainName": "A B"}), "iptablesAdminChainName \"A B\""),
            (json!({"iptablesAdminChainName": "X".repeat(29)}), "iptablesAdminChainName"),
            (json!({"iptablesAdminChainName": "-j"}), "iptablesAdminChainName"),
            (json!({"iptablesAdminChainName": "X;reboot"}), "iptablesAdminChainName"),
            (json!({"iptablesAdminChainName": "FORWARD"}), "iptablesAdminChainName"),
            (json!({"iptablesAdminChainName": 5}), "iptablesAdminChainName"),
            (json!({"ingressPolicy": true}), "ingressPolicy"),
        ] {
            let err = parse(&conf(extra.clone())).unwrap_err();
            assert_eq!(err.code, libcni::code::INVALID_CONFIG, "{extra}");
            assert!(err.msg.contains(needle), "{extra}: {}", err.msg);
        }
    }

    /// Every target, built-in chain and chain of the plugin's own is refused as the admin chain,
    /// saying why and what to use; names iptables takes as user chains are kept.
    #[test]
    fn admin_chain_is_never_a_target_or_a_builtin_chain() {
        let refused = |name: &str, why: &str| {
            let err = parse(&conf(json!({ "iptablesAdminChainName": name }))).unwrap_err();
            assert_eq!(err.code, libcni::code::INVALID_CONFIG, "{name}");
            let want = format!("iptablesAdminChainName {name:?} {why}");
            assert!(err.msg.contains(&want), "{name}: {}", err.msg);
            assert!(err.msg.contains("such as \"CNI-ADMIN\" (the default)"), "{name}: {}", err.msg);
        };
        for name in ["ACCEPT", "DROP", "RETURN", "QUEUE", "REJECT", "NFQUEUE", "LOG", "MASQUERADE", "TTL", "HL"] {
            refused(name, "is the name of an iptables target");
        }
        for name in IPTABLES_TARGETS {
            refused(name, "is the name of an iptables target");
        }
        for name in ["INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"] {
            refused(name, "is a built-in iptables chain");
        }
        for name in ["CNI-FORWARD", "CNI-ISOLATION-STAGE-1", "CNI-ISOLATION-STAGE-2"] {
            refused(name, "is a chain the firewall plugin fills itself");
        }
        for name in ["!x", "-x", ".x", "A B", "a\tb", "a:b", "X\n-F FORWARD", &"X".repeat(29)] {
            refused(name, "is not a usable iptables chain name");
        }
        for name in ["NAT", "accept", "mark", "CNI-ADMIN-2", "my_admin.v4", &"X".repeat(28)] {
            assert_eq!(parse(&conf(json!({ "iptablesAdminChainName": name }))).unwrap().admin_chain, name);
        }
    }
}

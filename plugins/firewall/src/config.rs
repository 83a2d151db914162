//! firewall's keys, parsed and validated once.

use libcni::gojson::{self, Spelled};
use libcni::{Error, Result};
use netkit::firewall::forward::DEFAULT_ADMIN_CHAIN;
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
            // Letters, digits, '-', '_' and '.', as chain names are in practice: nothing a rule
            // line could read as more than a name.
            let bad = name.len() > 28
                || name.starts_with(['-', '.'])
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if bad || matches!(name, "FORWARD" | "INPUT" | "OUTPUT" | "CNI-FORWARD" | "ACCEPT" | "DROP" | "RETURN") {
                return Err(Error::config(format!(
                    "firewall: {} {name:?} is not a usable iptables chain name (at most 28 letters, digits, '-', \
                     '_' or '.', not starting with '-' or '.', not a built-in chain, target or CNI-FORWARD)",
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
}

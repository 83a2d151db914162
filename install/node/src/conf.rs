//! The node's conflist (rendered like the installer's, written only when its content changes) and
//! the agent's nftables table that masquerades pod traffic leaving the cluster range.

use anyhow::{anyhow, Result};
use cni_installer::cidr::Cidr;
use cni_installer::install::{self, Placement};
use cni_installer::render;
use ipnetwork::IpNetwork;
use std::path::Path;

/// The built-in template: the installer's, with the bridge not masquerading (the agent does it,
/// for traffic leaving the cluster only) and the pod MTU from the agent.
pub const TEMPLATE: &str = include_str!("../../conf/10-cni-rs-node.conflist.template");
const MTU: &str = "\"__MTU__\"";
/// The agent's own nftables table (`nft list table inet cni-rs-node`).
pub const NFT_TABLE: &str = "cni-rs-node";
const COMMENT: &str = "pods of this node leaving the cluster";

pub fn render(template: &str, cidrs: &[IpNetwork], mtu: u32) -> Result<String> {
    let cidrs: Vec<Cidr> = cidrs.iter().map(|c| Cidr { addr: c.network(), prefix: c.prefix() }).collect();
    render::render(&template.replace(MTU, &mtu.to_string()), &cidrs).map_err(anyhow::Error::msg)
}

/// Writes the conflist atomically; `true` if its content changed.
pub fn write(conf_dir: &Path, conf_name: &str, text: &str) -> Result<bool> {
    std::fs::create_dir_all(conf_dir).map_err(|e| anyhow!("create {}: {e}", conf_dir.display()))?;
    install::remove_stale_temps(conf_dir, &[conf_name]);
    let placed = install::place(conf_dir, conf_name, text.as_bytes(), 0o644)?;
    Ok(matches!(placed, Placement::Installed { .. }))
}

/// The pod CIDRs named by an existing conflist (every `"subnet"` in it): the block this node held
/// before, which it asks for again so its pods keep their addresses.
pub fn previous_cidrs(conf_dir: &Path, conf_name: &str) -> Vec<IpNetwork> {
    let Ok(text) = std::fs::read_to_string(conf_dir.join(conf_name)) else {
        return Vec::new();
    };
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    collect_subnets(&value, &mut out);
    out
}

fn collect_subnets(value: &serde_json::Value, out: &mut Vec<IpNetwork>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                if key == "subnet" {
                    if let Some(net) = v.as_str().and_then(|s| s.parse().ok()) {
                        out.push(net);
                    }
                } else {
                    collect_subnets(v, out);
                }
            }
        }
        serde_json::Value::Array(list) => list.iter().for_each(|v| collect_subnets(v, out)),
        _ => {}
    }
}

/// The masquerade table as `nft list` shows it (what [`apply_masquerade`] programs; compared to
/// apply only on a change): traffic from this node's pod CIDRs to anything outside the cluster
/// range leaves with the node's address; pod-to-pod traffic across nodes keeps its source.
pub fn nft_ruleset(pod_cidrs: &[IpNetwork], cluster: &[IpNetwork]) -> String {
    let mut rules = String::new();
    for pod in pod_cidrs {
        let Some(range) = cluster.iter().find(|c| c.is_ipv4() == pod.is_ipv4()) else { continue };
        let family = if pod.is_ipv4() { "ip" } else { "ip6" };
        rules.push_str(&format!(
            "    {family} saddr {pod} {family} daddr != {range} masquerade comment \"pods of this node leaving the cluster\"\n"
        ));
    }
    // Creating the table first makes the delete succeed on a first run; the file is one
    // transaction, so the table is never seen empty or half-written.
    format!(
        "table inet {NFT_TABLE} {{}}\ndelete table inet {NFT_TABLE}\ntable inet {NFT_TABLE} {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n{rules}  }}\n}}\n"
    )
}

/// Applies the masquerade table over netlink (no `nft` binary needed).
pub fn apply_masquerade(pod_cidrs: &[IpNetwork], cluster: &[IpNetwork]) -> Result<()> {
    let pairs: Vec<(IpNetwork, IpNetwork)> = pod_cidrs
        .iter()
        .filter_map(|pod| cluster.iter().find(|c| c.is_ipv4() == pod.is_ipv4()).map(|range| (*pod, *range)))
        .collect();
    netkit::firewall::replace_masquerade_chain(NFT_TABLE, &pairs, COMMENT).map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_without_masquerade_and_with_the_mtu() {
        let cidrs: Vec<IpNetwork> = vec!["10.244.3.0/24".parse().unwrap(), "fd00:10:244:3::/64".parse().unwrap()];
        let text = render(TEMPLATE, &cidrs, 1450).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["plugins"][0]["ipMasq"], false);
        assert_eq!(v["plugins"][0]["mtu"], 1450);
        assert_eq!(v["plugins"][0]["ipam"]["ranges"][1][0]["subnet"], "fd00:10:244:3::/64");
        let dir = std::env::temp_dir().join(format!("cni-rs-node-conf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(write(&dir, "10-x.conflist", &text).unwrap());
        assert!(!write(&dir, "10-x.conflist", &text).unwrap(), "same content: no write");
        assert_eq!(previous_cidrs(&dir, "10-x.conflist"), cidrs);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn masquerades_only_outside_the_cluster() {
        let pods: Vec<IpNetwork> = vec!["10.244.3.0/24".parse().unwrap()];
        let cluster: Vec<IpNetwork> = vec!["10.244.0.0/16".parse().unwrap()];
        let text = nft_ruleset(&pods, &cluster);
        assert!(text.contains("ip saddr 10.244.3.0/24 ip daddr != 10.244.0.0/16 masquerade"), "{text}");
        assert!(text.starts_with("table inet cni-rs-node {}\ndelete table inet cni-rs-node\n"));
    }
}

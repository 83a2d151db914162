//! The node's kernel settings that pod traffic needs: forwarding, and the bridge's netfilter hooks
//! for NetworkPolicy between pods on one node. In a pod `/proc/sys` is read-only unless the
//! container is privileged, so the DaemonSet's privileged init container sets them
//! (`cni-rs-node --sysctls-only`) and the agent only checks them: it writes a wrong value when it
//! can, and otherwise logs one warning per wrong setting with its consequence and its fix.

use anyhow::{anyhow, Result};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// One setting: `name` (as `sysctl` spells it) must read `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysctl {
    pub name: &'static str,
    pub value: &'static str,
    /// What goes wrong while it has another value.
    pub consequence: &'static str,
    /// Pods cannot reach other nodes without it (the init container fails when it cannot set it).
    pub essential: bool,
}

/// The init container that sets these on the node (install/daemonset.yaml).
const INIT_CONTAINER: &str = "the DaemonSet's privileged init container `sysctls` (install/daemonset.yaml, \
     `cni-rs-node --sysctls-only`)";

const BRIDGE_V4: &str = "IPv4 traffic between pods on this node's bridge skips the netfilter hooks: \
                         NetworkPolicy is not enforced between pods of this node";
const BRIDGE_V6: &str = "IPv6 traffic between pods on this node's bridge skips the netfilter hooks: \
                         NetworkPolicy is not enforced between pods of this node";

/// The settings this node needs: IPv4 forwarding always, IPv6 forwarding when the cluster has an
/// IPv6 pod range, and the bridge's calls into iptables/ip6tables (nftables' ip and ip6 hooks) when
/// NetworkPolicy is enforced on traffic between pods of one bridge.
pub fn needed(ipv6: bool, bridge_netfilter: bool) -> Vec<Sysctl> {
    let mut list = vec![Sysctl {
        name: "net.ipv4.ip_forward",
        value: "1",
        consequence: "this node forwards no IPv4 pod traffic: its pods cannot reach other nodes' pods or \
                      anything outside this node",
        essential: true,
    }];
    if ipv6 {
        list.push(Sysctl {
            name: "net.ipv6.conf.all.forwarding",
            value: "1",
            consequence: "this node forwards no IPv6 pod traffic: its pods cannot reach other nodes' pods or \
                          anything outside this node over IPv6",
            essential: true,
        });
    }
    if bridge_netfilter {
        for (name, consequence) in
            [("net.bridge.bridge-nf-call-iptables", BRIDGE_V4), ("net.bridge.bridge-nf-call-ip6tables", BRIDGE_V6)]
        {
            list.push(Sysctl { name, value: "1", consequence, essential: false });
        }
    }
    list
}

/// The file of `name` under `root` (`/proc/sys`).
fn path(root: &Path, name: &str) -> PathBuf {
    root.join(name.replace('.', "/"))
}

/// What [`ensure_in`] found for one setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It had the value already; nothing was written.
    Right,
    /// It had `was` and now has the value.
    Set { was: String },
    /// It has another value (or none) and could not be set; the text says why and what to do.
    Wrong(String),
}

/// Checks every setting in `list` under `/proc/sys` and logs what it did (see [`ensure_in`]).
pub fn ensure(list: &[Sysctl]) -> Vec<(Sysctl, Outcome)> {
    ensure_in(Path::new("/proc/sys"), list)
}

/// Each setting already right is left alone and not mentioned (also when `root` is read-only); a
/// wrong one is written and logged; one that cannot be written (read-only `/proc/sys`, no
/// permission, the file missing) gets one warning naming it, the value needed, the consequence
/// and the fix.
pub fn ensure_in(root: &Path, list: &[Sysctl]) -> Vec<(Sysctl, Outcome)> {
    let mut out = Vec::new();
    for sysctl in list {
        let outcome = check(root, sysctl);
        match &outcome {
            Outcome::Right => {}
            Outcome::Set { was } => eprintln!("set {} to {} (it was {was})", sysctl.name, sysctl.value),
            Outcome::Wrong(text) => eprintln!("warning: {text}"),
        }
        out.push((sysctl.clone(), outcome));
    }
    out
}

/// `cni-rs-node --sysctls-only`: [`set_all`], failing with the error it gives.
pub fn init_container(list: &[Sysctl]) -> std::process::ExitCode {
    match set_all(list) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Sets every setting of `list`; an error names the essential ones (forwarding) it could not set.
/// A non-essential one that stays wrong (br_netfilter not loaded) is only a warning.
pub fn set_all(list: &[Sysctl]) -> Result<()> {
    let results = ensure(list);
    let failed: Vec<&str> = results
        .iter()
        .filter(|(sysctl, outcome)| sysctl.essential && matches!(outcome, Outcome::Wrong(_)))
        .map(|(sysctl, _)| sysctl.name)
        .collect();
    if !failed.is_empty() {
        return Err(anyhow!(
            "could not set {} (see above): run this init container privileged (its /proc/sys is read-only otherwise)",
            failed.join(", ")
        ));
    }
    let right: Vec<String> = results
        .iter()
        .filter(|(_, outcome)| !matches!(outcome, Outcome::Wrong(_)))
        .map(|(sysctl, _)| format!("{}={}", sysctl.name, sysctl.value))
        .collect();
    eprintln!("the node's sysctls are set: {}", right.join(", "));
    Ok(())
}

fn check(root: &Path, sysctl: &Sysctl) -> Outcome {
    let file = path(root, sysctl.name);
    let (name, value, consequence) = (sysctl.name, sysctl.value, sysctl.consequence);
    let was = match std::fs::read_to_string(&file) {
        Ok(text) => text.trim().to_string(),
        Err(e) if e.kind() == ErrorKind::NotFound && name.starts_with("net.bridge.") => {
            return Outcome::Wrong(format!(
                "{name} does not exist ({} is missing: the br_netfilter module is not loaded), and {name}={value} \
                 is needed: {consequence}. Fix: load it on the node (`modprobe br_netfilter`, and list it in \
                 /etc/modules-load.d/ to keep it across reboots); its default is {value}",
                file.display()
            ))
        }
        Err(e) => {
            return Outcome::Wrong(format!(
                "{name} cannot be read ({}: {e}), and {name}={value} is needed: {consequence}",
                file.display()
            ))
        }
    };
    if was == value {
        return Outcome::Right;
    }
    match std::fs::write(&file, value) {
        Ok(()) => Outcome::Set { was },
        Err(e) => Outcome::Wrong(format!(
            "{name} is {was} and cannot be set to {value} here (write {}: {e}): {consequence}. Fix: set it on \
             the node: {INIT_CONTAINER} does, or the node's operator puts `{name} = {value}` in a file in \
             /etc/sysctl.d/",
            file.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[Sysctl]) -> Vec<&str> {
        list.iter().map(|s| s.name).collect()
    }

    #[test]
    fn the_list_follows_the_families_and_network_policy() {
        assert_eq!(names(&needed(false, false)), ["net.ipv4.ip_forward"]);
        assert_eq!(
            names(&needed(true, true)),
            [
                "net.ipv4.ip_forward",
                "net.ipv6.conf.all.forwarding",
                "net.bridge.bridge-nf-call-iptables",
                "net.bridge.bridge-nf-call-ip6tables"
            ]
        );
        assert!(needed(true, true).iter().all(|s| s.essential == s.name.contains("forward")));
    }

    #[test]
    fn right_values_are_left_alone_wrong_ones_set_and_a_missing_bridge_names_the_module() {
        let root = std::env::temp_dir().join(format!("cni-rs-node-sysctls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("net/ipv4")).unwrap();
        std::fs::create_dir_all(root.join("net/ipv6/conf/all")).unwrap();
        std::fs::write(root.join("net/ipv4/ip_forward"), "1\n").unwrap();
        std::fs::write(root.join("net/ipv6/conf/all/forwarding"), "0\n").unwrap();
        let got = ensure_in(&root, &needed(true, true));
        let outcomes: Vec<&Outcome> = got.iter().map(|(_, o)| o).collect();
        assert_eq!(outcomes[0], &Outcome::Right);
        assert_eq!(outcomes[1], &Outcome::Set { was: "0".into() });
        assert_eq!(std::fs::read_to_string(root.join("net/ipv6/conf/all/forwarding")).unwrap(), "1");
        for outcome in &outcomes[2..] {
            let Outcome::Wrong(text) = outcome else { panic!("{outcome:?}") };
            assert!(text.contains("br_netfilter module is not loaded") && text.contains("modprobe"), "{text}");
            assert!(text.contains("NetworkPolicy is not enforced"), "{text}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}

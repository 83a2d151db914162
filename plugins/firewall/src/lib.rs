//! firewall: lets a pod's traffic through a FORWARD policy of DROP (a chained plugin after bridge
//! or ptp and IPAM), with the reference plugin's iptables layout (see
//! `netkit::firewall::forward`), so a node can switch between the reference and this plugin in
//! either direction with pods running.
//!
//! ADD accepts forwarded traffic from each address of prevResult and the replies to it, and with
//! `ingressPolicy` same-bridge/isolated adds the bridge's isolation rules; it returns prevResult
//! unchanged. DEL removes the per-address rules of the addresses in prevResult (the rules carry no
//! owner, as the reference's do not); without prevResult there is nothing it can identify.

pub mod config;

use config::{Backend, Config, IngressPolicy};
use libcni::skel::{Plugin, Request};
use libcni::types::CniResult;
use libcni::{Error, Result};
use netkit::firewall::forward::{self, ForwardRules, Isolation};
use std::net::IpAddr;

/// The plugin.
pub struct Firewall;

/// The reference's firewall speaks 0.4.0 and later (it needs prevResult on ADD and CHECK).
const VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

fn addresses(prev: &CniResult) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = prev.ips.iter().map(|ip| ip.address.ip()).collect();
    out.dedup();
    out
}

/// The rules for `prev`: with an ingress policy, the bridge is prevResult's first interface, as
/// the reference takes it (bridge lists the bridge first).
fn rules(conf: &Config, prev: &CniResult) -> Result<ForwardRules> {
    let isolation = match conf.ingress_policy {
        IngressPolicy::Open => None,
        policy => {
            let name = match policy {
                IngressPolicy::Isolated => "isolated",
                _ => "same-bridge",
            };
            let bridge = prev.interfaces.first().map(|i| i.name.as_str()).unwrap_or_default();
            if bridge.is_empty() {
                return Err(Error::config(format!(
                    "firewall: ingressPolicy {name:?} needs the bridge as prevResult's first interface; chain \
                     \"firewall\" after \"bridge\""
                )));
            }
            libcni::skel::validate_ifname(bridge).map_err(|e| {
                Error::config(format!("firewall: ingressPolicy {name:?}: prevResult's first interface: {}", e.msg))
            })?;
            Some(Isolation { bridge: bridge.to_string(), isolated: policy == IngressPolicy::Isolated })
        }
    };
    Ok(ForwardRules { admin_chain: conf.admin_chain.clone(), addresses: addresses(prev), isolation })
}

impl Plugin for Firewall {
    fn supported_versions(&self) -> &'static [&'static str] {
        &VERSIONS
    }

    fn reads_cni_args(&self) -> bool {
        false
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = config::parse(&req.raw)?;
        let prev = req.prev_result("firewall")?;
        let r = rules(&conf, prev)?;
        match conf.backend {
            Backend::Iptables => forward::add(&r)?,
        }
        Ok(prev.clone())
    }

    fn del(&self, req: &Request) -> Result<()> {
        // The per-address rules are the same whatever the other keys say, so an invalid
        // configuration still removes them.
        if let Err(e) = config::parse(&req.raw) {
            eprintln!("firewall: DEL removes the pod's rules although its configuration is invalid: {}", e.msg);
        }
        let Some(prev) = req.conf.prev_result.as_ref() else { return Ok(()) };
        forward::del(&addresses(prev))
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.raw)?;
        let prev = req.prev_result("firewall")?;
        let r = rules(&conf, prev)?;
        match conf.backend {
            Backend::Iptables => forward::check(&r),
        }
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = config::parse(&req.raw)?;
        match conf.backend {
            Backend::Iptables => forward::status(),
        }
    }
}

//! static IPAM: hands out exactly the addresses, routes and DNS settings it is given (from the
//! configuration, `args.cni.ips`, the `ips` capability or CNI_ARGS `IP`/`GATEWAY`). It keeps nothing on
//! disk: DEL, GC and STATUS have nothing to do.

pub mod config;

use config::StaticConfig;
use libcni::types::IpConfig;
use libcni::{code, CniResult, Error, Plugin, Request, Result};

pub struct Static;

impl Plugin for Static {
    fn known_args(&self) -> &'static [&'static str] {
        &["IP", "GATEWAY"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = StaticConfig::parse(&req.conf, &req.args)?;
        Ok(result(&conf))
    }

    /// Every address the configuration hands out is in prevResult, with the configured gateway.
    fn check(&self, req: &Request) -> Result<()> {
        let conf = StaticConfig::parse(&req.conf, &req.args)?;
        let prev = req.prev_result("static")?;
        for want in &conf.addresses {
            let Some(got) = prev.ips.iter().find(|ip| ip.address.ip() == want.address.ip()) else {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!("static: address {} is not in prevResult on {}", want.address, req.ifname),
                ));
            };
            if got.address.prefix() != want.address.prefix() {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!("static: address {} is {} in prevResult on {}", want.address, got.address, req.ifname),
                ));
            }
            if want.gateway.is_some() && got.gateway != want.gateway {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!(
                        "static: address {} has gateway {} in prevResult on {}, the configuration says {}",
                        want.address,
                        got.gateway.map_or_else(|| "none".to_string(), |g| g.to_string()),
                        req.ifname,
                        want.gateway.map_or_else(String::new, |g| g.to_string())
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Nothing was allocated, so nothing is released; DEL succeeds even on a configuration that no
    /// longer validates.
    fn del(&self, _req: &Request) -> Result<()> {
        Ok(())
    }
}

/// The ADD result: the addresses (no interface index: the calling plugin assigns them), routes and
/// DNS; skel renders it in the configuration's version.
pub fn result(conf: &StaticConfig) -> CniResult {
    CniResult {
        cni_version: String::new(),
        interfaces: Vec::new(),
        ips: conf
            .addresses
            .iter()
            .map(|a| IpConfig { address: a.address, gateway: a.gateway, interface: None })
            .collect(),
        routes: conf.routes.clone(),
        dns: conf.dns.clone(),
    }
}

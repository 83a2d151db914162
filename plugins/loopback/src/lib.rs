//! loopback: brings `lo` up in the container's network namespace.

use libcni::types::{CniResult, Interface, IpConfig};
use libcni::{code, Error, Plugin, Request, Result};
use netkit::{NetNs, Netlink};
use std::path::Path;

pub struct Loopback;

fn netns_path(req: &Request) -> Result<&Path> {
    req.netns.as_deref().ok_or_else(|| Error::env("required env variables [CNI_NETNS] missing"))
}

fn lo(nl: &Netlink) -> Result<netkit::Link> {
    nl.link("lo")?.ok_or_else(|| Error::network("the network namespace has no \"lo\" interface"))
}

impl Plugin for Loopback {
    fn reads_cni_args(&self) -> bool {
        false
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let path = netns_path(req)?;
        let ns = NetNs::open(path)?;
        let nl = Netlink::open_in(&ns)?;
        let lo = lo(&nl)?;
        nl.set_up(lo.index).map_err(|e| e.context("set lo up"))?;
        if let Some(prev) = &req.conf.prev_result {
            return Ok(prev.clone());
        }
        // The reference's shape: lo with its sandbox, and lo's addresses pointing at it.
        let ips = nl
            .addresses(lo.index)?
            .into_iter()
            .map(|address| IpConfig { address, gateway: None, interface: Some(0) })
            .collect();
        Ok(CniResult {
            cni_version: req.conf.cni_version.clone(),
            interfaces: vec![Interface {
                name: "lo".into(),
                sandbox: Some(path.display().to_string()),
                ..Default::default()
            }],
            ips,
            ..Default::default()
        })
    }

    fn del(&self, req: &Request) -> Result<()> {
        let Some(path) = req.netns.as_deref() else { return Ok(()) };
        let Some(ns) = NetNs::open_if_exists(path)? else { return Ok(()) };
        let nl = Netlink::open_in(&ns)?;
        if let Some(lo) = nl.link("lo")? {
            nl.set_down(lo.index).map_err(|e| e.context("set lo down"))?;
        }
        Ok(())
    }

    fn check(&self, req: &Request) -> Result<()> {
        let ns = NetNs::open(netns_path(req)?)?;
        let nl = Netlink::open_in(&ns)?;
        if lo(&nl)?.up {
            Ok(())
        } else {
            Err(Error::new(code::CHECK_FAILED, "lo is down in the container's network namespace"))
        }
    }
}

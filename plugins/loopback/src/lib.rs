//! loopback: brings `lo` up in the container's network namespace.

use libcni::types::{CniResult, Interface, IpConfig};
use libcni::{code, Error, Plugin, Request, Result};
use netkit::Netlink;

pub struct Loopback;

fn lo(nl: &Netlink) -> Result<netkit::Link> {
    nl.link("lo")?.ok_or_else(|| Error::network("the network namespace has no \"lo\" interface"))
}

impl Plugin for Loopback {
    fn reads_cni_args(&self) -> bool {
        false
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let ns = netkit::container_netns(req)?;
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
                sandbox: Some(ns.path().display().to_string()),
                ..Default::default()
            }],
            ips,
            ..Default::default()
        })
    }

    fn del(&self, req: &Request) -> Result<()> {
        // Unset or gone: nothing to do. The plugin's own namespace is refused: the node's lo stays up.
        let Some(ns) = netkit::container_netns_for_del(req)? else { return Ok(()) };
        let nl = Netlink::open_in(&ns)?;
        if let Some(lo) = nl.link("lo")? {
            nl.set_down(lo.index).map_err(|e| e.context("set lo down"))?;
        }
        Ok(())
    }

    fn check(&self, req: &Request) -> Result<()> {
        let ns = netkit::container_netns(req)?;
        let nl = Netlink::open_in(&ns)?;
        if lo(&nl)?.up {
            Ok(())
        } else {
            Err(Error::new(code::CHECK_FAILED, "lo is down in the container's network namespace"))
        }
    }
}

//! host-local IPAM: hands out addresses from configured ranges and records them on disk in the reference
//! plugin's format, so a node can switch between the Go plugin and this one in either direction.
//!
//! Beyond the reference: a repeated ADD for the same attachment returns the address it already holds,
//! GC releases reservations of attachments that are gone, and STATUS reports an unwritable store or an
//! exhausted range set.

pub mod alloc;
pub mod config;
pub mod store;

use alloc::{RangeSet, Refusal};
use config::IpamConfig;
use ipnetwork::IpNetwork;
use libcni::types::{Dns, IpConfig};
use libcni::{code, CniResult, Command, Error, Errors, Plugin, Request, Result};
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use store::{Locked, Owner, Reservations, Store};

pub struct HostLocal;

fn load(req: &Request) -> Result<IpamConfig> {
    let cni_args = (req.command == Command::Add).then_some(&req.args);
    IpamConfig::parse(&req.conf, cni_args)
}

/// resolv.conf as the reference reads it: nameserver, domain, search and options lines.
pub fn parse_resolv_conf(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let mut fields = line.split_whitespace();
        match (fields.next(), fields.next()) {
            (Some("nameserver"), Some(ns)) => dns.nameservers.push(ns.to_string()),
            (Some("domain"), Some(domain)) => dns.domain = Some(domain.to_string()),
            (Some("search"), Some(first)) => {
                dns.search = std::iter::once(first).chain(fields).map(str::to_string).collect();
            }
            (Some("options"), Some(first)) => {
                dns.options.extend(std::iter::once(first).chain(fields).map(str::to_string));
            }
            _ => {}
        }
    }
    dns
}

fn read_resolv_conf(path: &Path) -> Result<Dns> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("ipam.resolvConf: read {}", path.display()), &e))?;
    Ok(parse_resolv_conf(&text))
}

fn set_error(index: usize, set: &RangeSet, code: u32, why: impl std::fmt::Display) -> Error {
    Error::new(code, format!("range set {index} ({set}): {why}"))
}

/// Picks (or re-finds) one address per set for an attachment. On failure, releases what it reserved.
struct Allocation<'a> {
    locked: &'a Locked<'a>,
    reservations: Reservations,
    container_id: &'a str,
    ifname: &'a str,
    newly_reserved: Vec<IpAddr>,
}

impl Allocation<'_> {
    fn set(&mut self, index: usize, set: &RangeSet, requested: Option<IpAddr>) -> Result<IpConfig> {
        let held = self.reservations.held_by(self.container_id, self.ifname).into_iter().find(|ip| set.contains(*ip));
        let ip = match (held, requested) {
            (Some(held), Some(req)) if held != req => {
                return Err(set_error(
                    index,
                    set,
                    code::INVALID_CONFIG,
                    format!("requested IP {req}, but this attachment already holds {held}"),
                ))
            }
            (Some(held), _) => held,
            (None, Some(req)) => self.reserve_requested(index, set, req)?,
            (None, None) => self.reserve_next(index, set)?,
        };
        let range = set.range_for(ip).ok_or_else(|| {
            set_error(index, set, code::INTERNAL, format!("allocated {ip} outside the set (a bug, please report it)"))
        })?;
        let address = IpNetwork::new(ip, range.subnet.prefix())
            .map_err(|e| set_error(index, set, code::INTERNAL, format!("address {ip}: {e}")))?;
        Ok(IpConfig { address, gateway: Some(range.gateway), interface: None })
    }

    fn reserve_requested(&mut self, index: usize, set: &RangeSet, ip: IpAddr) -> Result<IpAddr> {
        match set.check_requested(ip) {
            Ok(_) => {}
            Err(Refusal::NotInSet) => {
                return Err(set_error(index, set, code::INVALID_CONFIG, format!("requested IP {ip} is not in the set")))
            }
            Err(Refusal::Unusable(why)) => {
                return Err(set_error(index, set, code::INVALID_CONFIG, format!("requested IP {ip} {why}")))
            }
        }
        if self.reservations.is_taken(ip) || !self.locked.reserve(ip, self.container_id, self.ifname)? {
            return Err(set_error(
                index,
                set,
                code::INVALID_CONFIG,
                format!("requested IP address {ip} is not available: it is reserved by another attachment"),
            ));
        }
        self.newly_reserved.push(ip);
        libcni::fault_point("host-local-reserved")?;
        self.locked.set_last_reserved(index, ip)?;
        Ok(ip)
    }

    fn reserve_next(&mut self, index: usize, set: &RangeSet) -> Result<IpAddr> {
        let last = self.locked.last_reserved(index);
        // Addresses found taken only at link time (someone ignoring the lock) are skipped on the next pass.
        let mut raced: HashSet<IpAddr> = HashSet::new();
        loop {
            let candidate = set.next_free(last, |ip| {
                self.reservations.is_taken(ip) || self.newly_reserved.contains(&ip) || raced.contains(&ip)
            });
            let Some(ip) = candidate else {
                return Err(set_error(index, set, code::RANGE_EXHAUSTED, "no IP addresses available"));
            };
            if self.locked.reserve(ip, self.container_id, self.ifname)? {
                self.newly_reserved.push(ip);
                libcni::fault_point("host-local-reserved")?;
                self.locked.set_last_reserved(index, ip)?;
                return Ok(ip);
            }
            raced.insert(ip);
        }
    }

    /// Undo this ADD's reservations (never ones an earlier ADD made).
    fn roll_back(&self) {
        for ip in &self.newly_reserved {
            // Best effort: the error being returned is the one that matters.
            let _ = self.locked.release(*ip);
        }
    }
}

impl HostLocal {
    fn allocate(&self, cfg: &IpamConfig, container_id: &str, ifname: &str) -> Result<Vec<IpConfig>> {
        let requested = cfg.requested_per_set()?;
        let store = Store::create(&cfg.data_dir, &cfg.network)?;
        let locked = store.lock()?;
        let reservations = locked.scan()?;
        let mut alloc = Allocation { locked: &locked, reservations, container_id, ifname, newly_reserved: Vec::new() };
        let mut ips = Vec::with_capacity(cfg.range_sets.len());
        for (index, (set, req)) in cfg.range_sets.iter().zip(requested).enumerate() {
            match alloc.set(index, set, req) {
                Ok(ip) => ips.push(ip),
                Err(e) => {
                    alloc.roll_back();
                    return Err(e);
                }
            }
        }
        if let Err(e) = libcni::fault_point("host-local-allocated") {
            alloc.roll_back();
            return Err(e);
        }
        Ok(ips)
    }
}

impl Plugin for HostLocal {
    fn known_args(&self) -> &'static [&'static str] {
        &["IP"]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let cfg = load(req)?;
        let dns = cfg.resolv_conf.as_deref().map(read_resolv_conf).transpose()?.unwrap_or_default();
        let ips = self.allocate(&cfg, &req.container_id, &req.ifname)?;
        Ok(CniResult { cni_version: cfg.cni_version.clone(), interfaces: Vec::new(), ips, routes: cfg.routes, dns })
    }

    fn del(&self, req: &Request) -> Result<()> {
        let (network, data_dir) = config::store_location(&req.conf)?;
        let Some(store) = Store::existing(&data_dir, &network)? else { return Ok(()) };
        let locked = store.lock()?;
        let reservations = locked.scan()?;
        let mut errors = Errors::new();
        for ip in reservations.held_by(&req.container_id, &req.ifname) {
            errors.record(locked.release(ip));
        }
        errors.finish()
    }

    fn check(&self, req: &Request) -> Result<()> {
        let cfg = load(req)?;
        let missing = || {
            Error::new(
                code::CHECK_FAILED,
                format!(
                    "host-local: no address of network {} is reserved for container {} interface {}",
                    cfg.network, req.container_id, req.ifname
                ),
            )
        };
        let store = Store::existing(&cfg.data_dir, &cfg.network)?.ok_or_else(missing)?;
        let held = store.scan()?.held_by(&req.container_id, &req.ifname);
        if held.is_empty() {
            return Err(missing());
        }
        let Some(prev) = &req.conf.prev_result else { return Ok(()) };
        let ours = |ip: IpAddr| cfg.range_sets.iter().any(|s| s.ranges.iter().any(|r| r.subnet.contains(ip)));
        let prev_ips: Vec<IpAddr> = prev.ips.iter().map(|c| c.address.ip()).filter(|ip| ours(*ip)).collect();
        for ip in &prev_ips {
            if !held.contains(ip) {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!("host-local: prevResult address {ip} is not reserved for container {}", req.container_id),
                ));
            }
        }
        for ip in &held {
            if !prev_ips.contains(ip) {
                return Err(Error::new(
                    code::CHECK_FAILED,
                    format!(
                        "host-local: reserved address {ip} of container {} is missing from prevResult",
                        req.container_id
                    ),
                ));
            }
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<()> {
        let (network, data_dir) = config::store_location(&req.conf)?;
        let Some(store) = Store::existing(&data_dir, &network)? else { return Ok(()) };
        let locked = store.lock()?;
        let mut errors = Errors::new();
        errors.record(locked.remove_stale_temp_files());
        // Without the list the runtime has told us nothing; releasing everything would be a disaster.
        let Some(valid) = req.conf.valid_attachments.as_deref() else { return errors.finish() };
        let keep_exact: HashSet<(&str, &str)> =
            valid.iter().map(|a| (a.container_id.as_str(), a.ifname.as_str())).collect();
        let keep_container: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
        let reservations = locked.scan()?;
        for (ip, owner) in &reservations.by_ip {
            let keep = match owner {
                Owner::Attachment { container_id, ifname } => keep_exact.contains(&(container_id, ifname)),
                Owner::Legacy { container_id } => keep_container.contains(container_id.as_str()),
            };
            if !keep {
                errors.record(locked.release(*ip));
            }
        }
        errors.finish()
    }

    fn status(&self, req: &Request) -> Result<()> {
        let cfg = load(req)?;
        let unavailable = |e: Error| Error::new(code::NOT_AVAILABLE, format!("host-local: {}", e.msg));
        let store = Store::create(&cfg.data_dir, &cfg.network).map_err(unavailable)?;
        store.probe_writable().map_err(unavailable)?;
        let reservations = store.scan().map_err(unavailable)?;
        for (index, set) in cfg.range_sets.iter().enumerate() {
            if set.next_free(None, |ip| reservations.is_taken(ip)).is_none() {
                return Err(set_error(index, set, code::NOT_AVAILABLE, "no IP addresses available"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_like_reference() {
        let dns = parse_resolv_conf(
            "# comment\n; other\nnameserver 10.0.0.53\nnameserver fd00::53\ndomain example.com\n\
             search a.example b.example\noptions ndots:5\noptions edns0 rotate\n",
        );
        assert_eq!(dns.nameservers, ["10.0.0.53", "fd00::53"]);
        assert_eq!(dns.domain.as_deref(), Some("example.com"));
        assert_eq!(dns.search, ["a.example", "b.example"]);
        assert_eq!(dns.options, ["ndots:5", "edns0", "rotate"]);
    }
}

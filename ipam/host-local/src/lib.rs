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
use store::{Boot, Locked, Owner, Store};

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

/// Refuses (code 7) a requested address set `index` cannot hand out: outside its ranges, or one of
/// its unusable addresses (the network, the gateway, the broadcast).
fn requested_usable(index: usize, set: &RangeSet, ip: IpAddr) -> Result<()> {
    match set.check_requested(ip) {
        Ok(_) => Ok(()),
        Err(Refusal::NotInSet) => {
            Err(set_error(index, set, code::INVALID_CONFIG, format!("requested IP {ip} is not in the set")))
        }
        Err(Refusal::Unusable(why)) => {
            Err(set_error(index, set, code::INVALID_CONFIG, format!("requested IP {ip} {why}")))
        }
    }
}

/// Picks (or re-finds) one address per set for an attachment. On failure, releases what it reserved.
struct Allocation<'a, 's> {
    locked: &'a mut Locked<'s>,
    /// What the attachment held before this ADD (confirmed), found once: a reservation made for one set must
    /// not hide the old-format files that count only when the attachment has no file of its own.
    held: Vec<IpAddr>,
    container_id: &'a str,
    ifname: &'a str,
    newly_reserved: Vec<IpAddr>,
}

impl Allocation<'_, '_> {
    fn set(&mut self, index: usize, set: &RangeSet, requested: Option<IpAddr>) -> Result<IpConfig> {
        let held = self.held.iter().copied().find(|ip| set.contains(*ip));
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
        requested_usable(index, set, ip)?;
        if self.locked.reservations().is_taken(ip) || !self.locked.reserve(ip, self.container_id, self.ifname)? {
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
        let last = self.locked.last_reserved(index)?;
        // Addresses found taken only at link time (someone ignoring the lock) are skipped on the next pass.
        let mut raced: HashSet<IpAddr> = HashSet::new();
        loop {
            // This ADD's own reservations are in the view already.
            let reservations = self.locked.reservations();
            let candidate = set.next_free(last, |ip| reservations.is_taken(ip) || raced.contains(&ip));
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
    fn roll_back(&mut self) {
        for ip in std::mem::take(&mut self.newly_reserved) {
            // Best effort: the error being returned is the one that matters.
            let _ = self.locked.release(ip);
        }
    }
}

impl HostLocal {
    fn allocate(&self, cfg: &IpamConfig, container_id: &str, ifname: &str) -> Result<Vec<IpConfig>> {
        let requested = cfg.requested_per_set()?;
        // Every requested address is checked before the store is created or anything reserved:
        // a configuration error leaves the data directory as it was.
        for (index, (set, req)) in cfg.range_sets.iter().zip(&requested).enumerate() {
            if let Some(ip) = req {
                requested_usable(index, set, *ip)?;
            }
        }
        let store = Store::create(&cfg.data_dir, &cfg.network)?;
        let mut locked = store.lock()?;
        if !cfg.keep_reservations_on_reboot {
            if let Some(boot) = Boot::current()? {
                locked.release_earlier_boots(&boot)?;
            }
        }
        let held = locked.held_by(container_id, ifname);
        let mut alloc = Allocation { locked: &mut locked, held, container_id, ifname, newly_reserved: Vec::new() };
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
        let mut locked = store.lock()?;
        let mut errors = Errors::new();
        for ip in locked.held_by(&req.container_id, &req.ifname) {
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
        let held = store.scan()?.held_by(&store, &req.container_id, &req.ifname);
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
        // Taking the lock removes temporary files left by a crash.
        let mut locked = store.lock()?;
        // Without the list the runtime has told us nothing; releasing everything would be a disaster.
        let Some(valid) = req.conf.valid_attachments.as_deref() else { return Ok(()) };
        let keep_exact: HashSet<(&str, &str)> =
            valid.iter().map(|a| (a.container_id.as_str(), a.ifname.as_str())).collect();
        let keep_container: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
        let keep = |owner: &Owner| match owner {
            Owner::Attachment { container_id, ifname } => keep_exact.contains(&(container_id, ifname)),
            Owner::Legacy { container_id } => keep_container.contains(container_id.as_str()),
        };
        let unwanted: Vec<IpAddr> =
            locked.reservations().owners().into_iter().filter(|(_, owner)| !keep(owner)).map(|(ip, _)| ip).collect();
        let mut errors = Errors::new();
        for ip in unwanted {
            // The owner above may come from the scan cache: release only what the file itself says.
            if locked.confirmed_owner(ip).is_some_and(|owner| !keep(&owner)) {
                errors.record(locked.release(ip));
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
    use crate::store::tests::{rewrite_in_place, TempDir};
    use serde_json::json;
    use std::fs;

    fn request(command: Command, cid: &str, ifname: &str, conf: &serde_json::Value) -> Request {
        let stdin = conf.to_string().into_bytes();
        let (conf, raw) = libcni::conf::parse_netconf(&stdin).unwrap();
        Request {
            command,
            container_id: cid.into(),
            netns: None,
            ifname: ifname.into(),
            args: libcni::args::CniArgs::default(),
            netns_override: false,
            cni_path: Vec::new(),
            conf,
            raw,
            stdin,
        }
    }

    fn conf(t: &TempDir) -> serde_json::Value {
        json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge", "ipam": {"type": "host-local",
            "dataDir": t.0, "ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}})
    }

    fn add(conf: &serde_json::Value, cid: &str, ifname: &str) -> Vec<String> {
        let result = HostLocal.add(&request(Command::Add, cid, ifname, conf)).unwrap();
        result.ips.iter().map(|c| c.address.ip().to_string()).collect()
    }

    /// (file name, content) of every reservation.
    fn files(t: &TempDir) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = fs::read_dir(t.0.join("n"))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_str().unwrap().parse::<IpAddr>().is_ok())
            .map(|e| (e.file_name().into_string().unwrap(), fs::read_to_string(e.path()).unwrap()))
            .collect();
        out.sort();
        out
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn del_releases_exactly_the_attachments_files() {
        let t = TempDir::new("del-exact");
        let conf = conf(&t);
        assert_eq!(add(&conf, "a", "eth0"), ["10.0.0.2", "fd00::2"]);
        assert_eq!(add(&conf, "a", "eth1"), ["10.0.0.3", "fd00::3"]);
        assert_eq!(add(&conf, "b", "eth0"), ["10.0.0.4", "fd00::4"]);
        fs::write(t.0.join("n/10.0.0.9"), "a").unwrap();
        // Every reservation is in the index now (the next locked scan reads nothing).
        HostLocal.del(&request(Command::Del, "nobody", "eth0", &conf)).unwrap();

        HostLocal.del(&request(Command::Del, "a", "eth0", &conf)).unwrap();
        let left = pairs(&[
            ("10.0.0.3", "a\r\neth1"),
            ("10.0.0.4", "b\r\neth0"),
            ("10.0.0.9", "a"),
            ("fd00::3", "a\r\neth1"),
            ("fd00::4", "b\r\neth0"),
        ]);
        assert_eq!(files(&t), left);
        // Now without files of its own, the attachment releases its container's old-format files (the
        // reference's rule), and then nothing more.
        let without_old = [&left[..2], &left[3..]].concat();
        HostLocal.del(&request(Command::Del, "a", "eth0", &conf)).unwrap();
        assert_eq!(files(&t), without_old);
        HostLocal.del(&request(Command::Del, "a", "eth0", &conf)).unwrap();
        assert_eq!(files(&t), without_old);
    }

    #[test]
    fn del_add_and_gc_do_not_trust_a_stale_index() {
        let t = TempDir::new("stale");
        let conf = conf(&t);
        assert_eq!(add(&conf, "a", "eth0"), ["10.0.0.2", "fd00::2"]);
        assert_eq!(add(&conf, "b", "eth0"), ["10.0.0.3", "fd00::3"]);
        // Behind the index's back, b's v4 address now belongs to c, a's v4 address to d.
        rewrite_in_place(&t.0.join("n/10.0.0.3"), "c\r\neth0");
        rewrite_in_place(&t.0.join("n/10.0.0.2"), "d\r\neth0");

        // DEL of b releases only the file that still says b.
        HostLocal.del(&request(Command::Del, "b", "eth0", &conf)).unwrap();
        assert!(t.0.join("n/10.0.0.3").exists());
        assert!(!t.0.join("n/fd00::3").exists());
        // A repeated ADD of a does not return the address d holds now; it keeps its v6 address.
        assert_eq!(add(&conf, "a", "eth0"), ["10.0.0.4", "fd00::2"]);
        assert_eq!(fs::read_to_string(t.0.join("n/10.0.0.2")).unwrap(), "d\r\neth0");

        // GC keeping only c: the index says .4 is a's, the file says it is c's now.
        rewrite_in_place(&t.0.join("n/10.0.0.4"), "c\r\neth1");
        let mut gc = conf.clone();
        gc["cni.dev/valid-attachments"] =
            json!([{"containerID": "c", "ifname": "eth0"}, {"containerID": "c", "ifname": "eth1"}]);
        HostLocal.gc(&request(Command::Gc, "", "", &gc)).unwrap();
        assert_eq!(files(&t), pairs(&[("10.0.0.3", "c\r\neth0"), ("10.0.0.4", "c\r\neth1")]));
    }

    #[test]
    fn args_cni_ips_supersede_cni_args_ip() {
        let t = TempDir::new("args-ips");
        let mut conf = conf(&t);
        conf["args"] = json!({"cni": {"ips": ["10.0.0.7"]}});
        let mut req = request(Command::Add, "a", "eth0", &conf);
        // Valid but different, then not even an address: neither is read.
        for cni_args in ["IP=10.0.0.9", "IP=nonsense"] {
            req.args = libcni::args::CniArgs::parse(cni_args).unwrap();
            let result = HostLocal.add(&req).unwrap();
            let ips: Vec<String> = result.ips.iter().map(|c| c.address.ip().to_string()).collect();
            assert_eq!(ips, ["10.0.0.7", "fd00::2"], "{cni_args}");
        }
        assert!(!t.0.join("n/10.0.0.9").exists());
        // Without args.cni.ips, CNI_ARGS IP is honoured.
        conf.as_object_mut().unwrap().remove("args");
        let mut req = request(Command::Add, "b", "eth0", &conf);
        req.args = libcni::args::CniArgs::parse("IP=10.0.0.9").unwrap();
        assert_eq!(HostLocal.add(&req).unwrap().ips[0].address.ip().to_string(), "10.0.0.9");
    }

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

//! sbr: source-based routing for the pod's interface, laid out as the reference plugin lays it out,
//! so a node can switch between the two.
//!
//! For each address of `CNI_IFNAME` in prevResult, in order, ADD picks a table (the first from 100
//! that no rule and no route uses; the next address gets the next free one: IPv4 100, IPv6 101 for
//! a dual-stack pod), adds the rule `from <ip> lookup <table>` (no priority: the kernel puts it just
//! before the last rules, 32765 on a fresh namespace), a default route via the address's gateway,
//! and a copy of each of the interface's main-table routes that belongs to the address (its gateway
//! or preferred source is in the address's subnet, or it has neither); then the interface's routes
//! leave main. With `table` set it only adds the rules (the routes are managed elsewhere).
//!
//! DEL removes the rules whose source is an address of the interface (or of prevResult), and the
//! interface's routes from the tables it chose; CHECK verifies the rules and default routes.

pub mod config;

use config::SbrConfig;
use ipnetwork::IpNetwork;
use libcni::types::IpConfig;
use libcni::{code, CniResult, Error, Errors, Plugin, Request, Result};
use netkit::netlink::{Netlink, RawRoute, RouteSpec, Rule};
use netkit::netns::{container_netns, container_netns_for_del};
use std::net::IpAddr;

/// The first table the reference picks from.
pub const FIRST_TABLE: u32 = 100;
const RT_SCOPE_LINK: u8 = 253;

pub struct Sbr;

/// The addresses of prevResult that belong to `ifname`: those without an interface index, with an
/// index out of range, or whose interface has that name (the reference's reading).
pub fn addresses_of<'a>(prev: &'a CniResult, ifname: &str) -> Vec<&'a IpConfig> {
    prev.ips
        .iter()
        .filter(|ip| match ip.interface {
            Some(i) if i < prev.interfaces.len() => prev.interfaces[i].name == ifname,
            _ => true,
        })
        .collect()
}

fn contains(net: &IpNetwork, ip: Option<IpAddr>) -> bool {
    ip.is_some_and(|ip| net.is_ipv4() == ip.is_ipv4() && net.contains(ip))
}

/// What ADD changed, to undo it when a later step fails.
#[derive(Default)]
struct Undo {
    rules: Vec<(IpAddr, u32)>,
    added: Vec<RouteSpec>,
    copied: Vec<RawRoute>,
    removed_from_main: Vec<RawRoute>,
}

impl Undo {
    fn run(self, nl: &Netlink) {
        for r in self.removed_from_main.iter().rev() {
            let _ = nl.restore_route(r);
        }
        for r in &self.copied {
            let _ = nl.del_raw_route(r);
        }
        for r in &self.added {
            let _ = nl.del_route(r);
        }
        if let Ok(rules) = nl.rules(None) {
            for rule in rules {
                let ours =
                    self.rules.iter().any(|(ip, t)| rule.src().map(|s| s.ip()) == Some(*ip) && rule.table() == *t);
                if ours && rule.is_plain_source_lookup() {
                    let _ = nl.del_rule(&rule);
                }
            }
        }
    }
}

/// The first table from `from` that no rule looks up and no route is in.
fn next_free_table(from: u32, rules: &[Rule], routes: &[RawRoute]) -> u32 {
    let mut table = from;
    while rules.iter().any(|r| r.table() == table) || routes.iter().any(|r| r.table() == table) {
        table += 1;
    }
    table
}

fn add_rules_only(nl: &Netlink, ips: &[&IpConfig], table: u32, undo: &mut Undo) -> Result<()> {
    for ip in ips {
        nl.add_source_rule(ip.address.ip(), table)?;
        undo.rules.push((ip.address.ip(), table));
    }
    Ok(())
}

fn add_tables(
    nl: &Netlink,
    conf: &SbrConfig,
    ips: &[&IpConfig],
    link_index: u32,
    ifname: &str,
    undo: &mut Undo,
) -> Result<Vec<u32>> {
    let rules = nl.rules(None)?;
    let all_routes = nl.raw_routes(None)?;
    let mut table = next_free_table(FIRST_TABLE, &rules, &all_routes);
    let routes = nl.raw_routes_of(link_index)?;
    let mut tables = Vec::new();
    for ip in ips {
        let addr = ip.address.ip();
        nl.add_source_rule(addr, table)?;
        undo.rules.push((addr, table));
        if let Some(gw) = conf.gateway_for(addr, ip.gateway) {
            let mut default = RouteSpec::default_via(gw);
            default.oif = Some(link_index);
            default.table = Some(table);
            nl.add_route(&default)
                .map_err(|e| e.context(format_args!("default route via {gw} on {ifname} in table {table}")))?;
            undo.added.push(default);
        }
        for r in &routes {
            let generic = r.pref_src().is_none() && r.gateway().is_none();
            if generic || contains(&ip.address, r.pref_src()) || contains(&ip.address, r.gateway()) {
                undo.copied.push(nl.copy_route_to_table(r, table)?);
            }
        }
        tables.push(table);
        table = next_free_table(table + 1, &rules, &all_routes);
    }
    if conf.add_source_hints {
        // A subnet route with the address as preferred source stays in main for traffic that picks
        // no source; the rest leaves main. Best effort, as in the reference.
        for ip in ips {
            let subnet = IpNetwork::new(ip.address.network(), ip.address.prefix());
            let Ok(subnet) = subnet else { continue };
            let mut hint = RouteSpec::new(subnet);
            hint.oif = Some(link_index);
            hint.src = Some(ip.address.ip());
            hint.scope = Some(RT_SCOPE_LINK);
            if let Err(e) = nl.replace_route(&hint) {
                eprintln!("sbr: subnet route with source hint {subnet} src {}: {e}", ip.address.ip());
            }
        }
        for r in routes.iter().filter(|r| r.scope() != RT_SCOPE_LINK) {
            if let Err(e) = nl.del_raw_route(r) {
                eprintln!("sbr: remove {r} from main: {e}");
            }
        }
    } else {
        for r in &routes {
            nl.del_raw_route(r).map_err(|e| e.context(format_args!("move the routes of {ifname} out of main")))?;
            undo.removed_from_main.push(r.clone());
        }
    }
    Ok(tables)
}

impl Plugin for Sbr {
    /// The reference never loads CNI_ARGS.
    fn reads_cni_args(&self) -> bool {
        false
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = SbrConfig::from_request(req)?;
        let prev = req.prev_result("sbr")?;
        let ips = addresses_of(prev, &req.ifname);
        if ips.is_empty() {
            return Err(Error::config(format!(
                "prevResult has no IP addresses for interface {}: sbr routes by source address",
                req.ifname
            )));
        }
        let ns = container_netns(req)?;
        // The reference's lock: an exclusive flock on the netns, so two sbr runs (ours or the
        // reference's) on one pod never pick the same table.
        let _lock = ns.lock()?;
        let nl = Netlink::open_in(&ns)?;
        let link = nl.link(&req.ifname)?.ok_or_else(|| {
            Error::network(format!("interface {} not found in netns {}", req.ifname, ns.path().display()))
        })?;
        let mut undo = Undo::default();
        let done = match conf.table {
            Some(table) => add_rules_only(&nl, &ips, table, &mut undo),
            None => add_tables(&nl, &conf, &ips, link.index, &req.ifname, &mut undo).map(drop),
        };
        if let Err(e) = done {
            undo.run(&nl);
            return Err(e);
        }
        Ok(prev.clone())
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = SbrConfig::from_request(req)?;
        let prev = req.prev_result("sbr")?;
        let ips = addresses_of(prev, &req.ifname);
        let ns = container_netns(req)?;
        let nl = Netlink::open_in(&ns)?;
        let drift = |msg: String| Error::new(code::CHECK_FAILED, msg);
        let link = nl.link(&req.ifname)?.ok_or_else(|| drift(format!("sbr: interface {} is gone", req.ifname)))?;
        let rules = nl.rules(None)?;
        let routes = nl.raw_routes(None)?;
        for ip in ips {
            let addr = ip.address.ip();
            let rule = rules.iter().find(|r| {
                r.is_plain_source_lookup()
                    && r.src().map(|s| s.ip()) == Some(addr)
                    && conf.table.is_none_or(|t| r.table() == t)
            });
            let Some(rule) = rule else {
                let table = conf.table.map_or_else(|| "its table".to_string(), |t| format!("table {t}"));
                return Err(drift(format!("sbr: no rule from {addr} lookup {table}")));
            };
            if conf.table.is_some() {
                continue;
            }
            if let Some(gw) = conf.gateway_for(addr, ip.gateway) {
                let table = rule.table();
                let found = routes.iter().any(|r| {
                    r.table() == table
                        && r.gateway() == Some(gw)
                        && r.oif() == Some(link.index)
                        && r.dst().is_some_and(|d| d.prefix() == 0)
                });
                if !found {
                    return Err(drift(format!("sbr: table {table} has no default route via {gw} on {}", req.ifname)));
                }
            }
        }
        Ok(())
    }

    /// Removes the rules from the interface's addresses (as the reference does), or from
    /// prevResult's when the interface is already gone, and the interface's routes from the tables
    /// those rules looked up (a configured `table` is left alone: sbr did not fill it). Nothing to do
    /// when the netns is gone.
    fn del(&self, req: &Request) -> Result<()> {
        // A key that no longer validates does not say which rules to remove: go on without it.
        let conf = SbrConfig::from_request(req).unwrap_or_default();
        let Some(ns) = container_netns_for_del(req)? else { return Ok(()) };
        let _lock = ns.lock()?;
        let nl = Netlink::open_in(&ns)?;
        let link = nl.link(&req.ifname)?;
        let mut addrs: Vec<IpAddr> = Vec::new();
        if let Some(link) = &link {
            addrs.extend(nl.addresses(link.index)?.iter().map(|a| a.ip()));
        }
        if let Some(prev) = &req.conf.prev_result {
            addrs.extend(addresses_of(prev, &req.ifname).iter().map(|ip| ip.address.ip()));
        }
        if addrs.is_empty() {
            return Ok(());
        }
        let mut errors = Errors::new();
        let mut emptied = Vec::new();
        for rule in nl.rules(None)? {
            let from_ours = rule.src().is_some_and(|s| addrs.contains(&s.ip()));
            if !from_ours || !rule.is_plain_source_lookup() || conf.table.is_some_and(|t| rule.table() != t) {
                continue;
            }
            if errors.record(nl.del_rule(&rule)).is_some() {
                emptied.push(rule.table());
            }
        }
        if let (None, Some(link)) = (conf.table, &link) {
            let still_used = nl.rules(None)?;
            for route in nl.raw_routes(None)? {
                let table = route.table();
                if route.oif() == Some(link.index)
                    && emptied.contains(&table)
                    && !still_used.iter().any(|r| r.table() == table)
                {
                    errors.record(nl.del_raw_route(&route));
                }
            }
        }
        errors.finish()
    }
}

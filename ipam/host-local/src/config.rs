//! The host-local configuration, parsed and validated once: the `ipam` object of the netconf plus the
//! requested addresses (CNI_ARGS `IP`, `args.cni.ips`, `runtimeConfig.ips`) and `runtimeConfig.ipRanges`.
//! Every problem is code 7 (4 for CNI_ARGS) with a message naming the key.

use crate::alloc::{Range, RangeSet};
use ipnetwork::IpNetwork;
use libcni::args::CniArgs;
use libcni::conf::{kind, lenient_bool_value, NetConf};
use libcni::gojson::{self, array, invalid, non_null, object};
use libcni::types::{self, Route};
use libcni::{version, Error, Result};
use serde_json::{Map, Value};
use std::net::IpAddr;
use std::path::PathBuf;

pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

#[derive(Debug, Clone)]
pub struct IpamConfig {
    /// The netconf's `name`: the directory under dataDir.
    pub network: String,
    pub cni_version: String,
    /// In allocation order: runtimeConfig.ipRanges, then the legacy top-level subnet, then `ranges`.
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    pub data_dir: PathBuf,
    pub resolv_conf: Option<PathBuf>,
    /// `keepReservationsOnReboot`: when false (the default), the first ADD after a reboot releases the
    /// reservations made in earlier boots.
    pub keep_reservations_on_reboot: bool,
    /// Requested addresses, deduplicated, in the order given.
    pub requested: Vec<IpAddr>,
}

/// `path.key` with the key as the config wrote it, for messages.
fn key_path(obj: &Map<String, Value>, key: &str, path: &str) -> String {
    format!("{path}.{}", gojson::get(obj, key).map_or(key, |(written, _)| written))
}

/// A string key; absent, null and "" are all "not set" (Go leaves such fields at their zero value).
fn opt_str<'a>(obj: &'a Map<String, Value>, key: &str, path: &str) -> Result<Option<&'a str>> {
    match non_null(obj, key) {
        None => Ok(None),
        Some((_, Value::String(s))) if s.is_empty() => Ok(None),
        Some((_, Value::String(s))) => Ok(Some(s)),
        Some((written, other)) => {
            Err(invalid(&format!("{path}.{written}"), format!("must be a string, got {}", kind(other))))
        }
    }
}

/// A bool key (JSON or the strings "true"/"false", as libcni accepts them); absent or null is false.
fn opt_bool(obj: &Map<String, Value>, key: &str, path: &str) -> Result<bool> {
    match non_null(obj, key) {
        None => Ok(false),
        Some((written, v)) => lenient_bool_value(v)
            .ok_or_else(|| invalid(&format!("{path}.{written}"), format!("must be true or false, got {}", kind(v)))),
    }
}

/// An address as Go's `net.ParseIP` reads it; IPv4-mapped IPv6 becomes IPv4, as Go canonicalizes it.
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    text.trim().parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// `addr/prefix`, strictly (a bare address is not a CIDR).
pub fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let (addr, prefix) = text.split_once('/')?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let addr: IpAddr = addr.parse().ok()?;
    IpNetwork::new(addr, prefix.parse().ok()?).ok()
}

fn opt_ip(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<IpAddr>> {
    match opt_str(obj, key, path)? {
        None => Ok(None),
        Some(text) => parse_ip(text)
            .map(Some)
            .ok_or_else(|| invalid(&key_path(obj, key, path), format!("{text:?} is not an IP address"))),
    }
}

/// One range object `{subnet, rangeStart, rangeEnd, gateway}`, with the reference's defaults and checks.
fn parse_range(obj: &Map<String, Value>, path: &str) -> Result<Range> {
    let subnet_key = key_path(obj, "subnet", path);
    let text = opt_str(obj, "subnet", path)?.ok_or_else(|| invalid(&subnet_key, "missing"))?;
    let subnet =
        parse_cidr(text).ok_or_else(|| invalid(&subnet_key, format!("{text:?} is not a CIDR (address/prefix)")))?;
    let max = if subnet.is_ipv4() { 32 } else { 128 };
    if subnet.prefix() > max - 2 {
        return Err(invalid(
            &subnet_key,
            format!("network {text} too small to allocate from: the prefix must be at most /{}", max - 2),
        ));
    }
    if subnet.ip() != subnet.network() {
        return Err(invalid(
            &subnet_key,
            format!("{text} has host bits set: for a /{} the network address is {}", subnet.prefix(), subnet.network()),
        ));
    }
    let subnet = IpNetwork::new(subnet.network(), subnet.prefix()).map_err(|e| invalid(&subnet_key, e))?;
    let addr = |key: &str| -> Result<Option<IpAddr>> {
        let ip = opt_ip(obj, key, path)?;
        if let Some(ip) = ip {
            if ip.is_ipv4() != subnet.is_ipv4() {
                return Err(invalid(
                    &key_path(obj, key, path),
                    format!("{ip} is not of the family of subnet {subnet}"),
                ));
            }
        }
        Ok(ip)
    };
    let start = addr("rangeStart")?;
    let end = addr("rangeEnd")?;
    let gateway = addr("gateway")?;
    for (key, ip) in [("rangeStart", start), ("rangeEnd", end)] {
        if let Some(ip) = ip {
            if !subnet.contains(ip) {
                return Err(invalid(&key_path(obj, key, path), format!("{ip} not in network {subnet}")));
            }
        }
    }
    let range = Range::with_defaults(subnet, start, end, gateway);
    if crate::alloc::to_u128(range.start) > crate::alloc::to_u128(range.end) {
        return Err(invalid(path, format!("rangeStart {} is after rangeEnd {}", range.start, range.end)));
    }
    Ok(range)
}

/// One set: an array of range objects, one family, no overlap inside.
fn parse_set(v: &Value, path: &str) -> Result<RangeSet> {
    let items = array(v, path)?;
    if items.is_empty() {
        return Err(invalid(path, "a range set needs at least one range"));
    }
    let mut ranges: Vec<Range> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let range = parse_range(object(item, &p)?, &p)?;
        if let Some(first) = ranges.first() {
            if first.is_ipv4() != range.is_ipv4() {
                return Err(invalid(&p, "mixed address families in one range set"));
            }
        }
        if let Some(j) = ranges.iter().position(|r| r.overlaps(&range)) {
            return Err(invalid(&p, format!("range {range} overlaps with {path}[{j}] ({})", ranges[j])));
        }
        ranges.push(range);
    }
    Ok(RangeSet { ranges })
}

fn parse_sets(v: &Value, path: &str) -> Result<Vec<RangeSet>> {
    array(v, path)?.iter().enumerate().map(|(i, set)| parse_set(set, &format!("{path}[{i}]"))).collect()
}

/// Requested addresses from a JSON list: plain addresses or CIDRs (whose address part is used).
fn requested_list(v: &Value, path: &str, out: &mut Vec<IpAddr>) -> Result<()> {
    for (i, item) in array(v, path)?.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let text = item.as_str().ok_or_else(|| invalid(&p, format!("must be a string, got {}", kind(item))))?;
        let ip = parse_ip(text)
            .or_else(|| parse_cidr(text).map(|n| n.ip().to_canonical()))
            .ok_or_else(|| invalid(&p, format!("{text:?} is not an IP address")))?;
        out.push(ip);
    }
    Ok(())
}

fn ipam_object(conf: &NetConf) -> Result<&Map<String, Value>> {
    let ipam = conf.ipam.as_ref().ok_or_else(|| Error::config("netconf has no \"ipam\" object"))?;
    object(ipam, "ipam")
}

fn data_dir(ipam: &Map<String, Value>) -> Result<PathBuf> {
    let data_dir = PathBuf::from(opt_str(ipam, "dataDir", "ipam")?.unwrap_or(DEFAULT_DATA_DIR));
    if !data_dir.is_absolute() {
        return Err(invalid(
            &key_path(ipam, "dataDir", "ipam"),
            format!("{} must be an absolute path", data_dir.display()),
        ));
    }
    Ok(data_dir)
}

/// Where a network's reservations live: (network name, dataDir). All that DEL and GC need, so they keep
/// working when the ranges no longer validate (a config edited since ADD).
pub fn store_location(conf: &NetConf) -> Result<(String, PathBuf)> {
    Ok((conf.name.clone(), data_dir(ipam_object(conf)?)?))
}

impl IpamConfig {
    /// The whole configuration. `cni_args` is given for ADD only: requested addresses matter nowhere else,
    /// and a bad one must not make DEL, CHECK or STATUS fail.
    pub fn parse(conf: &NetConf, cni_args: Option<&CniArgs>) -> Result<IpamConfig> {
        let ipam = ipam_object(conf)?;

        let mut range_sets = Vec::new();
        if let Some((k, v)) = non_null(&conf.runtime_config, "ipRanges") {
            range_sets.extend(parse_sets(v, &format!("runtimeConfig.{k}"))?);
        }
        if opt_str(ipam, "subnet", "ipam")?.is_some() {
            range_sets.push(RangeSet { ranges: vec![parse_range(ipam, "ipam")?] });
        }
        // Like the reference, a top-level rangeStart/rangeEnd/gateway without a subnet is ignored.
        if let Some((k, v)) = non_null(ipam, "ranges") {
            range_sets.extend(parse_sets(v, &format!("ipam.{k}"))?);
        }
        if range_sets.is_empty() {
            return Err(Error::config("ipam: no IP ranges specified (set ipam.ranges or ipam.subnet)"));
        }
        for (i, a) in range_sets.iter().enumerate() {
            if let Some(j) = range_sets.iter().skip(i + 1).position(|b| a.overlaps(b)) {
                return Err(Error::config(format!("ipam: range set {i} overlaps with range set {}", i + 1 + j)));
            }
        }
        let v4 = range_sets.iter().filter(|s| s.is_ipv4()).count();
        version::check_addresses_per_family(&conf.cni_version, v4, range_sets.len() - v4)?;

        let routes = types::routes(ipam, "ipam")?;

        let data_dir = data_dir(ipam)?;
        let resolv_conf = opt_str(ipam, "resolvConf", "ipam")?.map(PathBuf::from);
        let keep_reservations_on_reboot = opt_bool(ipam, "keepReservationsOnReboot", "ipam")?;

        let mut requested = Vec::new();
        if let Some(cni_args) = cni_args {
            let mut from_args = Vec::new();
            if let Some((c, cni)) = non_null(&conf.args, "cni") {
                let path = format!("args.{c}");
                if let Some((k, v)) = non_null(object(cni, &path)?, "ips") {
                    requested_list(v, &format!("{path}.{k}"), &mut from_args)?;
                }
            }
            // CONVENTIONS.md: `args.cni.ips` supersedes the deprecated `CNI_ARGS IP`, which is then not read
            // at all (so a stale or malformed `IP=` cannot fail an ADD that names its addresses in `args`).
            if from_args.is_empty() {
                if let Some(text) = cni_args.get("IP").filter(|s| !s.is_empty()) {
                    for item in text.split(',') {
                        let ip = parse_ip(item)
                            .ok_or_else(|| Error::env(format!("CNI_ARGS IP: {item:?} is not an IP address")))?;
                        requested.push(ip);
                    }
                }
            }
            requested.extend(from_args);
            if let Some((k, v)) = non_null(&conf.runtime_config, "ips") {
                requested_list(v, &format!("runtimeConfig.{k}"), &mut requested)?;
            }
        }
        let mut seen = std::collections::HashSet::new();
        requested.retain(|ip| seen.insert(*ip));

        Ok(IpamConfig {
            network: conf.name.clone(),
            cni_version: conf.cni_version.clone(),
            range_sets,
            routes,
            data_dir,
            resolv_conf,
            keep_reservations_on_reboot,
            requested,
        })
    }

    /// The requested address for each set (at most one each), or an error naming what fits no set.
    pub fn requested_per_set(&self) -> Result<Vec<Option<IpAddr>>> {
        let mut per_set = vec![None; self.range_sets.len()];
        let mut unplaced = Vec::new();
        for ip in &self.requested {
            let slot = self
                .range_sets
                .iter()
                .enumerate()
                .find(|(i, set)| per_set[*i].is_none() && set.contains(*ip))
                .map(|(i, _)| i);
            match slot {
                Some(i) => per_set[i] = Some(*ip),
                None => unplaced.push(ip.to_string()),
            }
        }
        if unplaced.is_empty() {
            Ok(per_set)
        } else {
            Err(Error::config(format!(
                "failed to allocate all requested IPs: {} (each must lie in a distinct range set: {})",
                unplaced.join(", "),
                self.range_sets.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
            )))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use libcni::conf::netconf_from_value;
    use serde_json::json;

    fn parse_with(v: Value, cni_args: &str) -> Result<IpamConfig> {
        let conf = netconf_from_value(&v).unwrap();
        IpamConfig::parse(&conf, Some(&CniArgs::parse(cni_args).unwrap()))
    }
    fn parse(ipam: Value) -> Result<IpamConfig> {
        parse_with(json!({"cniVersion": "1.0.0", "name": "net1", "type": "bridge", "ipam": ipam}), "")
    }
    fn err(ipam: Value) -> Error {
        parse(ipam).unwrap_err()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn legacy_subnet_is_prepended_with_defaults() {
        let c = parse(json!({"type": "host-local", "subnet": "10.1.0.0/16", "rangeStart": "10.1.0.10",
            "ranges": [[{"subnet": "fd00::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.1.0.254"}],
            "resolvConf": "/etc/resolv.conf"}))
        .unwrap();
        assert_eq!(c.network, "net1");
        assert_eq!(c.range_sets.len(), 2);
        let r = &c.range_sets[0].ranges[0];
        assert_eq!((r.start, r.end, r.gateway), (ip("10.1.0.10"), ip("10.1.255.254"), ip("10.1.0.1")));
        assert_eq!(c.range_sets[1].ranges[0].end, ip("fd00::ffff:ffff:ffff:ffff"));
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[1].gw, Some(ip("10.1.0.254")));
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(c.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
    }

    #[test]
    fn validation_errors_are_code_7_and_name_the_key() {
        let cases = [
            (json!({"subnet": "10.0.0.0/31"}), "ipam.subnet"),
            (json!({"subnet": "10.0.0.1/32"}), "ipam.subnet"),
            (json!({"ranges": [[{"subnet": "fd00::/127"}]]}), "ipam.ranges[0][0].subnet"),
            (json!({"ranges": [[{"subnet": "fd00::/128"}]]}), "ipam.ranges[0][0].subnet"),
            (json!({"subnet": "10.0.0.5/24"}), "host bits"),
            (json!({"subnet": "10.0.0.0"}), "ipam.subnet"),
            (json!({"subnet": "banana"}), "ipam.subnet"),
            (json!({"subnet": 5}), "ipam.subnet"),
            (json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"}), "ipam.rangeStart"),
            (json!({"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.1"}), "ipam.rangeEnd"),
            (json!({"subnet": "10.0.0.0/24", "gateway": "nope"}), "ipam.gateway"),
            (json!({"subnet": "10.0.0.0/24", "gateway": "fd00::1"}), "ipam.gateway"),
            (json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.3"}), "after rangeEnd"),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/16"}]]}),
                "range set 0 overlaps with range set 1",
            ),
            (json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]}), "ipam.ranges[0][1]"),
            (json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}), "mixed"),
            (json!({"ranges": [[]]}), "ipam.ranges[0]"),
            (json!({"ranges": "10.0.0.0/24"}), "ipam.ranges"),
            (json!({}), "no IP ranges"),
            (json!({"subnet": "10.0.0.0/24", "dataDir": "relative/dir"}), "ipam.dataDir"),
            (json!({"subnet": "10.0.0.0/24", "routes": [{"dst": "nope"}]}), "ipam.routes[0]"),
        ];
        for (ipam, needle) in cases {
            let e = err(ipam.clone());
            assert_eq!(e.code, 7, "{ipam}: {e}");
            assert!(e.msg.contains(needle), "{ipam}: {:?} lacks {needle:?}", e.msg);
        }
    }

    #[test]
    fn split_ranges_in_one_subnet_do_not_overlap() {
        let c = parse(json!({"ranges": [
            [{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.100"}],
            [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.101"}]]}))
        .unwrap();
        assert_eq!(c.range_sets.len(), 2);
    }

    #[test]
    fn old_versions_allow_one_address_per_family() {
        let v = json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]]}});
        assert_eq!(parse_with(v, "").unwrap_err().code, 7);
        let v = json!({"cniVersion": "0.2.0", "name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}});
        assert!(parse_with(v, "").is_ok());
    }

    #[test]
    fn requested_ips_from_every_source_and_ip_ranges_prepended() {
        let v = json!({"cniVersion": "1.0.0", "name": "n",
            "ipam": {"subnet": "10.0.0.0/24", "ranges": [[{"subnet": "fd00::/64"}]]},
            "args": {"cni": {"ips": ["10.0.0.7"]}},
            "runtimeConfig": {"ips": ["fd00::9/64", "10.0.0.7"], "ipRanges": [[{"subnet": "192.168.0.0/24"}]]}});
        let c = parse_with(v.clone(), "IP=10.0.0.5,::ffff:192.168.0.4").unwrap();
        // CNI_ARGS IP is ignored because args.cni.ips is set.
        assert_eq!(c.requested, ["10.0.0.7", "fd00::9"].map(ip));
        let mut without_args = v;
        without_args.as_object_mut().unwrap().remove("args");
        let c = parse_with(without_args, "IP=10.0.0.5,::ffff:192.168.0.4").unwrap();
        assert_eq!(c.requested, ["10.0.0.5", "192.168.0.4", "fd00::9", "10.0.0.7"].map(ip));
        assert_eq!(c.range_sets[0].ranges[0].subnet.to_string(), "192.168.0.0/24");
        assert_eq!(c.range_sets[1].ranges[0].subnet.to_string(), "10.0.0.0/24");
        // Two requests for the first v4 set: one is left over.
        let e = c.requested_per_set().unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("10.0.0.7"), "{e}");
    }

    #[test]
    fn requested_per_set_places_each_address() {
        let v = json!({"cniVersion": "1.0.0", "name": "n",
            "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}});
        let c = parse_with(v.clone(), "IP=fd00::5").unwrap();
        assert_eq!(c.requested_per_set().unwrap(), vec![None, Some(ip("fd00::5"))]);
        assert_eq!(parse_with(v.clone(), "IP=nonsense").unwrap_err().code, 4);
        let c = parse_with(v, "IP=10.9.9.9").unwrap();
        assert_eq!(c.requested_per_set().unwrap_err().code, 7);
    }

    /// containerd's go-cni sends `IPRanges{Subnet,RangeStart,RangeEnd,Gateway}` without JSON tags, and Go
    /// decodes any key of the netconf case-insensitively; so do we.
    #[test]
    fn go_style_keys_as_containerd_sends_them() {
        let v = json!({"cniVersion": "1.0.0", "name": "n",
            "ipam": {"Type": "host-local", "Ranges": [[{"Subnet": "fd00::/64"}]], "DataDir": "/run/x",
                     "Routes": [{"Dst": "0.0.0.0/0", "GW": "10.1.0.254"}], "ResolvConf": "/etc/resolv.conf"},
            "Args": {"CNI": {"IPs": ["10.1.0.9"]}},
            "RuntimeConfig": {"IPRanges": [[{"Subnet": "10.1.0.0/16", "RangeStart": "10.1.0.5", "RangeEnd": "10.1.0.50", "Gateway": ""}]],
                              "IPs": ["fd00::7"]}});
        let c = parse_with(v, "").unwrap();
        let r = &c.range_sets[0].ranges[0];
        assert_eq!(r.subnet.to_string(), "10.1.0.0/16");
        assert_eq!((r.start, r.end, r.gateway), (ip("10.1.0.5"), ip("10.1.0.50"), ip("10.1.0.1")));
        assert_eq!(c.range_sets[1].ranges[0].subnet.to_string(), "fd00::/64");
        assert_eq!(c.routes[0].gw, Some(ip("10.1.0.254")));
        assert_eq!(c.data_dir, PathBuf::from("/run/x"));
        assert_eq!(c.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
        assert_eq!(c.requested, [ip("10.1.0.9"), ip("fd00::7")]);
        // Messages name keys as written.
        let v = json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}]]},
            "runtimeConfig": {"ipRanges": [[{"Subnet": "10.1.0.0/16", "RangeStart": "10.2.0.1"}]]}});
        let e = parse_with(v, "").unwrap_err();
        assert!(e.msg.contains("runtimeConfig.ipRanges[0][0].RangeStart"), "{e}");
        let e = err(json!({"Subnet": 5}));
        assert!(e.msg.contains("ipam.Subnet"), "{e}");
    }
}

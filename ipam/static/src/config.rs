//! The static IPAM configuration, parsed and validated once: the `ipam` object (`addresses`, `routes`,
//! `dns`) and the addresses the runtime asks for, in the reference's order of precedence:
//!
//! 1. `runtimeConfig.ips` (the `ips` capability) replaces every other source;
//! 2. else `args.cni.ips` replaces the configured addresses;
//! 3. else the configured `addresses`, followed by CNI_ARGS `IP` (comma separated CIDRs); CNI_ARGS
//!    `GATEWAY` (comma separated addresses) becomes the gateway of each `IP` address whose subnet
//!    contains it.
//!
//! Configuration problems are code 7, CNI_ARGS problems code 4, each naming the key.

use ipnetwork::IpNetwork;
use libcni::args::CniArgs;
use libcni::conf::{kind, NetConf};
use libcni::gojson::{self, array, invalid, non_null, object};
use libcni::types::{self, Dns, Route};
use libcni::{version, Error, Result};
use serde_json::{Map, Value};
use std::net::IpAddr;

/// One address handed out, with its gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// The address with its prefix, host bits kept (`10.1.0.5/24`).
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
}

/// Where the addresses came from, for messages and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `ipam.addresses`, plus CNI_ARGS `IP` if given.
    Config,
    /// `args.cni.ips`.
    Args,
    /// `runtimeConfig.ips`.
    Runtime,
}

#[derive(Debug, Clone)]
pub struct StaticConfig {
    pub cni_version: String,
    pub addresses: Vec<Address>,
    pub source: Source,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

/// `addr/prefix` as Go's `net.ParseCIDR` reads it: a bare address is not a CIDR. An IPv4-mapped
/// IPv6 address becomes IPv4, as Go canonicalizes it.
pub fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let (addr, prefix) = text.split_once('/')?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let addr: IpAddr = addr.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    match addr {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() && prefix >= 96 => {
            IpNetwork::new(IpAddr::V4(v6.to_ipv4_mapped()?), prefix - 96).ok()
        }
        _ => IpNetwork::new(addr, prefix).ok(),
    }
}

/// An address as Go's `net.ParseIP` reads it, canonical.
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// `ipam.addresses`: `[{address, gateway}]`.
fn config_addresses(ipam: &Map<String, Value>) -> Result<Vec<Address>> {
    let Some((key, v)) = non_null(ipam, "addresses") else { return Ok(Vec::new()) };
    let path = format!("ipam.{key}");
    let mut out = Vec::new();
    for (i, item) in array(v, &path)?.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let obj = object(item, &p)?;
        let (akey, text) = match non_null(obj, "address") {
            Some((k, Value::String(s))) => (k, s.as_str()),
            Some((k, other)) => {
                return Err(invalid(&format!("{p}.{k}"), format!("must be a string, got {}", kind(other))))
            }
            None => {
                return Err(invalid(&format!("{p}.address"), "missing (an address with its prefix, e.g. 10.1.0.5/24)"))
            }
        };
        let address = parse_cidr(text).ok_or_else(|| {
            invalid(
                &format!("{p}.{akey}"),
                format!("{text:?} is not in CIDR notation (address/prefix, e.g. 10.1.0.5/24)"),
            )
        })?;
        let gateway = match non_null(obj, "gateway") {
            None => None,
            Some((_, Value::String(s))) if s.is_empty() => None,
            Some((gkey, Value::String(s))) => {
                let gw = parse_ip(s)
                    .ok_or_else(|| invalid(&format!("{p}.{gkey}"), format!("{s:?} is not an IP address")))?;
                if gw.is_ipv4() != address.is_ipv4() {
                    return Err(invalid(
                        &format!("{p}.{gkey}"),
                        format!("gateway {gw} is {} but address {address} is {}", family(gw), family(address.ip())),
                    ));
                }
                Some(gw)
            }
            Some((gkey, other)) => {
                return Err(invalid(&format!("{p}.{gkey}"), format!("must be a string, got {}", kind(other))))
            }
        };
        out.push(Address { address, gateway });
    }
    Ok(out)
}

/// A list of CIDR strings (`args.cni.ips`, `runtimeConfig.ips`).
fn cidr_list(v: &Value, path: &str) -> Result<Vec<Address>> {
    let mut out = Vec::new();
    for (i, item) in array(v, path)?.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let text = item.as_str().ok_or_else(|| invalid(&p, format!("must be a string, got {}", kind(item))))?;
        let address = parse_cidr(text).ok_or_else(|| {
            invalid(&p, format!("{text:?} is not in CIDR notation (address/prefix, e.g. 10.1.0.5/24)"))
        })?;
        out.push(Address { address, gateway: None });
    }
    Ok(out)
}

/// CNI_ARGS `IP` appended to the configured addresses, and `GATEWAY` set on those of them whose
/// subnet contains it (code 4 on a bad value). As in the reference, GATEWAY never changes a
/// configured address's gateway.
fn apply_cni_args(addresses: &mut Vec<Address>, args: &CniArgs) -> Result<()> {
    let configured = addresses.len();
    if let Some(text) = args.get("IP").filter(|s| !s.is_empty()) {
        for item in text.split(',') {
            let item = item.trim();
            let address = parse_cidr(item).ok_or_else(|| {
                Error::env(format!("CNI_ARGS IP: {item:?} is not in CIDR notation (address/prefix, e.g. 10.1.0.5/24)"))
            })?;
            addresses.push(Address { address, gateway: None });
        }
    }
    if let Some(text) = args.get("GATEWAY").filter(|s| !s.is_empty()) {
        for item in text.split(',') {
            let gw = parse_ip(item.trim())
                .ok_or_else(|| Error::env(format!("CNI_ARGS GATEWAY: {item:?} is not an IP address")))?;
            for a in addresses[configured..].iter_mut().filter(|a| a.address.contains(gw)) {
                a.gateway = Some(gw);
            }
        }
    }
    Ok(())
}

impl StaticConfig {
    /// The whole configuration; `cni_args` is CNI_ARGS of the call (its `IP` and `GATEWAY`).
    pub fn parse(conf: &NetConf, cni_args: &CniArgs) -> Result<StaticConfig> {
        let ipam = conf.ipam.as_ref().ok_or_else(|| Error::config("netconf has no \"ipam\" object"))?;
        let ipam = object(ipam, "ipam")?;

        let mut addresses = config_addresses(ipam)?;
        let mut source = Source::Config;
        if let Some((k, v)) = non_null(&conf.runtime_config, "ips") {
            let from_runtime = cidr_list(v, &format!("runtimeConfig.{k}"))?;
            if !from_runtime.is_empty() {
                addresses = from_runtime;
                source = Source::Runtime;
            }
        }
        if source == Source::Config {
            if let Some((c, cni)) = non_null(&conf.args, "cni") {
                let path = format!("args.{c}");
                if let Some((k, v)) = non_null(object(cni, &path)?, "ips") {
                    let from_args = cidr_list(v, &format!("{path}.{k}"))?;
                    if !from_args.is_empty() {
                        addresses = from_args;
                        source = Source::Args;
                    }
                }
            }
        }
        // CNI_ARGS adds to the configured addresses only: a higher source replaced them, and then
        // IP/GATEWAY are not read (a stale value cannot fail an ADD that names its addresses).
        if source == Source::Config {
            apply_cni_args(&mut addresses, cni_args)?;
        }

        for (i, a) in addresses.iter().enumerate() {
            if let Some(j) = addresses[..i].iter().position(|b| b.address.ip() == a.address.ip()) {
                return Err(Error::config(format!(
                    "ipam: address {} is given twice (entries {j} and {i}); each address may appear once",
                    a.address.ip()
                )));
            }
        }
        let v4 = addresses.iter().filter(|a| a.address.is_ipv4()).count();
        version::check_addresses_per_family(&conf.cni_version, v4, addresses.len() - v4)?;

        let routes = types::routes(ipam, "ipam")?;
        let dns = match non_null(ipam, "dns") {
            None => Dns::default(),
            Some((k, v)) => gojson::from_value(v).map_err(|e| invalid(&format!("ipam.{k}"), e))?,
        };

        Ok(StaticConfig { cni_version: conf.cni_version.clone(), addresses, source, routes, dns })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use libcni::conf::netconf_from_value;
    use serde_json::json;

    fn parse_full(v: Value, cni_args: &str) -> Result<StaticConfig> {
        let conf = netconf_from_value(&v).unwrap();
        StaticConfig::parse(&conf, &CniArgs::parse(cni_args).unwrap())
    }
    fn conf(ipam: Value) -> Value {
        json!({"cniVersion": "1.0.0", "name": "net1", "type": "bridge", "ipam": ipam})
    }
    fn parse(ipam: Value) -> Result<StaticConfig> {
        parse_full(conf(ipam), "")
    }
    fn addrs(c: &StaticConfig) -> Vec<(String, Option<String>)> {
        c.addresses.iter().map(|a| (a.address.to_string(), a.gateway.map(|g| g.to_string()))).collect()
    }
    fn pair(a: &str, g: Option<&str>) -> (String, Option<String>) {
        (a.to_string(), g.map(str::to_string))
    }

    #[test]
    fn every_key() {
        let c = parse(json!({"type": "static",
            "addresses": [{"address": "10.10.0.5/24", "gateway": "10.10.0.1"}, {"address": "fd00::5/64"}],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.0.254", "mtu": 1400,
                        "advmss": 1360, "priority": 10, "table": 100, "scope": 0}],
            "dns": {"nameservers": ["10.10.0.53"], "domain": "example.com", "search": ["a.example.com"],
                    "options": ["ndots:2"]}}))
        .unwrap();
        assert_eq!(addrs(&c), [pair("10.10.0.5/24", Some("10.10.0.1")), pair("fd00::5/64", None)]);
        assert_eq!(c.source, Source::Config);
        assert_eq!(c.routes.len(), 2);
        let r = &c.routes[1];
        assert_eq!(r.gw, Some("10.10.0.254".parse().unwrap()));
        assert_eq!(
            (r.mtu, r.advmss, r.priority, r.table, r.scope),
            (Some(1400), Some(1360), Some(10), Some(100), Some(0))
        );
        assert_eq!(c.dns.nameservers, ["10.10.0.53"]);
        assert_eq!(c.dns.domain.as_deref(), Some("example.com"));
        assert_eq!(c.dns.search, ["a.example.com"]);
        assert_eq!(c.dns.options, ["ndots:2"]);
    }

    #[test]
    fn keys_match_as_go_decodes_them() {
        let c = parse(json!({"Addresses": [{"Address": "10.10.0.5/24", "GATEWAY": "10.10.0.1"}],
            "ROUTES": [{"Dst": "0.0.0.0/0"}], "DNS": {"Nameservers": ["1.1.1.1"]}}))
        .unwrap();
        assert_eq!(addrs(&c), [pair("10.10.0.5/24", Some("10.10.0.1"))]);
        assert_eq!(c.routes.len(), 1);
        assert_eq!(c.dns.nameservers, ["1.1.1.1"]);
    }

    #[test]
    fn defaults_are_empty() {
        let c = parse(json!({"type": "static"})).unwrap();
        assert!(c.addresses.is_empty() && c.routes.is_empty() && c.dns.is_empty());
        let c = parse(json!({"addresses": null, "routes": null, "dns": null})).unwrap();
        assert!(c.addresses.is_empty() && c.routes.is_empty() && c.dns.is_empty());
    }

    #[test]
    fn precedence_runtime_then_args_then_config_plus_cni_args() {
        let ipam = json!({"addresses": [{"address": "10.10.0.5/24", "gateway": "10.10.0.1"}]});
        let mut full = conf(ipam.clone());
        // Config, plus CNI_ARGS IP appended, with GATEWAY set where it fits.
        let c = parse_full(full.clone(), "IP=10.20.0.5/24,fd00::5/64;GATEWAY=10.20.0.1").unwrap();
        assert_eq!(
            addrs(&c),
            [
                pair("10.10.0.5/24", Some("10.10.0.1")),
                pair("10.20.0.5/24", Some("10.20.0.1")),
                pair("fd00::5/64", None)
            ]
        );
        // GATEWAY leaves the configured addresses alone, even in its subnet (as the reference).
        let c = parse_full(full.clone(), "GATEWAY=10.10.0.254").unwrap();
        assert_eq!(addrs(&c), [pair("10.10.0.5/24", Some("10.10.0.1"))]);
        // args.cni.ips replaces the configured addresses and CNI_ARGS.
        full["args"] = json!({"cni": {"ips": ["10.30.0.5/24"]}});
        let c = parse_full(full.clone(), "IP=10.20.0.5/24").unwrap();
        assert_eq!((addrs(&c), c.source), (vec![pair("10.30.0.5/24", None)], Source::Args));
        // A malformed CNI_ARGS IP is not read then.
        assert!(parse_full(full.clone(), "IP=banana").is_ok());
        // runtimeConfig.ips replaces everything.
        full["runtimeConfig"] = json!({"ips": ["10.40.0.5/24", "fd00::40/64"]});
        let c = parse_full(full.clone(), "IP=10.20.0.5/24").unwrap();
        assert_eq!(
            (addrs(&c), c.source),
            (vec![pair("10.40.0.5/24", None), pair("fd00::40/64", None)], Source::Runtime)
        );
        // Empty lists do not replace.
        let mut empty = conf(ipam);
        empty["runtimeConfig"] = json!({"ips": []});
        empty["args"] = json!({"cni": {"ips": []}});
        assert_eq!(parse_full(empty, "").unwrap().source, Source::Config);
    }

    #[test]
    fn errors_are_code_7_and_name_the_key() {
        let cases = [
            (json!({"addresses": [{"address": "10.10.0.5"}]}), "ipam.addresses[0].address"),
            (json!({"addresses": [{"address": "banana/24"}]}), "ipam.addresses[0].address"),
            (json!({"addresses": [{"address": "10.10.0.5/33"}]}), "ipam.addresses[0].address"),
            (json!({"addresses": [{"address": 5}]}), "ipam.addresses[0].address"),
            (json!({"addresses": [{}]}), "ipam.addresses[0].address: missing"),
            (json!({"addresses": [{"address": "10.10.0.5/24", "gateway": "nope"}]}), "ipam.addresses[0].gateway"),
            (json!({"addresses": [{"address": "10.10.0.5/24", "gateway": "fd00::1"}]}), "is IPv6 but address"),
            (json!({"addresses": [{"address": "fd00::5/64", "gateway": "10.0.0.1"}]}), "is IPv4 but address"),
            (json!({"addresses": [{"address": "10.10.0.5/24"}, {"address": "10.10.0.5/16"}]}), "given twice"),
            (json!({"addresses": {"address": "10.10.0.5/24"}}), "ipam.addresses: must be an array"),
            (json!({"addresses": ["10.10.0.5/24"]}), "ipam.addresses[0]: must be an object"),
            (json!({"routes": [{"dst": "nope"}]}), "ipam.routes[0]"),
            (json!({"routes": [{"dst": "10.0.0.0/8", "gw": "x"}]}), "ipam.routes[0]"),
            (json!({"dns": {"nameservers": "1.1.1.1"}}), "ipam.dns"),
            (json!({"dns": []}), "ipam.dns"),
        ];
        for (ipam, needle) in cases {
            let e = parse(ipam.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{ipam}: {e}");
            assert!(e.msg.contains(needle), "{ipam}: {:?} lacks {needle:?}", e.msg);
        }
        let mut full = conf(json!({}));
        full["runtimeConfig"] = json!({"ips": ["10.0.0.5"]});
        assert!(parse_full(full.clone(), "").unwrap_err().msg.contains("runtimeConfig.ips[0]"));
        full["runtimeConfig"] = json!({"ips": ["10.0.0.5/24", "10.0.0.5/24"]});
        assert!(parse_full(full, "").unwrap_err().msg.contains("given twice"));
        let mut full = conf(json!({}));
        full["args"] = json!({"cni": {"ips": [7]}});
        assert!(parse_full(full, "").unwrap_err().msg.contains("args.cni.ips[0]"));
        let e = parse_full(json!({"cniVersion": "1.0.0", "name": "n", "type": "static"}), "").unwrap_err();
        assert_eq!(e.code, 7);
    }

    #[test]
    fn cni_args_errors_are_code_4() {
        for (args, needle) in [("IP=10.0.0.5", "CNI_ARGS IP"), ("IP=10.0.0.5/24;GATEWAY=x", "CNI_ARGS GATEWAY")] {
            let e = parse_full(conf(json!({})), args).unwrap_err();
            assert_eq!(e.code, 4, "{args}: {e}");
            assert!(e.msg.contains(needle), "{args}: {e}");
        }
    }

    #[test]
    fn old_versions_take_one_address_per_family() {
        let ipam = json!({"addresses": [{"address": "10.10.0.5/24"}, {"address": "10.20.0.5/24"}]});
        for v in ["0.1.0", "0.2.0"] {
            let e = parse_full(json!({"cniVersion": v, "name": "n", "type": "bridge", "ipam": ipam}), "").unwrap_err();
            assert!(e.msg.contains("does not support more than 1 address per family"), "{v}: {e}");
        }
        let ok = json!({"addresses": [{"address": "10.10.0.5/24"}, {"address": "fd00::5/64"}]});
        assert!(parse_full(json!({"cniVersion": "0.2.0", "name": "n", "type": "bridge", "ipam": ok}), "").is_ok());
        assert!(parse_full(json!({"cniVersion": "0.3.0", "name": "n", "type": "bridge", "ipam": ipam}), "").is_ok());
    }

    #[test]
    fn mapped_and_strict_cidrs() {
        assert_eq!(parse_cidr("::ffff:10.0.0.5/120").unwrap().to_string(), "10.0.0.5/24");
        for bad in ["10.0.0.5", "10.0.0.5/", "10.0.0.5/+8", "10.0.0.5/33", " 10.0.0.5/8", "x/8"] {
            assert!(parse_cidr(bad).is_none(), "{bad}");
        }
    }
}

//! The sbr configuration, parsed and validated once: `table`, `gateways`, `addSourceHints` (the
//! reference's keys) and the prevResult the plugin works from. Problems are code 7 naming the key.

use libcni::conf::{kind, lenient_bool_value};
use libcni::{gojson, Error, Request, Result};
use serde_json::{Map, Value};
use std::net::IpAddr;

/// Tables a rule must not send pod traffic to: unspec, default, main, local.
const RESERVED_TABLES: [u64; 4] = [0, 253, 254, 255];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SbrConfig {
    /// A fixed table: only the rules are added, the routes stay where they are (the table is
    /// managed elsewhere, e.g. by the routes' own `table` key). None: a table per address, chosen
    /// from 100 on, with the routes moved into it.
    pub table: Option<u32>,
    /// Gateways to use instead of prevResult's: at most one per family.
    pub gateway_v4: Option<IpAddr>,
    pub gateway_v6: Option<IpAddr>,
    /// Keep a subnet route with the address as preferred source in main, so traffic that does not
    /// pick a source still reaches the subnet; other routes of the interface leave main.
    pub add_source_hints: bool,
}

fn invalid(key: &str, why: impl std::fmt::Display) -> Error {
    Error::config(format!("{key}: {why}"))
}

fn non_null<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<(&'a str, &'a Value)> {
    gojson::get(obj, key).filter(|(_, v)| !v.is_null())
}

impl SbrConfig {
    pub fn parse(raw: &Value) -> Result<SbrConfig> {
        let obj = raw.as_object().ok_or_else(|| Error::config("network configuration must be an object"))?;
        let mut conf = SbrConfig::default();
        if let Some((k, v)) = non_null(obj, "table") {
            let t = v
                .as_u64()
                .filter(|t| *t <= u64::from(u32::MAX))
                .ok_or_else(|| invalid(k, format!("must be a routing table number (1-4294967295), got {v}")))?;
            if RESERVED_TABLES.contains(&t) {
                return Err(invalid(
                    k,
                    format!("table {t} is reserved (0 unspec, 253 default, 254 main, 255 local): pick another"),
                ));
            }
            conf.table = u32::try_from(t).ok();
        }
        if let Some((k, v)) = non_null(obj, "gateways") {
            let items = v.as_array().ok_or_else(|| invalid(k, format!("must be an array, got {}", kind(v))))?;
            if items.len() > 2 {
                return Err(invalid(k, "cannot contain more than 2 entries (one IPv4, one IPv6)"));
            }
            for (i, item) in items.iter().enumerate() {
                let p = format!("{k}[{i}]");
                let text = item.as_str().ok_or_else(|| invalid(&p, format!("must be a string, got {}", kind(item))))?;
                let ip = text
                    .parse::<IpAddr>()
                    .map(|ip| ip.to_canonical())
                    .map_err(|_| invalid(&p, format!("{text:?} is not an IP address")))?;
                let slot = if ip.is_ipv4() { &mut conf.gateway_v4 } else { &mut conf.gateway_v6 };
                if let Some(first) = slot {
                    return Err(invalid(k, format!("holds two addresses of one family: {first} and {ip}")));
                }
                *slot = Some(ip);
            }
        }
        if let Some((k, v)) = non_null(obj, "addSourceHints") {
            conf.add_source_hints =
                lenient_bool_value(v).ok_or_else(|| invalid(k, format!("must be a boolean, got {}", kind(v))))?;
        }
        Ok(conf)
    }

    pub fn from_request(req: &Request) -> Result<SbrConfig> {
        SbrConfig::parse(&req.raw)
    }

    /// The gateway for an address: the configured one of its family, else prevResult's.
    pub fn gateway_for(&self, address: IpAddr, from_result: Option<IpAddr>) -> Option<IpAddr> {
        let configured = if address.is_ipv4() { self.gateway_v4 } else { self.gateway_v6 };
        configured.or(from_result)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(extra: Value) -> Result<SbrConfig> {
        let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "sbr"});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        SbrConfig::parse(&v)
    }

    #[test]
    fn every_key_and_defaults() {
        assert_eq!(parse(json!({})).unwrap(), SbrConfig::default());
        let c = parse(json!({"table": 5000, "gateways": ["10.0.0.1", "fd00::1"], "addSourceHints": true})).unwrap();
        assert_eq!(c.table, Some(5000));
        assert_eq!(c.gateway_v4, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(c.gateway_v6, Some("fd00::1".parse().unwrap()));
        assert!(c.add_source_hints);
        let c = parse(json!({"Table": 7, "addsourcehints": "true"})).unwrap();
        assert_eq!((c.table, c.add_source_hints), (Some(7), true));
        assert_eq!(
            c.gateway_for("10.1.0.5".parse().unwrap(), Some("10.1.0.1".parse().unwrap())),
            Some("10.1.0.1".parse().unwrap())
        );
        let c = parse(json!({"gateways": ["10.0.0.1"]})).unwrap();
        assert_eq!(
            c.gateway_for("10.1.0.5".parse().unwrap(), Some("10.1.0.1".parse().unwrap())),
            Some("10.0.0.1".parse().unwrap())
        );
        assert_eq!(c.gateway_for("fd00::5".parse().unwrap(), None), None);
    }

    #[test]
    fn errors_are_code_7_and_name_the_key() {
        for (extra, needle) in [
            (json!({"table": 0}), "table: table 0 is reserved"),
            (json!({"table": 254}), "table: table 254 is reserved"),
            (json!({"table": 255}), "reserved"),
            (json!({"table": -1}), "table: must be"),
            (json!({"table": 4294967296u64}), "table: must be"),
            (json!({"table": "100"}), "table: must be"),
            (json!({"table": 1.5}), "table: must be"),
            (json!({"gateways": "10.0.0.1"}), "gateways: must be an array"),
            (json!({"gateways": ["x"]}), "gateways[0]"),
            (json!({"gateways": [5]}), "gateways[0]"),
            (json!({"gateways": ["10.0.0.1", "10.0.0.2"]}), "two addresses of one family"),
            (json!({"gateways": ["10.0.0.1", "fd00::1", "fd00::2"]}), "more than 2"),
            (json!({"addSourceHints": 3}), "addSourceHints: must be a boolean"),
        ] {
            let e = parse(extra.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{extra}: {e}");
            assert!(e.msg.contains(needle), "{extra}: {:?} lacks {needle:?}", e.msg);
        }
    }
}

//! The vrf plugin's keys (`vrfname`, `table`), parsed and validated once; problems are code 7
//! naming the key as written.

use libcni::gojson::Spelled;
use libcni::skel::validate_ifname;
use libcni::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

/// Tables a VRF must not take: unspec, default, main, local (the pod's own routing lives there).
const RESERVED_TABLES: [i64; 4] = [0, 253, 254, 255];

#[derive(Debug, Clone, Deserialize, Default)]
struct Raw {
    vrfname: Option<Spelled<String>>,
    table: Option<Spelled<i64>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VrfConf {
    pub vrfname: String,
    /// None: the VRF's existing table, or the first no other VRF of the pod uses when creating it.
    pub table: Option<u32>,
}

pub fn parse(raw: &Value) -> Result<VrfConf> {
    let r: Raw = libcni::conf::plugin_conf(raw, "vrf")?;
    let vrfname = match r.vrfname {
        Some(n) if !n.value.is_empty() => {
            validate_ifname(&n.value).map_err(|e| Error::config(format!("{}: {}", n.key_or("vrfname"), e.msg)))?;
            n.value
        }
        _ => return Err(Error::config("vrfname: the vrf plugin needs \"vrfname\", the VRF to put the interface in")),
    };
    let table = match r.table {
        None | Some(Spelled { value: 0, .. }) => None,
        Some(t) => {
            let key = t.key_or("table");
            if RESERVED_TABLES.contains(&t.value) {
                return Err(Error::config(format!(
                    "{key}: table {} is reserved (253 default, 254 main, 255 local): pick another, or leave it \
                     out to take the first free one",
                    t.value
                )));
            }
            Some(u32::try_from(t.value).map_err(|_| {
                Error::config(format!("{key}: invalid table {}: use a routing table number, 1-4294967295", t.value))
            })?)
        }
    };
    Ok(VrfConf { vrfname, table })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_json(extra: Value) -> Result<VrfConf> {
        let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "vrf", "vrfname": "blue"});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        parse(&v)
    }

    #[test]
    fn every_key_and_defaults() {
        assert_eq!(parse_json(json!({})).unwrap(), VrfConf { vrfname: "blue".into(), table: None });
        assert_eq!(parse_json(json!({"table": 0})).unwrap().table, None);
        assert_eq!(parse_json(json!({"table": 1001})).unwrap().table, Some(1001));
        assert_eq!(parse_json(json!({"table": 4294967295u64})).unwrap().table, Some(u32::MAX));
        // Go's key matching: the reference's fields are VRFName and Table.
        let mut v = json!({"cniVersion": "1.0.0", "name": "n", "VRFName": "red", "Table": 7});
        v.as_object_mut().unwrap().remove("vrfname");
        let c = parse(&v).unwrap();
        assert_eq!(c, VrfConf { vrfname: "red".into(), table: Some(7) });
    }

    #[test]
    fn errors_are_code_7_and_name_the_key() {
        for (extra, needle) in [
            (json!({"vrfname": ""}), "vrfname: "),
            (json!({"vrfname": null}), "vrfname: "),
            (json!({"vrfname": "a/b"}), "vrfname: "),
            (json!({"vrfname": "0123456789abcdef"}), "vrfname: "),
            (json!({"vrfname": 5}), "vrfname"),
            (json!({"table": 254}), "table: table 254 is reserved"),
            (json!({"Table": 255}), "Table: table 255 is reserved"),
            (json!({"table": -1}), "table: invalid table -1"),
            (json!({"table": 4294967296u64}), "table: invalid table"),
            (json!({"table": "10"}), "table"),
        ] {
            let e = parse_json(extra.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{extra}: {e}");
            assert!(e.msg.contains(needle), "{extra}: {:?} lacks {needle:?}", e.msg);
        }
    }
}

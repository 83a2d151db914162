//! The dummy plugin's configuration: the shared keys only, with `ipam` required (a dummy link
//! exists to hold addresses).

use libcni::conf::NetConf;
use libcni::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DummyConf {
    pub ipam_type: String,
}

pub fn parse(conf: &NetConf) -> Result<DummyConf> {
    match netkit::iface::ipam::plugin(conf)? {
        Some(t) => Ok(DummyConf { ipam_type: t.to_string() }),
        None => Err(Error::config(
            "ipam: the dummy plugin needs an IPAM configuration (\"ipam\": {\"type\": ...}): a dummy interface \
             only holds addresses",
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> NetConf {
        libcni::conf::netconf_from_value(&v).unwrap()
    }

    #[test]
    fn ipam_is_required_and_named() {
        let c = parse(&conf(json!({"cniVersion": "1.0.0", "name": "n", "type": "dummy",
            "IPAM": {"Type": "host-local"}})))
        .unwrap();
        assert_eq!(c.ipam_type, "host-local");
        for v in [
            json!({"cniVersion": "1.0.0", "name": "n", "type": "dummy"}),
            json!({"cniVersion": "1.0.0", "name": "n", "type": "dummy", "ipam": {}}),
            json!({"cniVersion": "1.0.0", "name": "n", "type": "dummy", "ipam": {"type": ""}}),
        ] {
            let e = parse(&conf(v.clone())).unwrap_err();
            assert_eq!(e.code, 7, "{v}");
            assert!(e.msg.starts_with("ipam: "), "{}", e.msg);
        }
        let e = parse(&conf(json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "../x"}}))).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("invalid ipam type"), "{}", e.msg);
    }
}

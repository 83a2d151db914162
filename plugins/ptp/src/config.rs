//! The ptp plugin's keys (the reference's `ipMasq`, `ipMasqBackend`, `mtu`, `dns`), parsed and
//! validated once; later code never touches raw JSON.

use libcni::conf::lenient_bool;
use libcni::gojson::Spelled;
use libcni::skel::Request;
use libcni::types::Dns;
use libcni::{Error, Result};
use netkit::firewall::{self, IpMasq};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    #[serde(default, deserialize_with = "lenient_bool")]
    ip_masq: bool,
    ip_masq_backend: Option<Spelled<String>>,
    mtu: Option<Spelled<i64>>,
}

/// A validated ptp configuration with defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PtpConf {
    pub network: String,
    /// Where masquerade rules go when `ipMasq` is set.
    pub ip_masq: Option<IpMasq>,
    /// Both ends of the veth; `None` is the kernel's default.
    pub mtu: Option<u32>,
    /// ptp has no layer 2 of its own: the addresses, and so the IPAM plugin, are required.
    pub ipam_type: String,
    /// Replaces IPAM's DNS when set.
    pub dns: Option<Dns>,
}

pub fn parse(req: &Request) -> Result<PtpConf> {
    let raw: Raw = req.plugin_conf()?;
    let ipam_type = req.conf.ipam_type().filter(|t| !t.is_empty()).ok_or_else(|| {
        Error::config("ptp needs an ipam section with a type (e.g. host-local): the pod's addresses come from it")
    })?;
    Ok(PtpConf {
        network: req.conf.name.clone(),
        ip_masq: firewall::ip_masq(raw.ip_masq, raw.ip_masq_backend.as_ref())?,
        mtu: netkit::iface::keys::mtu_key(raw.mtu.as_ref())?,
        ipam_type: ipam_type.to_string(),
        dns: req.conf.dns.clone(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use netkit::firewall::BackendKind;
    use serde_json::{json, Value};

    fn parse_conf(raw: Value) -> Result<PtpConf> {
        let req = Request {
            command: libcni::skel::Command::Add,
            container_id: "c1".into(),
            netns: None,
            ifname: "eth0".into(),
            args: Default::default(),
            netns_override: false,
            cni_path: Vec::new(),
            conf: libcni::conf::netconf_from_value(&raw)?,
            stdin: raw.to_string().into_bytes(),
            raw,
        };
        parse(&req)
    }

    #[test]
    fn defaults() {
        let c = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", "type": "ptp", "ipam": {"type": "host-local"}}))
            .unwrap();
        assert_eq!(
            c,
            PtpConf { network: "n".into(), ip_masq: None, mtu: None, ipam_type: "host-local".into(), dns: None }
        );
    }

    /// Every key, spelled as the reference's tags and as Go's decoder also takes them.
    #[test]
    fn every_key() {
        let c = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", "type": "ptp", "ipMasq": true,
            "ipMasqBackend": "iptables", "mtu": 1400, "dns": {"nameservers": ["10.1.0.10"]},
            "ipam": {"type": "static"}}))
        .unwrap();
        assert_eq!(c.ip_masq, Some(IpMasq { backend: BackendKind::Iptables, detected: false }));
        assert_eq!(c.mtu, Some(1400));
        assert_eq!(c.ipam_type, "static");
        assert_eq!(c.dns.unwrap().nameservers, ["10.1.0.10"]);
        let c = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", "IPMasq": "true", "IPMasqBackend": "nftables",
            "MTU": 9000, "IPAM": {"Type": "host-local"}}))
        .unwrap();
        assert_eq!(c.ip_masq, Some(IpMasq { backend: BackendKind::Nftables, detected: false }));
        assert_eq!(c.mtu, Some(9000));
        // mtu 0 is the kernel's default.
        let c = parse_conf(json!({"cniVersion": "1.0.0", "name": "n", "mtu": 0, "ipam": {"type": "h"}})).unwrap();
        assert_eq!(c.mtu, None);
    }

    #[test]
    fn errors_name_the_key() {
        for (conf, needle) in [
            (json!({"ipam": {"type": "host-local"}, "MTU": 40}), "invalid MTU 40"),
            (json!({"ipam": {"type": "host-local"}, "mtu": 70000}), "invalid mtu 70000"),
            (
                json!({"ipam": {"type": "host-local"}, "ipMasqBackend": "pf", "ipMasq": true}),
                "invalid ipMasqBackend \"pf\"",
            ),
            (json!({"ipam": {"type": "host-local"}, "ipMasq": 3}), "ipMasq: expected true or false"),
            (json!({"ipam": {"type": "host-local"}, "mtu": "big"}), "mtu"),
            (json!({}), "ptp needs an ipam section"),
            (json!({"ipam": {}}), "ptp needs an ipam section"),
        ] {
            let mut conf = conf;
            conf["cniVersion"] = json!("1.0.0");
            conf["name"] = json!("n");
            let e = parse_conf(conf).unwrap_err();
            assert_eq!(e.code, 7, "{}", e.msg);
            assert!(e.msg.contains(needle), "{} lacks {needle}", e.msg);
        }
    }
}

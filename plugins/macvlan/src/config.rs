//! macvlan's keys, parsed and validated once: `master`, `mode`, `mtu`, `mac`, `linkInContainer`,
//! `bcqueuelen`, with the MAC also from `CNI_ARGS MAC` and `runtimeConfig.mac`, as the reference.

use libcni::conf::lenient_bool;
use libcni::gojson::Spelled;
use libcni::skel::Request;
use libcni::{Error, Result};
use netkit::iface::keys;
use netkit::iface::sublink::{self, SubLinkConf};
use netkit::netlink::{MacvlanMode, SubLink};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    master: Option<Spelled<String>>,
    mode: Option<Spelled<String>>,
    mtu: Option<Spelled<i64>>,
    mac: Option<Spelled<String>>,
    #[serde(default, deserialize_with = "lenient_bool")]
    link_in_container: bool,
    bcqueuelen: Option<Spelled<i64>>,
}

pub fn parse(req: &Request) -> Result<SubLinkConf> {
    let raw: Raw = req.plugin_conf()?;
    let mode = sublink::mode_key(raw.mode.as_ref(), MacvlanMode::parse, MacvlanMode::NAMES, MacvlanMode::Bridge)?;
    let bc_queue_len = match &raw.bcqueuelen {
        None | Some(Spelled { value: 0, .. }) => None,
        Some(Spelled { value: n @ 1..=0xffff_ffff, .. }) => Some(*n as u32),
        Some(n) => {
            return Err(Error::config(format!(
                "invalid {} {}: use 0 (the kernel's default) to 4294967295",
                n.key_or("bcqueuelen"),
                n.value
            )))
        }
    };
    // The config's `mac` < CNI_ARGS MAC < runtimeConfig.mac; the reference reads no args.cni.mac.
    let mac = keys::requested_mac(req, raw.mac.as_ref().map(|m| m.value.as_str()), false)?;
    Ok(SubLinkConf {
        master: sublink::master_key(raw.master.as_ref())?,
        link_in_container: raw.link_in_container,
        mtu: keys::mtu_key(raw.mtu.as_ref())?,
        sub: SubLink::Macvlan { mode, bc_queue_len },
        mac,
        ipam_type: req.conf.ipam_type().map(str::to_string),
        ips_from_prev: false,
        dns: req.conf.dns.clone(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parse_with(extra: Value, args: &str) -> Result<SubLinkConf> {
        let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "macvlan"});
        cni_tests::merge(&mut v, extra);
        parse(&cni_tests::add_request(&v, args))
    }

    fn parse_conf(extra: Value) -> Result<SubLinkConf> {
        parse_with(extra, "")
    }

    #[test]
    fn defaults() {
        let c = parse_conf(json!({})).unwrap();
        assert_eq!(
            c,
            SubLinkConf {
                master: None,
                link_in_container: false,
                mtu: None,
                sub: SubLink::Macvlan { mode: MacvlanMode::Bridge, bc_queue_len: None },
                mac: None,
                ipam_type: None,
                ips_from_prev: false,
                dns: None,
            }
        );
        // Empty strings and zeros are the defaults too, as the reference reads them.
        let c = parse_conf(json!({"master": "", "mode": "", "mtu": 0, "bcqueuelen": 0, "mac": ""})).unwrap();
        assert_eq!((c.master, c.mtu, c.mac), (None, None, None));
    }

    #[test]
    fn every_key() {
        let c = parse_conf(json!({"master": "eth1", "mode": "private", "mtu": 1400, "linkInContainer": true,
            "bcqueuelen": 2000, "mac": "0a:58:0a:f4:01:02", "ipam": {"type": "host-local"},
            "dns": {"nameservers": ["10.0.0.53"]}}))
        .unwrap();
        assert_eq!(c.master.as_deref(), Some("eth1"));
        assert_eq!(c.sub, SubLink::Macvlan { mode: MacvlanMode::Private, bc_queue_len: Some(2000) });
        assert_eq!(c.mtu, Some(1400));
        assert!(c.link_in_container);
        assert_eq!(c.mac, Some(netkit::Mac([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x02])));
        assert_eq!(c.ipam_type.as_deref(), Some("host-local"));
        assert_eq!(c.dns.unwrap().nameservers, ["10.0.0.53"]);
        for (name, mode) in
            [("bridge", MacvlanMode::Bridge), ("vepa", MacvlanMode::Vepa), ("passthru", MacvlanMode::Passthru)]
        {
            let c = parse_conf(json!({ "mode": name })).unwrap();
            assert_eq!(c.sub, SubLink::Macvlan { mode, bc_queue_len: None });
        }
        // Go's decoder folds case: a Go runtime's untagged fields.
        let c = parse_conf(json!({"Master": "eth2", "MTU": 1300, "LinkInContainer": "true"})).unwrap();
        assert_eq!((c.master.as_deref(), c.mtu, c.link_in_container), (Some("eth2"), Some(1300), true));
    }

    #[test]
    fn mac_sources_in_the_reference_order() {
        let conf_mac = json!({"mac": "0a:00:00:00:00:01"});
        assert_eq!(parse_conf(conf_mac.clone()).unwrap().mac.unwrap().octets()[5], 1);
        // CNI_ARGS MAC beats the config's key.
        assert_eq!(parse_with(conf_mac.clone(), "MAC=0a:00:00:00:00:02").unwrap().mac.unwrap().octets()[5], 2);
        // runtimeConfig.mac (the `mac` capability) beats both; an empty one is unset.
        let mut both = conf_mac.clone();
        both["runtimeConfig"] = json!({"mac": "0a:00:00:00:00:03"});
        assert_eq!(parse_with(both, "MAC=0a:00:00:00:00:02").unwrap().mac.unwrap().octets()[5], 3);
        let mut empty = conf_mac.clone();
        empty["runtimeConfig"] = json!({"mac": ""});
        assert_eq!(parse_with(empty, "MAC=0a:00:00:00:00:02").unwrap().mac.unwrap().octets()[5], 2);
        // Every form Go's net.ParseMAC reads, as the reference's macvlan takes them.
        for form in ["0a-00-00-00-00-05", "0a00.0000.0005", "0A:00:00:00:00:05"] {
            assert_eq!(
                parse_conf(json!({"mac": form})).unwrap().mac,
                Some(netkit::Mac([0x0a, 0, 0, 0, 0, 5])),
                "{form}"
            );
        }
        assert_eq!(parse_with(json!({}), "MAC=0a00.0000.0006").unwrap().mac.unwrap().octets()[5], 6);
        // args.cni.mac is bridge's, not macvlan's (the reference's macvlan ignores it).
        let mut args = conf_mac;
        args["args"] = json!({"cni": {"mac": "0a:00:00:00:00:04"}});
        assert_eq!(parse_conf(args).unwrap().mac.unwrap().octets()[5], 1);
    }

    #[test]
    fn errors_are_code_7_and_name_the_key() {
        for (extra, needle) in [
            (json!({"mode": "passthrough"}), "invalid mode \"passthrough\": use bridge, private, vepa or passthru"),
            (json!({"Mode": "Bridge"}), "invalid Mode \"Bridge\""),
            (json!({"mode": 3}), "mode"),
            (json!({"master": "a/b"}), "master"),
            (json!({"master": "0123456789abcdef"}), "master"),
            (json!({"master": 5}), "master"),
            (json!({"mtu": -1}), "invalid mtu -1"),
            (json!({"mtu": 67}), "invalid mtu 67"),
            (json!({"mtu": "1500"}), "mtu"),
            (json!({"bcqueuelen": -5}), "invalid bcqueuelen -5"),
            (json!({"bcqueuelen": 4294967296u64}), "invalid bcqueuelen 4294967296"),
            (json!({"mac": "0a:58"}), "invalid MAC address \"0a:58\""),
            (json!({"mac": "01:00:5e:00:00:01"}), "multicast"),
            (json!({"linkInContainer": 2}), "linkInContainer"),
            (json!({"runtimeConfig": {"mac": 5}}), "runtimeConfig.mac must be a string"),
        ] {
            let e = parse_conf(extra.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{extra}: {e}");
            assert!(e.msg.contains(needle), "{extra}: {:?} lacks {needle:?}", e.msg);
        }
        let e = parse_with(json!({}), "MAC=zz").unwrap_err();
        assert!(e.msg.contains("invalid MAC address \"zz\""), "{e}");
    }
}

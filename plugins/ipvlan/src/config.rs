//! ipvlan's keys, parsed and validated once: `master`, `mode`, `mtu`, `linkInContainer`, as the
//! reference; chained after another plugin with no `master`, the master is prevResult's interface.

use libcni::conf::lenient_bool;
use libcni::gojson::Spelled;
use libcni::skel::Request;
use libcni::{Command, Error, Result};
use netkit::iface::keys;
use netkit::iface::sublink::{self, SubLinkConf};
use netkit::netlink::{IpvlanMode, SubLink};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    master: Option<Spelled<String>>,
    mode: Option<Spelled<String>>,
    mtu: Option<Spelled<i64>>,
    #[serde(default, deserialize_with = "lenient_bool")]
    link_in_container: bool,
}

pub fn parse(req: &Request) -> Result<SubLinkConf> {
    let raw: Raw = req.plugin_conf()?;
    let mode = sublink::mode_key(raw.mode.as_ref(), IpvlanMode::parse, IpvlanMode::NAMES, IpvlanMode::L2)?;
    let ipam_type = req.conf.ipam_type().map(str::to_string);
    let prev = req.conf.prev_result.as_ref();
    let mut master = sublink::master_key(raw.master.as_ref())?;
    if let (None, Some(prev)) = (&master, prev) {
        master = Some(master_from_prev(req, prev)?);
    }
    let ips_from_prev = ipam_type.is_none() && prev.is_some_and(|p| !p.ips.is_empty());
    if req.command == Command::Add && ipam_type.is_none() && !ips_from_prev {
        return Err(Error::config(
            "ipvlan needs addresses: set ipam, or chain it after a plugin whose result (prevResult) has them",
        ));
    }
    Ok(SubLinkConf {
        master,
        link_in_container: raw.link_in_container,
        mtu: keys::mtu_key(raw.mtu.as_ref())?,
        sub: SubLink::Ipvlan { mode },
        mac: None,
        ipam_type,
        ips_from_prev,
        dns: req.conf.dns.clone(),
    })
}

/// The master of a chained ipvlan with no `master`: on ADD, prevResult's only interface (the
/// reference's rule); on CHECK, prevResult is the chain's final result, which lists ours after
/// it, so its first interface that is not ours.
fn master_from_prev(req: &Request, prev: &libcni::CniResult) -> Result<String> {
    let netns = req.netns.as_ref().map(|p| p.display().to_string());
    let ours = |i: &&libcni::types::Interface| i.name == req.ifname && i.sandbox == netns;
    let found = match req.command {
        Command::Add => match prev.interfaces.as_slice() {
            [only] if !only.name.is_empty() => Some(only),
            _ => None,
        },
        _ => prev.interfaces.iter().find(|i| !ours(i) && !i.name.is_empty()),
    };
    let name = found.map(|i| i.name.clone()).ok_or_else(|| {
        Error::config(format!(
            "ipvlan has no master: set master, or chain it after a plugin whose result (prevResult) lists exactly \
             one named interface (it lists {})",
            prev.interfaces.len()
        ))
    })?;
    libcni::skel::validate_ifname(&name)
        .map_err(|e| Error::config(format!("prevResult's interface as the ipvlan master: {}", e.msg)))?;
    Ok(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parse_conf(extra: Value) -> Result<SubLinkConf> {
        let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "ipvlan", "ipam": {"type": "host-local"}});
        cni_tests::merge(&mut v, extra);
        parse(&cni_tests::add_request(&v, ""))
    }

    #[test]
    fn defaults_and_every_key() {
        let c = parse_conf(json!({})).unwrap();
        assert_eq!(
            c,
            SubLinkConf {
                master: None,
                link_in_container: false,
                mtu: None,
                sub: SubLink::Ipvlan { mode: IpvlanMode::L2 },
                mac: None,
                ipam_type: Some("host-local".into()),
                ips_from_prev: false,
                dns: None,
            }
        );
        let c = parse_conf(json!({"master": "eth1", "mode": "l3s", "mtu": 1400, "linkInContainer": true})).unwrap();
        assert_eq!(c.master.as_deref(), Some("eth1"));
        assert_eq!(c.sub, SubLink::Ipvlan { mode: IpvlanMode::L3s });
        assert_eq!((c.mtu, c.link_in_container), (Some(1400), true));
        assert_eq!(parse_conf(json!({"mode": "l3"})).unwrap().sub, SubLink::Ipvlan { mode: IpvlanMode::L3 });
        let c = parse_conf(json!({"Master": "eth2", "Mode": "l3", "MTU": 1300})).unwrap();
        assert_eq!((c.master.as_deref(), c.mtu), (Some("eth2"), Some(1300)));
    }

    fn prev(interfaces: Value, ips: Value) -> Value {
        json!({"cniVersion": "1.0.0", "interfaces": interfaces, "ips": ips})
    }

    #[test]
    fn chained_master_and_addresses_from_prev_result() {
        let one = prev(json!([{"name": "host0"}]), json!([{"address": "10.1.0.5/24", "interface": 0}]));
        let c = parse_conf(json!({"ipam": null, "prevResult": one})).unwrap();
        assert_eq!(c.master.as_deref(), Some("host0"));
        assert!(c.ips_from_prev && c.ipam_type.is_none());
        // With ipam the addresses are IPAM's; the master still comes from prevResult.
        let c = parse_conf(json!({"prevResult": one})).unwrap();
        assert_eq!(c.master.as_deref(), Some("host0"));
        assert!(!c.ips_from_prev);
        // A master key wins.
        assert_eq!(parse_conf(json!({"master": "m1", "prevResult": one})).unwrap().master.as_deref(), Some("m1"));
        for (interfaces, needle) in [
            (json!([]), "it lists 0"),
            (json!([{"name": "a"}, {"name": "b"}]), "it lists 2"),
            (json!([{"name": ""}]), "exactly one named interface"),
        ] {
            let e = parse_conf(json!({"prevResult": prev(interfaces, json!([]))})).unwrap_err();
            assert_eq!(e.code, 7, "{e}");
            assert!(e.msg.contains(needle), "{e}");
        }
        // No ipam and no addresses to take: nothing to configure.
        let e = parse_conf(json!({"ipam": null})).unwrap_err();
        assert!(e.code == 7 && e.msg.contains("ipvlan needs addresses"), "{e}");
        let e = parse_conf(json!({"ipam": null, "prevResult": prev(json!([{"name": "h"}]), json!([]))})).unwrap_err();
        assert!(e.msg.contains("ipvlan needs addresses"), "{e}");
    }

    #[test]
    fn errors_are_code_7_and_name_the_key() {
        for (extra, needle) in [
            (json!({"mode": "l4"}), "invalid mode \"l4\": use l2, l3 or l3s"),
            (json!({"mode": "L2"}), "invalid mode \"L2\""),
            (json!({"master": "a b"}), "master"),
            (json!({"mtu": 70000}), "invalid mtu 70000"),
            (json!({"linkInContainer": "yes"}), "linkInContainer"),
        ] {
            let e = parse_conf(extra.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{extra}: {e}");
            assert!(e.msg.contains(needle), "{extra}: {:?} lacks {needle:?}", e.msg);
        }
    }
}

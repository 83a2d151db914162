//! The host-device plugin's keys (the reference's `device`, `hwaddr`, `kernelpath`, `pciBusID`,
//! `runtimeConfig.deviceID`, `dns`, optional `ipam`; our own `dataDir`), parsed and validated once.

use libcni::conf::kind;
use libcni::gojson::{self, Spelled};
use libcni::skel::{validate_ifname, Request};
use libcni::types::Dns;
use libcni::{Error, Result};
use serde::Deserialize;
use serde_json::Value;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    device: Option<Spelled<String>>,
    hwaddr: Option<Spelled<String>>,
    kernelpath: Option<Spelled<String>>,
    #[serde(rename = "pciBusID")]
    pci_bus_id: Option<Spelled<String>>,
    data_dir: Option<String>,
}

/// Which host device to move, in the reference's order of precedence: `device`, `hwaddr`,
/// `kernelpath`, then `pciBusID` (which `runtimeConfig.deviceID` overrides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Device(String),
    HwAddr(netkit::Mac),
    /// A device directory under /sys/devices; its first network interface.
    KernelPath(PathBuf),
    /// A PCI address (`0000:03:00.1`); its network interface, or none when a userspace (DPDK)
    /// driver holds it.
    Pci(String),
    /// An auxiliary bus device (`mlx5_core.sf.4`), as device plugins hand out sub-functions.
    Auxiliary(String),
}

/// A validated host-device configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct HostDeviceConf {
    pub selector: Selector,
    pub ipam_type: Option<String>,
    /// Replaces IPAM's DNS when set.
    pub dns: Option<Dns>,
    /// Where ADD keeps the device's own alias (ours, not the reference's: it overwrites the alias
    /// with the host name for good), so DEL can give it back.
    pub data_dir: PathBuf,
}

/// `dataDir` unless the configuration names another: under /run, as the kernel state it
/// describes does not outlive a reboot either.
pub const DEFAULT_DATA_DIR: &str = "/run/cni/host-device";

/// `DDDD:BB:DD.F`, as sysfs names PCI devices.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
    b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11])
}

/// An auxiliary device name (`<driver>.<name>.<id>`): letters, digits, `_`, `-` and dots, never a
/// path.
fn is_auxiliary_name(s: &str) -> bool {
    s.contains('.')
        && !s.starts_with('.')
        && !s.contains("..")
        && s.len() <= 255
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn pci_or_auxiliary(key: &str, id: &str) -> Result<Selector> {
    if is_pci_address(id) {
        Ok(Selector::Pci(id.to_ascii_lowercase()))
    } else if is_auxiliary_name(id) {
        Ok(Selector::Auxiliary(id.to_string()))
    } else {
        Err(Error::config(format!(
            "invalid {key} {id:?}: use a PCI address like 0000:03:00.1 or an auxiliary device like mlx5_core.sf.4"
        )))
    }
}

/// `runtimeConfig.deviceID`, keys matched as Go does.
fn device_id(req: &Request) -> Result<Option<(String, String)>> {
    match gojson::get(&req.conf.runtime_config, "deviceID") {
        None | Some((_, Value::Null)) => Ok(None),
        Some((k, Value::String(s))) => Ok(Some((format!("runtimeConfig.{k}"), s.clone()))),
        Some((k, other)) => Err(Error::config(format!("runtimeConfig.{k} must be a string, got {}", kind(other)))),
    }
}

fn non_empty(v: Option<Spelled<String>>) -> Option<Spelled<String>> {
    v.filter(|s| !s.value.is_empty())
}

pub fn parse(req: &Request) -> Result<HostDeviceConf> {
    let raw: Raw = req.plugin_conf()?;
    let selector = if let Some(d) = non_empty(raw.device) {
        validate_ifname(&d.value)
            .map_err(|e| Error::config(format!("{} {:?}: {}", d.key_or("device"), d.value, e.msg)))?;
        Selector::Device(d.value)
    } else if let Some(h) = non_empty(raw.hwaddr) {
        let mac = netkit::parse_mac(&h.value).map(netkit::Mac).ok_or_else(|| {
            Error::config(format!(
                "invalid {} {:?}: expected six hex bytes like 0a:58:0a:f4:01:02",
                h.key_or("hwaddr"),
                h.value
            ))
        })?;
        Selector::HwAddr(mac)
    } else if let Some(k) = non_empty(raw.kernelpath) {
        let path = PathBuf::from(&k.value);
        let plain = path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !path.starts_with("/sys/devices/") || !plain || path == Path::new("/sys/devices") {
            return Err(Error::config(format!(
                "invalid {} {:?}: must be a device directory, absolute and under /sys/devices/ (no . or ..)",
                k.key_or("kernelpath"),
                k.value
            )));
        }
        Selector::KernelPath(path)
    } else if let Some((key, id)) = device_id(req)?.filter(|(_, id)| !id.is_empty()) {
        pci_or_auxiliary(&key, &id)?
    } else if let Some(p) = non_empty(raw.pci_bus_id) {
        pci_or_auxiliary(p.key_or("pciBusID"), &p.value)?
    } else {
        return Err(Error::config(
            r#"specify either "device", "hwaddr", "kernelpath" or "pciBusID" (or a runtimeConfig deviceID): the host device to move"#,
        ));
    };
    let ipam_type = req.conf.ipam_type().filter(|t| !t.is_empty()).map(str::to_string);
    if let Some(t) = ipam_type.as_deref().filter(|t| !libcni::invoke::valid_plugin_type(t)) {
        return Err(Error::config(format!("invalid ipam type {t:?}: a plugin name cannot contain '/'")));
    }
    let data_dir = netkit::saved::dir(raw.data_dir, DEFAULT_DATA_DIR, "host-device")?;
    Ok(HostDeviceConf { selector, ipam_type, dns: req.conf.dns.clone(), data_dir })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn request(raw: Value) -> Request {
        Request {
            command: libcni::skel::Command::Add,
            container_id: "c1".into(),
            netns: None,
            ifname: "net1".into(),
            args: Default::default(),
            netns_override: false,
            cni_path: Vec::new(),
            conf: libcni::conf::netconf_from_value(&raw).expect("netconf"),
            stdin: raw.to_string().into_bytes(),
            raw,
        }
    }

    fn parse_conf(mut raw: Value) -> Result<HostDeviceConf> {
        raw["cniVersion"] = json!("1.0.0");
        raw["name"] = json!("n");
        parse(&request(raw))
    }

    #[test]
    fn each_selector_and_its_precedence() {
        let sel = |v: Value| parse_conf(v).unwrap().selector;
        assert_eq!(sel(json!({"device": "eth1"})), Selector::Device("eth1".into()));
        assert_eq!(sel(json!({"Device": "eth1", "hwaddr": "0a:58:0a:f4:01:02"})), Selector::Device("eth1".into()));
        assert_eq!(
            sel(json!({"hwaddr": "0A:58:0a:f4:01:02"})),
            Selector::HwAddr(netkit::Mac([0x0a, 0x58, 0x0a, 0xf4, 1, 2]))
        );
        // Go's dotted form: the reference's net.ParseMAC reads it.
        assert_eq!(
            sel(json!({"hwaddr": "0a58.0af4.0102"})),
            Selector::HwAddr(netkit::Mac([0x0a, 0x58, 0x0a, 0xf4, 1, 2]))
        );
        assert_eq!(
            sel(json!({"kernelpath": "/sys/devices/pci0000:00/0000:00:19.0", "pciBusID": "0000:00:19.0"})),
            Selector::KernelPath("/sys/devices/pci0000:00/0000:00:19.0".into())
        );
        assert_eq!(sel(json!({"pciBusID": "0000:03:00.1"})), Selector::Pci("0000:03:00.1".into()));
        // runtimeConfig.deviceID overrides pciBusID, not device.
        let rc = json!({"deviceID": "0000:AF:00.2"});
        assert_eq!(sel(json!({"pciBusID": "0000:03:00.1", "runtimeConfig": rc})), Selector::Pci("0000:af:00.2".into()));
        assert_eq!(sel(json!({"device": "eth1", "runtimeConfig": rc})), Selector::Device("eth1".into()));
        assert_eq!(
            sel(json!({"RuntimeConfig": {"DeviceID": "mlx5_core.sf.4"}})),
            Selector::Auxiliary("mlx5_core.sf.4".into())
        );
        let c =
            parse_conf(json!({"device": "eth1", "ipam": {"type": "static"}, "dns": {"nameservers": ["10.0.0.10"]}}))
                .unwrap();
        assert_eq!(c.ipam_type.as_deref(), Some("static"));
        assert_eq!(c.dns.unwrap().nameservers, ["10.0.0.10"]);
        assert_eq!(parse_conf(json!({"device": "eth1"})).unwrap().ipam_type, None);
    }

    #[test]
    fn errors_name_the_key() {
        for (conf, needle) in [
            (json!({}), r#"specify either "device""#),
            (json!({"device": ""}), r#"specify either "device""#),
            (json!({"device": "a/b"}), "device \"a/b\""),
            (json!({"device": "waytoolongname0123"}), "device"),
            (json!({"HWAddr": "zz"}), "invalid HWAddr \"zz\""),
            (json!({"kernelpath": "/etc"}), "invalid kernelpath \"/etc\""),
            (json!({"kernelpath": "/sys/devices/../../etc"}), "invalid kernelpath"),
            (json!({"kernelpath": "sys/devices/x"}), "invalid kernelpath"),
            (json!({"pciBusID": "../../../etc"}), "invalid pciBusID"),
            (json!({"pciBusID": "0000:03:00.9"}), "invalid pciBusID"),
            (json!({"runtimeConfig": {"deviceID": "a/b"}}), "invalid runtimeConfig.deviceID"),
            (json!({"runtimeConfig": {"deviceID": 5}}), "runtimeConfig.deviceID must be a string"),
            (json!({"device": 5}), "device"),
        ] {
            let e = parse_conf(conf.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{conf}: {}", e.msg);
            assert!(e.msg.contains(needle), "{conf}: {} lacks {needle}", e.msg);
        }
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:03:00.1") && is_pci_address("ffff:ff:1f.7"));
        for bad in ["03:00.1", "0000:03:00.8", "0000:03:00.10", "0000-03:00.1", "0000:03:0g.1"] {
            assert!(!is_pci_address(bad), "{bad}");
        }
    }
}

//! The dhcp IPAM configuration (the `ipam` object), parsed and validated once on the plugin side:
//! where the daemon listens (`daemonSocketPath`), the options asked of the server (`request`), the
//! options sent to it (`provide`, values from the config or from CNI_ARGS), and `suppress`. The
//! daemon gets the resolved options (codes and bytes), never the JSON.
//!
//! Option names are the reference's (dhcp-options(5) spelling): `dhcp-client-identifier`,
//! `subnet-mask`, `routers`, `host-name`, `user-class`, `vendor-class-identifier`, or a decimal code
//! 0-255. Configuration problems are code 7, naming the key.

use crate::packet::opt;
use libcni::args::CniArgs;
use libcni::conf::{kind, NetConf};
use libcni::gojson::{array, invalid, non_null, object};
use libcni::{Error, Result};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// The reference daemon's socket, which ours listens on too.
pub const DEFAULT_SOCKET: &str = "/run/cni/dhcp.sock";

/// Asked of the server unless a `request` entry says `skipDefault`: the reference's two (router,
/// subnet mask) and what the result carries besides (DNS servers, domain name, static and
/// classless routes).
pub const DEFAULT_REQUEST: [u8; 6] =
    [opt::SUBNET_MASK, opt::ROUTER, opt::DNS, opt::DOMAIN_NAME, opt::STATIC_ROUTES, opt::CLASSLESS_ROUTES];

/// The longest value one option carries (its length is one byte).
const MAX_OPTION_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpConfig {
    pub socket_path: PathBuf,
    /// The parameter request list (option 55), in order, without repeats.
    pub request: Vec<u8>,
    /// Options sent with DISCOVER and REQUEST; a `dhcp-client-identifier` here replaces the default
    /// `<containerID>/<network>/<ifname>`.
    pub provide: Vec<(u8, Vec<u8>)>,
    /// `suppress: ["gateway"]`: no gateway and no default route in the result.
    pub suppress_gateway: bool,
}

/// An option name as the reference accepts it.
pub fn option_code(name: &str) -> Option<u8> {
    Some(match name {
        "dhcp-client-identifier" => opt::CLIENT_ID,
        "subnet-mask" => opt::SUBNET_MASK,
        "routers" => opt::ROUTER,
        "host-name" => opt::HOST_NAME,
        "user-class" => opt::USER_CLASS,
        "vendor-class-identifier" => opt::VENDOR_CLASS,
        // Go's ParseUint(s, 10, 8): decimal digits only, no sign.
        n if !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit()) => n.parse().ok()?,
        _ => return None,
    })
}

fn string_key<'a>(obj: &'a Map<String, Value>, key: &str, path: &str) -> Result<Option<(String, &'a str)>> {
    match non_null(obj, key) {
        None => Ok(None),
        Some((k, Value::String(s))) => Ok(Some((format!("{path}.{k}"), s.as_str()))),
        Some((k, other)) => Err(invalid(&format!("{path}.{k}"), format!("must be a string, got {}", kind(other)))),
    }
}

fn bool_key(obj: &Map<String, Value>, key: &str, path: &str) -> Result<bool> {
    match non_null(obj, key) {
        None => Ok(false),
        Some((_, Value::Bool(b))) => Ok(*b),
        Some((k, other)) => Err(invalid(&format!("{path}.{k}"), format!("must be a boolean, got {}", kind(other)))),
    }
}

fn option_of(obj: &Map<String, Value>, path: &str) -> Result<u8> {
    let Some((key, name)) = string_key(obj, "option", path)? else {
        return Err(invalid(
            &format!("{path}.option"),
            "missing (an option name such as \"host-name\", or a code 0-255)",
        ));
    };
    option_code(name).ok_or_else(|| {
        invalid(
            &key,
            format!(
                "{name:?} is not a known option name (dhcp-client-identifier, subnet-mask, routers, host-name, \
                 user-class, vendor-class-identifier) or a decimal code 0-255"
            ),
        )
    })
}

impl DhcpConfig {
    /// The `ipam` object of `conf`; `cni_args` supplies `provide[].fromArg` values.
    pub fn parse(conf: &NetConf, cni_args: &CniArgs) -> Result<DhcpConfig> {
        let ipam = conf.ipam.as_ref().ok_or_else(|| Error::config("netconf has no \"ipam\" object"))?;
        let ipam = object(ipam, "ipam")?;
        let socket_path = socket_path(ipam)?;

        let mut request = Vec::new();
        let mut skip_default = false;
        if let Some((k, v)) = non_null(ipam, "request") {
            for (i, item) in array(v, &format!("ipam.{k}"))?.iter().enumerate() {
                let path = format!("ipam.{k}[{i}]");
                let obj = object(item, &path)?;
                skip_default |= bool_key(obj, "skipDefault", &path)?;
                // An entry may only say skipDefault.
                if non_null(obj, "option").is_some() {
                    let code = option_of(obj, &path)?;
                    if !request.contains(&code) {
                        request.push(code);
                    }
                }
            }
        }
        if !skip_default {
            for code in DEFAULT_REQUEST {
                if !request.contains(&code) {
                    request.push(code);
                }
            }
        }

        let mut provide: Vec<(u8, Vec<u8>)> = Vec::new();
        if let Some((k, v)) = non_null(ipam, "provide") {
            for (i, item) in array(v, &format!("ipam.{k}"))?.iter().enumerate() {
                let path = format!("ipam.{k}[{i}]");
                let obj = object(item, &path)?;
                let code = option_of(obj, &path)?;
                let mut value = None;
                if let Some((key, text)) = string_key(obj, "value", &path)? {
                    if text.len() > MAX_OPTION_LEN {
                        return Err(invalid(&key, format!("{} bytes; an option holds at most 255", text.len())));
                    }
                    if !text.is_empty() {
                        value = Some(text.as_bytes().to_vec());
                    }
                }
                if let Some((key, arg)) = string_key(obj, "fromArg", &path)? {
                    if let Some(text) = cni_args.get(arg) {
                        if text.len() > MAX_OPTION_LEN {
                            return Err(Error::env(format!(
                                "CNI_ARGS {arg} (named by {key}): {} bytes; an option holds at most 255",
                                text.len()
                            )));
                        }
                        value = Some(text.as_bytes().to_vec());
                    }
                }
                if let Some(value) = value {
                    match provide.iter_mut().find(|(c, _)| *c == code) {
                        Some(slot) => slot.1 = value,
                        None => provide.push((code, value)),
                    }
                }
            }
        }

        let mut suppress_gateway = false;
        if let Some((k, v)) = non_null(ipam, "suppress") {
            for (i, item) in array(v, &format!("ipam.{k}"))?.iter().enumerate() {
                let path = format!("ipam.{k}[{i}]");
                match item {
                    Value::String(s) if s == "gateway" => suppress_gateway = true,
                    Value::String(s) => {
                        return Err(invalid(&path, format!("unknown suppress value {s:?} (supported: \"gateway\")")))
                    }
                    other => return Err(invalid(&path, format!("must be a string, got {}", kind(other)))),
                }
            }
        }
        Ok(DhcpConfig { socket_path, request, provide, suppress_gateway })
    }
}

/// `ipam.daemonSocketPath`, else the default; an absolute path (the daemon and the plugin may run
/// in different working directories).
pub fn socket_path(ipam: &Map<String, Value>) -> Result<PathBuf> {
    match string_key(ipam, "daemonSocketPath", "ipam")? {
        None => Ok(PathBuf::from(DEFAULT_SOCKET)),
        Some((_, "")) => Ok(PathBuf::from(DEFAULT_SOCKET)),
        Some((key, p)) if !p.starts_with('/') => Err(invalid(
            &key,
            format!("{p:?} is not an absolute path (the daemon's -socketpath, e.g. /run/cni/dhcp.sock)"),
        )),
        Some((key, p)) if p.contains('\0') => Err(invalid(&key, "holds a NUL byte")),
        Some((_, p)) => Ok(PathBuf::from(p)),
    }
}

/// The socket path for DEL, GC and STATUS: read leniently, so a configuration that no longer
/// validates still reaches the daemon.
pub fn socket_path_lenient(conf: &NetConf) -> PathBuf {
    conf.ipam
        .as_ref()
        .and_then(Value::as_object)
        .and_then(|ipam| socket_path(ipam).ok())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn conf(ipam: Value) -> NetConf {
        let raw = json!({"cniVersion": "1.0.0", "name": "net", "type": "bridge", "ipam": ipam});
        libcni::conf::netconf_from_value(&raw).unwrap()
    }

    fn parse(ipam: Value, args: &str) -> Result<DhcpConfig> {
        DhcpConfig::parse(&conf(ipam), &CniArgs::parse_lenient(args))
    }

    #[test]
    fn defaults() {
        let c = parse(json!({"type": "dhcp"}), "").unwrap();
        assert_eq!(c.socket_path, PathBuf::from("/run/cni/dhcp.sock"));
        assert_eq!(c.request, DEFAULT_REQUEST.to_vec());
        assert!(c.provide.is_empty());
        assert!(!c.suppress_gateway);
    }

    #[test]
    fn socket_path_must_be_absolute() {
        let c = parse(json!({"type": "dhcp", "daemonSocketPath": "/tmp/x.sock"}), "").unwrap();
        assert_eq!(c.socket_path, PathBuf::from("/tmp/x.sock"));
        let e = parse(json!({"type": "dhcp", "daemonSocketPath": "x.sock"}), "").unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("ipam.daemonSocketPath"), "{}", e.msg);
        let e = parse(json!({"type": "dhcp", "daemonSocketPath": 5}), "").unwrap_err();
        assert!(e.msg.contains("must be a string"), "{}", e.msg);
    }

    #[test]
    fn request_adds_to_the_defaults_unless_skip_default() {
        let c = parse(json!({"type": "dhcp", "request": [{"option": "host-name"}, {"option": "42"}]}), "").unwrap();
        assert_eq!(&c.request[..2], &[12, 42]);
        assert_eq!(c.request.len(), 2 + DEFAULT_REQUEST.len());
        let c = parse(json!({"type": "dhcp", "request": [{"skipDefault": true, "option": "routers"}]}), "").unwrap();
        assert_eq!(c.request, vec![3]);
        let c = parse(json!({"type": "dhcp", "request": [{"skipDefault": true}]}), "").unwrap();
        assert!(c.request.is_empty());
    }

    #[test]
    fn provide_takes_value_then_cni_arg() {
        let ipam = json!({"type": "dhcp", "provide": [
            {"option": "host-name", "value": "from-conf", "fromArg": "K8S_POD_NAME"},
            {"option": "user-class", "value": "uc"},
            {"option": "60", "fromArg": "VC"},
        ]});
        let c = parse(ipam.clone(), "K8S_POD_NAME=web-0").unwrap();
        assert_eq!(c.provide, vec![(12, b"web-0".to_vec()), (77, b"uc".to_vec())]);
        let c = parse(ipam, "VC=vendor").unwrap();
        assert_eq!(c.provide, vec![(12, b"from-conf".to_vec()), (77, b"uc".to_vec()), (60, b"vendor".to_vec())]);
    }

    #[test]
    fn provide_refuses_long_values_and_bad_options() {
        let long = "x".repeat(256);
        let e = parse(json!({"type": "dhcp", "provide": [{"option": "host-name", "value": long}]}), "").unwrap_err();
        assert!(e.msg.contains("ipam.provide[0].value") && e.msg.contains("255"), "{}", e.msg);
        let e =
            parse(json!({"type": "dhcp", "provide": [{"option": "host-name", "fromArg": "A"}]}), &format!("A={long}"))
                .unwrap_err();
        assert_eq!(e.code, 4);
        for bad in ["256", "-1", "hostname", "", "0x10"] {
            let e = parse(json!({"type": "dhcp", "provide": [{"option": bad, "value": "v"}]}), "").unwrap_err();
            assert_eq!(e.code, 7, "{bad}");
            assert!(e.msg.contains("ipam.provide[0].option"), "{}", e.msg);
        }
        let e = parse(json!({"type": "dhcp", "provide": [{"value": "v"}]}), "").unwrap_err();
        assert!(e.msg.contains("missing"), "{}", e.msg);
        let e = parse(json!({"type": "dhcp", "request": [{"option": 3}]}), "").unwrap_err();
        assert!(e.msg.contains("ipam.request[0].option: must be a string"), "{}", e.msg);
        let e = parse(json!({"type": "dhcp", "request": {"option": "3"}}), "").unwrap_err();
        assert!(e.msg.contains("ipam.request: must be an array"), "{}", e.msg);
        let e = parse(json!({"type": "dhcp", "request": [{"skipDefault": "yes"}]}), "").unwrap_err();
        assert!(e.msg.contains("ipam.request[0].skipDefault"), "{}", e.msg);
    }

    #[test]
    fn option_names() {
        assert_eq!(option_code("dhcp-client-identifier"), Some(61));
        assert_eq!(option_code("subnet-mask"), Some(1));
        assert_eq!(option_code("routers"), Some(3));
        assert_eq!(option_code("vendor-class-identifier"), Some(60));
        assert_eq!(option_code("255"), Some(255));
        assert_eq!(option_code("007"), Some(7));
        assert_eq!(option_code("+7"), None);
    }

    #[test]
    fn suppress_gateway_only() {
        assert!(parse(json!({"type": "dhcp", "suppress": ["gateway"]}), "").unwrap().suppress_gateway);
        let e = parse(json!({"type": "dhcp", "suppress": ["dns"]}), "").unwrap_err();
        assert!(e.msg.contains("ipam.suppress[0]"), "{}", e.msg);
    }

    #[test]
    fn keys_match_as_go_does() {
        let c = parse(json!({"type": "dhcp", "DaemonSocketPath": "/a.sock", "Request": [{"Option": "routers", "SkipDefault": true}]}), "")
            .unwrap();
        assert_eq!(c.socket_path, PathBuf::from("/a.sock"));
        assert_eq!(c.request, vec![3]);
    }
}

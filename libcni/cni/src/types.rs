//! Plugin results of every spec version (0.1.0 to 1.1.0) and conversion between them.
//!
//! In memory there is one shape, [`CniResult`], a superset of all versions (the 1.1.0 one). Parsing
//! reads only what the given version's Go type has, and rendering writes only what the target
//! version's Go type has, applying upstream libcni's conversion rules, lossy ones included. The Go
//! types are the yardstick rather than the spec text because runtimes are built on them.

use crate::error::{code, Error, Result};
use crate::gojson::{self, kind};
use crate::version::CURRENT;
use ipnetwork::IpNetwork;
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::net::IpAddr;

/// An interface the plugin created or configured (`interfaces[]`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    /// 1.1.0 and later.
    pub mtu: Option<u32>,
    /// The netns path for a container interface; `None` for a host interface.
    pub sandbox: Option<String>,
    /// 1.1.0 and later (vhost-user and similar).
    pub socket_path: Option<String>,
    /// 1.1.0 and later.
    pub pci_id: Option<String>,
}

/// An address on an interface (`ips[]`).
#[derive(Debug, Clone, PartialEq)]
pub struct IpConfig {
    /// The address with its prefix length; host bits are kept ("10.1.0.5/16").
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`; IPAM plugins leave it unset.
    pub interface: Option<usize>,
}

/// A route (`routes[]`, or `ip4.routes`/`ip6.routes` in 0.1.0/0.2.0).
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    /// 1.1.0 and later, like the rest below.
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    /// 0 universe (global), 253 link, 254 host.
    pub scope: Option<u8>,
}

/// The `routes` list of the config object `parent` (named `what` in messages, like `ipam`), each
/// decoded as Go does; none when the key is absent or null, code 7 naming the entry otherwise.
pub fn routes(parent: &Map<String, Value>, what: &str) -> Result<Vec<Route>> {
    let Some((k, v)) = gojson::non_null(parent, "routes") else { return Ok(Vec::new()) };
    let path = format!("{what}.{k}");
    gojson::array(v, &path)?
        .iter()
        .enumerate()
        .map(|(i, item)| gojson::from_value(item).map_err(|e| gojson::invalid(&format!("{path}[{i}]"), e)))
        .collect()
}

/// Upstream's error for a result without addresses converted to 0.1.0 or 0.2.0, which its plugins
/// print as code 999.
pub fn no_addresses_error() -> Error {
    Error::new(code::UNTYPED, "cannot convert: no valid IP addresses")
}

/// The `dns` object of results and network configurations.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "none_or_empty")]
    pub domain: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// A plugin result. `cni_version` is the version it was parsed as (or is meant to be); rendering
/// as another version converts by upstream's rules.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CniResult {
    /// Empty means the newest (1.1.0): a plugin may fill in the fields and leave this to the renderer.
    pub cni_version: String,
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

impl IpConfig {
    /// True for IPv4 and IPv4-mapped IPv6 addresses: the family upstream gives the address when it
    /// fills in the 0.3/0.4 `version` field or picks `ip4` for 0.1/0.2.
    pub fn is_ipv4(&self) -> bool {
        is_v4(self.address.ip())
    }
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty() && none_or_empty(&self.domain) && self.search.is_empty() && self.options.is_empty()
    }
}

/// The JSON shape families: the Go type each version decodes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// 0.1.0, 0.2.0: `ip4`/`ip6` blocks.
    Legacy,
    /// 0.3.0, 0.3.1, 0.4.0: `ips[].version`, interfaces without 1.1 fields.
    V04,
    /// 1.0.0, 1.1.0: one Go type for both, so 1.1 fields survive in 1.0.0 output too.
    V1,
}

fn shape_of(version: &str) -> Option<Shape> {
    match version {
        "0.1.0" | "0.2.0" => Some(Shape::Legacy),
        "0.3.0" | "0.3.1" | "0.4.0" => Some(Shape::V04),
        "1.0.0" | "1.1.0" => Some(Shape::V1),
        _ => None,
    }
}

impl CniResult {
    /// Parse a result of any of the seven versions. The version is the result's own `cniVersion`,
    /// else `fallback_version` (a plugin result without one gets the config's, upstream #895), else
    /// 0.1.0. Keys match case-insensitively and unknown keys are ignored, as Go's decoder does.
    pub fn parse(value: &Value, fallback_version: &str) -> Result<CniResult> {
        let top = Obj::new(value, "")?;
        let own = top.string("cniVersion")?.unwrap_or_default();
        let version = match (own.as_str(), fallback_version) {
            ("", "") => "0.1.0",
            ("", fallback) => fallback,
            (own, _) => own,
        };
        let shape =
            shape_of(version).ok_or_else(|| Error::version(format!("unsupported CNI result version {version:?}")))?;
        let mut result = CniResult {
            cni_version: version.to_string(),
            dns: match top.object("dns")? {
                Some(dns) => parse_dns(&dns)?,
                None => Dns::default(),
            },
            ..CniResult::default()
        };
        match shape {
            Shape::Legacy => {
                // Upstream turns ip4 then ip6 into ips and concatenates their routes.
                for key in ["ip4", "ip6"] {
                    let Some(block) = top.object(key)? else { continue };
                    result.ips.push(IpConfig {
                        address: block.cidr("ip")?,
                        gateway: block.ip("gateway")?,
                        interface: None,
                    });
                    for (i, route) in block.array("routes")?.iter().enumerate() {
                        let path = format!("{}[{i}]", block.at("routes"));
                        result.routes.push(parse_route(&Obj::new(route, &path)?)?);
                    }
                }
            }
            Shape::V04 | Shape::V1 => {
                for (i, iface) in top.array("interfaces")?.iter().enumerate() {
                    let iface = Obj::new(iface, &format!("{}[{i}]", top.at("interfaces")))?;
                    result.interfaces.push(parse_interface(&iface, shape)?);
                }
                for (i, ip) in top.array("ips")?.iter().enumerate() {
                    let ip = Obj::new(ip, &format!("{}[{i}]", top.at("ips")))?;
                    if shape == Shape::V04 {
                        // The family is taken from the address; the field only has to be well-typed.
                        ip.string("version")?;
                    }
                    result.ips.push(parse_ip(&ip)?);
                }
                for (i, route) in top.array("routes")?.iter().enumerate() {
                    result.routes.push(parse_route(&Obj::new(route, &format!("{}[{i}]", top.at("routes")))?)?);
                }
            }
        }
        Ok(result)
    }

    /// [`CniResult::parse`] on raw bytes, e.g. a plugin's stdout or a cache file's `result`.
    pub fn parse_bytes(data: &[u8], fallback_version: &str) -> Result<CniResult> {
        let value: Value =
            serde_json::from_slice(data).map_err(|e| Error::decode(format!("result is not valid JSON: {e}")))?;
        Self::parse(&value, fallback_version)
    }

    /// Render as `version` by upstream's conversion rules. An empty `version` means 0.1.0 without a
    /// `cniVersion` key, as Go's `Convert(r, "")` produces.
    pub fn to_value(&self, version: &str) -> Result<Value> {
        serde_json::to_value(self.render(version)?)
            .map_err(|e| Error::new(code::INTERNAL, format!("render result: {e}")))
    }

    /// Upstream's `Print()` as libcni >= 1.2 prints it: 4-space indented JSON, no trailing newline,
    /// `<`, `>`, `&` escaped as Go does. A 1.x result goes through a Go map there (its `MarshalJSON`
    /// drops an empty `dns`), so its keys are sorted at every level; 0.x results keep Go's field order
    /// and their `"dns":{}`.
    pub fn to_pretty(&self, version: &str) -> Result<String> {
        let rendered = self.render(version)?;
        let text = match &rendered {
            Wire::Modern(m) if m.sorted_keys => {
                let value = serde_json::to_value(&rendered)
                    .map_err(|e| Error::new(code::INTERNAL, format!("render result: {e}")))?;
                pretty(&value)?
            }
            _ => pretty(&rendered)?,
        };
        Ok(go_escape(text))
    }

    /// This result as it reads after conversion to `version` (what a consumer of that version sees).
    pub fn as_version(&self, version: &str) -> Result<CniResult> {
        let target = if version.is_empty() { "0.1.0" } else { version };
        Self::parse(&self.to_value(version)?, target)
    }

    fn render<'a>(&'a self, version: &'a str) -> Result<Wire<'a>> {
        // A hand-built result without a version is in our native shape, which is the newest.
        let source_version = if self.cni_version.is_empty() { CURRENT } else { &self.cni_version };
        let no_converter =
            || Error::version(format!("no converter for CNI result version {source_version} to {version}"));
        let target = if version.is_empty() { Some(Shape::Legacy) } else { shape_of(version) };
        let (Some(source), Some(target)) = (shape_of(source_version), target) else {
            return Err(no_converter());
        };
        let dns = &self.dns;
        match target {
            Shape::Legacy => {
                // Only coming down from an `ips` list can leave nothing to put in ip4/ip6; 0.1 and 0.2
                // have the same shape, so converting between them never fails. Upstream's converter
                // returns this as a plain error, which its plugins print as code 999.
                if source != Shape::Legacy && self.ips.is_empty() {
                    return Err(no_addresses_error());
                }
                let block = |v4: bool| {
                    self.ips.iter().find(|ip| ip.is_ipv4() == v4).map(|ip| WireLegacyIp {
                        ip: go_net(&ip.address),
                        gateway: ip.gateway.map(go_ip),
                        routes: Vec::new(),
                    })
                };
                let (mut ip4, mut ip6) = (block(true), block(false));
                for route in &self.routes {
                    let target = if is_v4(route.dst.ip()) { &mut ip4 } else { &mut ip6 };
                    if let Some(target) = target {
                        target.routes.push(WireRoute::from(route));
                    }
                }
                Ok(Wire::Legacy(WireLegacy { cni_version: version, ip4, ip6, dns }))
            }
            Shape::V04 | Shape::V1 => {
                let modern = target == Shape::V1;
                let interfaces = self.interfaces.iter().map(|i| WireInterface::new(i, modern)).collect();
                let ips = self.ips.iter().map(|ip| WireIp::new(ip, modern)).collect();
                let routes = self.routes.iter().map(WireRoute::from).collect();
                // The 1.x Go type's MarshalJSON drops an empty dns; the 0.4 type cannot omit the struct.
                let dns = (!(modern && dns.is_empty())).then_some(dns);
                Ok(Wire::Modern(WireModern { cni_version: version, interfaces, ips, routes, dns, sorted_keys: modern }))
            }
        }
    }
}

/// Convert a result JSON of any version to `to`, as upstream's `GetAsVersion` does. A result
/// without `cniVersion` is read as 0.1.0.
pub fn convert(value: &Value, to: &str) -> Result<Value> {
    CniResult::parse(value, "")?.to_value(to)
}

// ---- Parsing ----

fn parse_interface(obj: &Obj<'_>, shape: Shape) -> Result<Interface> {
    let mut iface = Interface {
        name: obj.string("name")?.unwrap_or_default(),
        mac: non_empty(obj.string("mac")?),
        sandbox: non_empty(obj.string("sandbox")?),
        ..Interface::default()
    };
    // The 0.4 Go type has no such fields, so upstream drops them when decoding a 0.x result.
    if shape == Shape::V1 {
        iface.mtu = obj.u32("mtu")?.filter(|&m| m != 0);
        iface.socket_path = non_empty(obj.string("socketPath")?);
        iface.pci_id = non_empty(obj.string("pciID")?);
    }
    Ok(iface)
}

fn parse_ip(obj: &Obj<'_>) -> Result<IpConfig> {
    let interface = match obj.number("interface")? {
        None => None,
        Some(n) => Some(usize::try_from(n).map_err(|_| obj.invalid("interface", "index out of range"))?),
    };
    Ok(IpConfig { address: obj.cidr("address")?, gateway: obj.ip("gateway")?, interface })
}

fn parse_route(obj: &Obj<'_>) -> Result<Route> {
    Ok(Route {
        dst: obj.cidr("dst")?,
        gw: obj.ip("gw")?,
        // Go keeps these as plain ints with omitempty: 0 and absent are the same thing.
        mtu: obj.u32("mtu")?.filter(|&v| v != 0),
        advmss: obj.u32("advmss")?.filter(|&v| v != 0),
        priority: obj.u32("priority")?.filter(|&v| v != 0),
        table: obj.u32("table")?,
        scope: match obj.number("scope")? {
            None => None,
            Some(n) => Some(u8::try_from(n).map_err(|_| obj.invalid("scope", "out of range"))?),
        },
    })
}

fn parse_dns(obj: &Obj<'_>) -> Result<Dns> {
    Ok(Dns {
        nameservers: obj.strings("nameservers")?,
        domain: non_empty(obj.string("domain")?),
        search: obj.strings("search")?,
        options: obj.strings("options")?,
    })
}

/// A JSON object being decoded, with its path for error messages (`ips[1].address`).
struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn new(value: &'a Value, path: &str) -> Result<Obj<'a>> {
        match value {
            Value::Object(map) => Ok(Obj { map, path: path.to_string() }),
            other => {
                let what = if path.is_empty() { "result" } else { path };
                Err(Error::decode(format!("{what}: expected an object, got {}", kind(other))))
            }
        }
    }

    /// The path of `key`, spelled as the result wrote it.
    fn at(&self, key: &str) -> String {
        let key = crate::gojson::get(self.map, key).map_or(key, |(written, _)| written);
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn invalid(&self, key: &str, why: impl std::fmt::Display) -> Error {
        Error::decode(format!("{}: {why}", self.at(key)))
    }

    fn wrong_type(&self, key: &str, expected: &str, got: &Value) -> Error {
        self.invalid(key, format!("expected {expected}, got {}", kind(got)))
    }

    /// The value of `key`, matched as Go does ([`crate::gojson::get`]); null is absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        crate::gojson::get(self.map, key).map(|(_, v)| v).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong_type(key, "a string", other)),
        }
    }

    fn number(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong_type(key, "a non-negative integer", v)),
        }
    }

    fn u32(&self, key: &str) -> Result<Option<u32>> {
        match self.number(key)? {
            None => Ok(None),
            Some(n) => u32::try_from(n).map(Some).map_err(|_| self.invalid(key, "out of range")),
        }
    }

    fn array(&self, key: &str) -> Result<&'a [Value]> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(self.wrong_type(key, "an array", other)),
        }
    }

    fn object(&self, key: &str) -> Result<Option<Obj<'a>>> {
        self.get(key).map(|v| Obj::new(v, &self.at(key))).transpose()
    }

    fn strings(&self, key: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for (i, item) in self.array(key)?.iter().enumerate() {
            match item {
                Value::String(s) => out.push(s.clone()),
                other => {
                    return Err(Error::decode(format!("{}[{i}]: expected a string, got {}", self.at(key), kind(other))))
                }
            }
        }
        Ok(out)
    }

    /// A required CIDR with host bits kept, parsed as strictly as Go's `net.ParseCIDR`.
    fn cidr(&self, key: &str) -> Result<IpNetwork> {
        let text = match self.get(key) {
            None => return Err(self.invalid(key, "missing")),
            Some(Value::String(s)) => s,
            Some(other) => return Err(self.wrong_type(key, "a CIDR string", other)),
        };
        parse_cidr(text).ok_or_else(|| self.invalid(key, format!("invalid CIDR address {text:?}")))
    }

    /// An optional address; Go reads "" as no address.
    fn ip(&self, key: &str) -> Result<Option<IpAddr>> {
        match self.string(key)?.as_deref() {
            None | Some("") => Ok(None),
            Some(text) => text.parse().map(Some).map_err(|_| self.invalid(key, format!("invalid IP address {text:?}"))),
        }
    }
}

fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let (addr, prefix) = text.split_once('/')?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let addr: IpAddr = addr.parse().ok()?;
    IpNetwork::new(addr, prefix.parse().ok()?).ok()
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

fn none_or_empty(s: &Option<String>) -> bool {
    s.as_deref().is_none_or(str::is_empty)
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

// ---- Rendering, in Go's field order so that `to_pretty` matches upstream's text ----

/// 4-space indented JSON, as Go's `json.MarshalIndent(v, "", "    ")`.
fn pretty<T: Serialize>(value: &T) -> Result<String> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut ser).map_err(|e| Error::new(code::INTERNAL, format!("render result: {e}")))?;
    String::from_utf8(out).map_err(|e| Error::new(code::INTERNAL, format!("render result: {e}")))
}

/// Go's encoder escapes `<`, `>`, `&`, U+2028 and U+2029 in strings. None of them can appear in JSON
/// outside a string, so replacing them in the whole text escapes exactly the strings.
fn go_escape(text: String) -> String {
    if !text.contains(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

fn is_v4(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    }
}

/// Go prints an IPv4-mapped address as plain IPv4.
fn go_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.to_string(),
        },
        IpAddr::V4(v4) => v4.to_string(),
    }
}

/// Go prints an IPv4-mapped network as IPv4 with the last 32 bits of its mask.
fn go_net(net: &IpNetwork) -> String {
    let prefix = match net.ip() {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => net.prefix().saturating_sub(96),
        _ => net.prefix(),
    };
    format!("{}/{prefix}", go_ip(net.ip()))
}

#[derive(Serialize)]
#[serde(untagged)]
enum Wire<'a> {
    Legacy(WireLegacy<'a>),
    Modern(WireModern<'a>),
}

#[derive(Serialize)]
struct WireLegacy<'a> {
    #[serde(rename = "cniVersion", skip_serializing_if = "str::is_empty")]
    cni_version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip4: Option<WireLegacyIp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip6: Option<WireLegacyIp>,
    /// Go cannot omit an empty struct, so every version carries `"dns":{}`.
    dns: &'a Dns,
}

#[derive(Serialize)]
struct WireLegacyIp {
    ip: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<WireRoute>,
}

#[derive(Serialize)]
struct WireModern<'a> {
    #[serde(rename = "cniVersion", skip_serializing_if = "str::is_empty")]
    cni_version: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<WireInterface<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ips: Vec<WireIp>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<WireRoute>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns: Option<&'a Dns>,
    /// Printed with keys sorted (1.x: Go marshals it through a map).
    #[serde(skip)]
    sorted_keys: bool,
}

#[derive(Serialize)]
struct WireInterface<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    mac: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<&'a str>,
    #[serde(rename = "socketPath", skip_serializing_if = "Option::is_none")]
    socket_path: Option<&'a str>,
    #[serde(rename = "pciID", skip_serializing_if = "Option::is_none")]
    pci_id: Option<&'a str>,
}

impl<'a> WireInterface<'a> {
    fn new(i: &'a Interface, modern: bool) -> Self {
        let text = |s: &'a Option<String>| s.as_deref().filter(|s| !s.is_empty());
        WireInterface {
            name: &i.name,
            mac: text(&i.mac),
            sandbox: text(&i.sandbox),
            mtu: i.mtu.filter(|&m| m != 0 && modern),
            socket_path: text(&i.socket_path).filter(|_| modern),
            pci_id: text(&i.pci_id).filter(|_| modern),
        }
    }
}

#[derive(Serialize)]
struct WireIp {
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface: Option<usize>,
    address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: Option<String>,
}

impl WireIp {
    fn new(ip: &IpConfig, modern: bool) -> Self {
        let version = match (modern, ip.is_ipv4()) {
            (true, _) => None,
            (false, true) => Some("4"),
            (false, false) => Some("6"),
        };
        WireIp { version, interface: ip.interface, address: go_net(&ip.address), gateway: ip.gateway.map(go_ip) }
    }
}

/// Routes are one Go type shared by every result version, so their 1.1 fields survive every
/// conversion.
#[derive(Serialize)]
struct WireRoute {
    dst: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gw: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    advmss: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<u8>,
}

impl From<&Route> for WireRoute {
    fn from(r: &Route) -> Self {
        WireRoute {
            dst: go_net(&r.dst),
            gw: r.gw.map(go_ip),
            mtu: r.mtu.filter(|&v| v != 0),
            advmss: r.advmss.filter(|&v| v != 0),
            priority: r.priority.filter(|&v| v != 0),
            table: r.table,
            scope: r.scope,
        }
    }
}

// ---- serde in the 1.x shape, for configs and structs that embed these ----

impl Serialize for Interface {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        WireInterface::new(self, true).serialize(s)
    }
}

impl Serialize for IpConfig {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        WireIp::new(self, true).serialize(s)
    }
}

impl Serialize for Route {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        WireRoute::from(self).serialize(s)
    }
}

/// Renders in the result's own version (an empty one means the newest).
impl Serialize for CniResult {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let version = if self.cni_version.is_empty() { CURRENT } else { &self.cni_version };
        self.render(version).map_err(S::Error::custom)?.serialize(s)
    }
}

fn deserialize_with<'de, D, T>(
    d: D,
    what: &str,
    parse: impl FnOnce(&Obj<'_>) -> Result<T>,
) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    let value = Value::deserialize(d)?;
    Obj::new(&value, what).and_then(|obj| parse(&obj)).map_err(D::Error::custom)
}

impl<'de> Deserialize<'de> for Interface {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        deserialize_with(d, "interface", |o| parse_interface(o, Shape::V1))
    }
}

impl<'de> Deserialize<'de> for IpConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        deserialize_with(d, "ip", parse_ip)
    }
}

impl<'de> Deserialize<'de> for Route {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        deserialize_with(d, "route", parse_route)
    }
}

/// Reads any version by its own `cniVersion` (0.1.0 without one), like [`CniResult::parse`].
impl<'de> Deserialize<'de> for CniResult {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        CniResult::parse(&value, "").map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_is_as_strict_as_go() {
        assert!(parse_cidr("10.1.2.3/24").is_some());
        assert_eq!(parse_cidr("10.1.2.3/24").map(|n| n.ip().to_string()), Some("10.1.2.3".into()));
        assert!(parse_cidr("fd00::1/128").is_some());
        for bad in ["10.1.2.3", "10.1.2.3/", "10.1.2.3/+8", "10.1.2.3/33", "010.1.2.3/8", "x/8", " 10.0.0.1/8"] {
            assert!(parse_cidr(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn addresses_print_like_go() {
        let net = |s: &str| parse_cidr(s).map(|n| go_net(&n));
        assert_eq!(net("::ffff:10.1.2.3/120"), Some("10.1.2.3/24".into()));
        assert_eq!(net("::ffff:10.1.2.3/64"), Some("10.1.2.3/0".into()));
        assert_eq!(net("::1/128"), Some("::1/128".into()));
        assert_eq!(net("::10.1.2.3/128"), Some("::a01:203/128".into()));
        assert_eq!(net("2001:DB8:0:0:1:0:0:1/64"), Some("2001:db8::1:0:0:1/64".into()));
        assert!(is_v4("::ffff:1.2.3.4".parse().unwrap_or(IpAddr::from([0u8; 16]))));
    }
}

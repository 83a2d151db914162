//! Turns the conflist template into the node's conflist.
//!
//! Template format: the template is itself valid JSON, so it can be linted as is. A placeholder is a
//! whole JSON string token, quotes included, and is replaced by a JSON value:
//!
//! | placeholder              | replaced by (for `10.244.1.0/24,fd00:10:244:1::/64`)                    |
//! |--------------------------|--------------------------------------------------------------------------|
//! | `"__POD_CIDR_RANGES__"`  | `[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:10:244:1::/64"}]]`        |
//! | `"__DEFAULT_ROUTES__"`   | `[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]` (one per family present)          |
//! | `"__POD_CIDR_V4__"`      | `"10.244.1.0/24"` (the first IPv4 CIDR; an error if there is none)      |
//! | `"__POD_CIDR_V6__"`      | `"fd00:10:244:1::/64"` (the first IPv6 CIDR; an error if there is none) |
//!
//! Any other `"__NAME__"` left in the result is an error, so a typo cannot reach a node.

use crate::cidr::Cidr;
use libcni::{Error, Result};
use serde_json::{json, Value};

const RANGES: &str = "\"__POD_CIDR_RANGES__\"";
const ROUTES: &str = "\"__DEFAULT_ROUTES__\"";
const FIRST_V4: &str = "\"__POD_CIDR_V4__\"";
const FIRST_V6: &str = "\"__POD_CIDR_V6__\"";

/// Renders and validates; the returned text is what gets written to the node.
pub fn render(template: &str, cidrs: &[Cidr]) -> Result<String> {
    let ranges: Vec<Value> = cidrs.iter().map(|cidr| json!([{ "subnet": cidr.to_string() }])).collect();
    let mut routes = Vec::new();
    if cidrs.iter().any(Cidr::is_v4) {
        routes.push(json!({ "dst": "0.0.0.0/0" }));
    }
    if cidrs.iter().any(|cidr| !cidr.is_v4()) {
        routes.push(json!({ "dst": "::/0" }));
    }

    let mut text =
        template.replace(RANGES, &Value::Array(ranges).to_string()).replace(ROUTES, &Value::Array(routes).to_string());
    for (placeholder, want_v4, family) in [(FIRST_V4, true, "IPv4"), (FIRST_V6, false, "IPv6")] {
        if !text.contains(placeholder) {
            continue;
        }
        let cidr = cidrs
            .iter()
            .find(|cidr| cidr.is_v4() == want_v4)
            .ok_or_else(|| Error::config(format!("template uses {placeholder} but no {family} pod CIDR was given")))?;
        text = text.replace(placeholder, &Value::String(cidr.to_string()).to_string());
    }

    if let Some(unknown) = leftover_placeholder(&text) {
        return Err(Error::config(format!("template has an unknown placeholder {unknown}")));
    }
    validate_conflist(&text)?;
    Ok(text)
}

/// Finds a `"__NAME__"` token that no rule replaced.
fn leftover_placeholder(text: &str) -> Option<&str> {
    let mut rest = text;
    while let Some(start) = rest.find("\"__") {
        let candidate = &rest[start..];
        let inner_end = candidate[3..].find('"').map(|i| i + 3);
        if let Some(end) = inner_end {
            let token = &candidate[..=end];
            let name = &token[1..token.len() - 1];
            if name.len() > 4
                && name.ends_with("__")
                && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            {
                return Some(token);
            }
        }
        rest = &candidate[3..];
    }
    None
}

/// A conflist a runtime will load: JSON, with a name, a version and plugins that each have a type.
fn validate_conflist(text: &str) -> Result<()> {
    let value: Value = serde_json::from_str(text)
        .map_err(|err| Error::config(format!("rendered conflist is not valid JSON: {err}")))?;
    for key in ["cniVersion", "name"] {
        if !value.get(key).is_some_and(Value::is_string) {
            return Err(Error::config(format!("rendered conflist has no string {key:?}")));
        }
    }
    let plugins = value
        .get("plugins")
        .and_then(Value::as_array)
        .filter(|plugins| !plugins.is_empty())
        .ok_or_else(|| Error::config("rendered conflist has no \"plugins\" list"))?;
    for (index, plugin) in plugins.iter().enumerate() {
        if !plugin.get("type").is_some_and(Value::is_string) {
            return Err(Error::config(format!("rendered conflist: plugins[{index}] has no string \"type\"")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "cni-rs",
  "plugins": [
    { "type": "bridge",
      "ipam": { "type": "host-local", "ranges": "__POD_CIDR_RANGES__", "routes": "__DEFAULT_ROUTES__" } },
    { "type": "loopback" }
  ]
}"#;

    fn cidrs(text: &str) -> Vec<Cidr> {
        Cidr::parse_list(text).unwrap()
    }

    #[test]
    fn renders_dual_stack() {
        let out = render(TEMPLATE, &cidrs("10.244.1.0/24,fd00:10:244:1::/64")).unwrap();
        let value: Value = serde_json::from_str(&out).unwrap();
        let ipam = &value["plugins"][0]["ipam"];
        assert_eq!(ipam["ranges"], json!([[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:10:244:1::/64"}]]));
        assert_eq!(ipam["routes"], json!([{"dst":"0.0.0.0/0"},{"dst":"::/0"}]));
        assert_eq!(value["plugins"][1]["type"], "loopback");
    }

    #[test]
    fn renders_single_family_routes() {
        let out = render(TEMPLATE, &cidrs("fd00:10:244:1::/64")).unwrap();
        let value: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(value["plugins"][0]["ipam"]["routes"], json!([{"dst":"::/0"}]));
    }

    #[test]
    fn renders_the_shipped_template() {
        let shipped = include_str!("../../conf/10-cni-rs.conflist.template");
        let out = render(shipped, &cidrs("10.244.1.0/24")).unwrap();
        let value: Value = serde_json::from_str(&out).unwrap();
        let types: Vec<&str> =
            value["plugins"].as_array().unwrap().iter().map(|p| p["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["bridge", "portmap", "loopback"]);
        assert_eq!(value["cniVersion"], "1.0.0");
        assert_eq!(value["name"], "cni-rs");
        assert_eq!(value["plugins"][0]["ipam"]["ranges"], json!([[{"subnet":"10.244.1.0/24"}]]));
    }

    #[test]
    fn single_cidr_placeholders() {
        let template =
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x","a":"__POD_CIDR_V4__","b":"__POD_CIDR_V6__"}]}"#;
        let out = render(template, &cidrs("fd00::/64,10.1.0.0/16,10.2.0.0/16")).unwrap();
        let value: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(value["plugins"][0]["a"], "10.1.0.0/16");
        assert_eq!(value["plugins"][0]["b"], "fd00::/64");

        let err = render(template, &cidrs("10.1.0.0/16")).unwrap_err();
        assert!(err.msg.contains("no IPv6 pod CIDR"), "{err}");
    }

    #[test]
    fn rejects_unknown_placeholder_and_bad_json() {
        let typo = TEMPLATE.replace("__POD_CIDR_RANGES__", "__POD_CIDR_RANGE__");
        let err = render(&typo, &cidrs("10.244.1.0/24")).unwrap_err();
        assert!(err.msg.contains("unknown placeholder \"__POD_CIDR_RANGE__\""), "{err}");

        let err = render("{\"plugins\": [", &cidrs("10.244.1.0/24")).unwrap_err();
        assert!(err.msg.contains("not valid JSON"), "{err}");

        let err = render(r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#, &cidrs("10.244.1.0/24")).unwrap_err();
        assert!(err.msg.contains("plugins"), "{err}");
    }

    #[test]
    fn plain_strings_with_underscores_are_not_placeholders() {
        assert_eq!(leftover_placeholder(r#"{"a":"__x__","b":"__"}"#), None);
        assert_eq!(leftover_placeholder(r#"{"a":"__X__"}"#), Some("\"__X__\""));
    }
}

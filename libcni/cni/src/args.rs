//! CNI_ARGS: `K=V;K2=V2`, split as Go's LoadArgs does (on `;`, then each pair on `=` into exactly two parts).

use crate::error::{Error, Result};

/// Keys that Kubernetes runtimes always send; every plugin accepts them.
pub const KUBERNETES_KEYS: [&str; 4] =
    ["K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID"];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pairs: Vec<(String, String)>,
}

impl CniArgs {
    pub fn parse(s: &str) -> Result<CniArgs> {
        let mut pairs = Vec::new();
        if s.is_empty() {
            return Ok(CniArgs { pairs });
        }
        for pair in s.split(';') {
            let mut kv = pair.split('=');
            match (kv.next(), kv.next(), kv.next()) {
                (Some(k), Some(v), None) if !k.is_empty() => pairs.push((k.to_string(), v.to_string())),
                _ => {
                    return Err(Error::env(format!(
                        "CNI_ARGS: invalid pair {pair:?}: expected KEY=VALUE separated by ';'"
                    )))
                }
            }
        }
        Ok(CniArgs { pairs })
    }

    /// Like [`CniArgs::parse`], but a malformed pair is skipped instead of refused: for a verb or a
    /// plugin on which CNI_ARGS must not be a reason to fail.
    pub fn parse_lenient(s: &str) -> CniArgs {
        let pairs = s
            .split(';')
            .filter_map(|pair| {
                let mut kv = pair.split('=');
                match (kv.next(), kv.next(), kv.next()) {
                    (Some(k), Some(v), None) if !k.is_empty() => Some((k.to_string(), v.to_string())),
                    _ => None,
                }
            })
            .collect();
        CniArgs { pairs }
    }

    /// The last value given for `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn ignore_unknown(&self) -> bool {
        self.get("IgnoreUnknown").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    }

    /// Refuse keys the plugin does not know, unless IgnoreUnknown is set (code 4).
    pub fn check_known(&self, known: &[&str]) -> Result<()> {
        if self.ignore_unknown() {
            return Ok(());
        }
        for (k, _) in &self.pairs {
            if k != "IgnoreUnknown" && !known.contains(&k.as_str()) && !KUBERNETES_KEYS.contains(&k.as_str()) {
                return Err(Error::env(format!(
                    "CNI_ARGS: unknown key {k:?} (known: {}; add IgnoreUnknown=1 to pass unknown keys)",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        let a = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=web;FOO=bar").unwrap();
        assert_eq!(a.get("K8S_POD_NAME"), Some("web"));
        assert!(a.check_known(&[]).is_ok());
        let b = CniArgs::parse("IP=10.0.0.5;FOO=bar").unwrap();
        assert_eq!(b.check_known(&["IP"]).unwrap_err().code, 4);
        assert!(CniArgs::parse("IP=10.0.0.5;FOO=bar").unwrap().check_known(&["IP", "FOO"]).is_ok());
        assert_eq!(CniArgs::parse("a=b=c").unwrap_err().code, 4);
        assert_eq!(CniArgs::parse("a=b;").unwrap_err().code, 4);
        assert_eq!(CniArgs::parse("=b").unwrap_err().code, 4);
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }

    #[test]
    fn lenient_parse_skips_malformed_pairs() {
        let a = CniArgs::parse_lenient("a=b=c;;=x;IP=10.0.0.5;junk;K8S_POD_NAME=web;");
        assert_eq!(a.pairs, [("IP".to_string(), "10.0.0.5".to_string()), ("K8S_POD_NAME".into(), "web".into())]);
        assert_eq!(CniArgs::parse_lenient(""), CniArgs::default());
    }
}

//! bandwidth's keys and the `bandwidth` capability, parsed and validated once.
//!
//! As the reference: the four keys in the plugin config win as a set over `runtimeConfig.bandwidth`
//! whenever any one of them is present; a rate needs its burst and a burst its rate; zero means no
//! limit in that direction.

use libcni::gojson::{self, Spelled};
use libcni::skel::Request;
use libcni::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

/// The four limit keys, in the plugin configuration and in `runtimeConfig.bandwidth`.
#[derive(Debug, Clone, Deserialize, Default)]
struct RawEntry {
    #[serde(rename = "ingressRate")]
    ingress_rate: Option<Spelled<u64>>,
    #[serde(rename = "ingressBurst")]
    ingress_burst: Option<Spelled<u64>>,
    #[serde(rename = "egressRate")]
    egress_rate: Option<Spelled<u64>>,
    #[serde(rename = "egressBurst")]
    egress_burst: Option<Spelled<u64>>,
}

impl RawEntry {
    fn any(&self) -> bool {
        self.ingress_rate.is_some()
            || self.ingress_burst.is_some()
            || self.egress_rate.is_some()
            || self.egress_burst.is_some()
    }
}

/// The keys of the plugin configuration besides the four of [`RawEntry`] (parsed from it apart).
#[derive(Debug, Clone, Deserialize, Default)]
struct Raw {
    #[serde(rename = "unshapedSubnets")]
    unshaped_subnets: Option<Spelled<Vec<String>>>,
    #[serde(rename = "shapedSubnets")]
    shaped_subnets: Option<Spelled<Vec<String>>>,
}

/// One direction's limit: rate in bits/s, burst in bits (both non-zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub rate: u64,
    pub burst: u64,
}

/// bandwidth's configuration: `None` is no limit in that direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// Traffic to the pod: a tbf on the host end of its veth.
    pub ingress: Option<Limit>,
    /// Traffic from the pod: redirected to an ifb with a tbf.
    pub egress: Option<Limit>,
    /// Where the limits came from, for messages: `"the plugin configuration"` or
    /// `"runtimeConfig.bandwidth"`.
    pub source: &'static str,
}

impl Config {
    pub fn parse(req: &Request) -> Result<Config> {
        let raw: Raw = req.plugin_conf()?;
        let own: RawEntry = req.plugin_conf()?;
        let runtime = match gojson::get(&req.conf.runtime_config, "bandwidth") {
            None | Some((_, Value::Null)) => None,
            Some((key, v)) => Some(gojson::from_value::<RawEntry>(v).map_err(|e| {
                Error::config(format!("invalid bandwidth runtimeConfig.{key} (from the bandwidth capability): {e}"))
            })?),
        };
        parse(raw, own, runtime)
    }

    pub fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }
}

fn parse(raw: Raw, own: RawEntry, runtime: Option<RawEntry>) -> Result<Config> {
    for (list, name) in [(&raw.shaped_subnets, "shapedSubnets"), (&raw.unshaped_subnets, "unshapedSubnets")] {
        if let Some(l) = list.as_ref().filter(|l| !l.value.is_empty()) {
            return Err(Error::config(format!(
                "bandwidth key {:?} is not supported: the reference plugin removed subnet-selective shaping \
                 (it shipped only in v1.5.x and was reverted in v1.6.0), and every pod traffic is shaped; \
                 remove the key",
                l.key_or(name)
            )));
        }
    }
    let (entry, source) = match (own.any(), runtime) {
        (false, Some(rt)) => (rt, "runtimeConfig.bandwidth"),
        (_, _) => (own, "the plugin configuration"),
    };
    let value = |v: &Option<Spelled<u64>>| v.as_ref().map_or(0, |s| s.value);
    let ingress = limit(value(&entry.ingress_rate), value(&entry.ingress_burst), "ingress", source)?;
    let egress = limit(value(&entry.egress_rate), value(&entry.egress_burst), "egress", source)?;
    Ok(Config { ingress, egress, source })
}

fn limit(rate: u64, burst: u64, dir: &str, source: &str) -> Result<Option<Limit>> {
    match (rate, burst) {
        (0, 0) => return Ok(None),
        (_, 0) => {
            return Err(Error::config(format!(
                "bandwidth {dir}Rate is set in {source} but {dir}Burst is not: if rate is set, burst must also be set"
            )))
        }
        (0, _) => {
            return Err(Error::config(format!(
                "bandwidth {dir}Burst is set in {source} but {dir}Rate is not: if burst is set, rate must also be set"
            )))
        }
        _ => {}
    }
    if burst / 8 >= u64::from(u32::MAX) {
        return Err(Error::config(format!("bandwidth {dir}Burst {burst} in {source}: burst cannot be more than 4GB")));
    }
    if rate < 8 {
        return Err(Error::config(format!(
            "bandwidth {dir}Rate {rate} in {source}: the rate is in bits per second and must be at least 8"
        )));
    }
    let l = Limit { rate, burst };
    // The kernel keeps the bucket as a time in 32-bit ticks and the queue limit in 32 bits.
    if crate::tbf_params(&l, 64.0).is_none() {
        return Err(Error::config(format!(
            "bandwidth {dir}Burst {burst} at {dir}Rate {rate} in {source}: the bucket would take longer to drain \
             than the kernel can express (about 68 s); lower the burst or raise the rate"
        )));
    }
    Ok(Some(l))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(conf: Value, runtime: Option<Value>) -> Result<Config> {
        let raw: Raw = gojson::from_value(&conf).map_err(|e| Error::config(e.to_string()))?;
        let own: RawEntry = gojson::from_value(&conf).map_err(|e| Error::config(e.to_string()))?;
        let rt = runtime.map(|v| gojson::from_value::<RawEntry>(&v).unwrap());
        parse(raw, own, rt)
    }

    #[test]
    fn every_key() {
        let c =
            run(json!({"ingressRate": 8000, "ingressBurst": 16000, "egressRate": 24000, "egressBurst": 32000}), None)
                .unwrap();
        assert_eq!(c.ingress, Some(Limit { rate: 8000, burst: 16000 }));
        assert_eq!(c.egress, Some(Limit { rate: 24000, burst: 32000 }));
    }

    #[test]
    fn defaults_are_no_limit() {
        let c = run(json!({}), None).unwrap();
        assert!(c.is_empty());
        let c = run(json!({"ingressRate": 0, "ingressBurst": 0}), None).unwrap();
        assert!(c.is_empty());
    }

    #[test]
    fn runtime_config_only_without_static_keys_and_in_go_spelling() {
        let rt = json!({"IngressRate": 8000, "IngressBurst": 800, "EgressRate": 16000, "EgressBurst": 1600});
        let c = run(json!({}), Some(rt.clone())).unwrap();
        assert_eq!(c.ingress, Some(Limit { rate: 8000, burst: 800 }));
        assert_eq!(c.egress, Some(Limit { rate: 16000, burst: 1600 }));
        assert_eq!(c.source, "runtimeConfig.bandwidth");
        // Any static key wins, as the reference's embedded *BandwidthEntry does.
        let c = run(json!({"egressRate": 24000, "egressBurst": 2400}), Some(rt)).unwrap();
        assert_eq!(c.ingress, None);
        assert_eq!(c.egress, Some(Limit { rate: 24000, burst: 2400 }));
    }

    #[test]
    fn errors_name_the_key() {
        let e = run(json!({"ingressRate": 8000}), None).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("ingressBurst"), "{}", e.msg);
        let e = run(json!({"egressBurst": 8000}), None).unwrap_err();
        assert!(e.msg.contains("egressRate"), "{}", e.msg);
        let e = run(json!({"egressRate": 8000, "egressBurst": 40_000_000_000u64}), None).unwrap_err();
        assert!(e.msg.contains("4GB"), "{}", e.msg);
        let e = run(json!({"egressRate": 7, "egressBurst": 100}), None).unwrap_err();
        assert!(e.msg.contains("egressRate"), "{}", e.msg);
        let e = run(json!({"egressRate": 8, "egressBurst": 8_000_000_000u64}), None).unwrap_err();
        assert!(e.msg.contains("68 s"), "{}", e.msg);
        assert!(run(json!({"ingressRate": -1, "ingressBurst": 8}), None).is_err());
        assert!(run(json!({"ingressRate": "fast", "ingressBurst": 8}), None).is_err());
        let e = run(json!({"unshapedSubnets": ["10.0.0.0/8"]}), None).unwrap_err();
        assert!(e.msg.contains("unshapedSubnets"), "{}", e.msg);
        assert!(run(json!({"shapedSubnets": []}), None).is_ok());
    }
}

//! Bounds on a network configuration, so a plugin or the runtime never holds more than about four
//! times its input in memory (plus a fixed floor), whatever the input's shape.
//!
//! Two limits, both refused with code 6 before anything is decoded:
//! - its size: [`MAX_CONFIG_BYTES`] (16 MiB). Real configurations are a few KiB; the largest a
//!   runtime sends (a conflist with a prevResult and capability arguments) stay far below 1 MiB. At
//!   most the limit plus one byte is ever read.
//! - its decoded size. A JSON tree (`serde_json::Value`) costs far more than its text when it holds
//!   many small values: a 52-byte port mapping object takes about 800 bytes, a `1,` in an array 32. So
//!   the text is first walked without allocating anything, adding up what its tree will take, and a
//!   configuration whose tree would exceed [`DECODED_FLOOR`] or 1.5 times its own size, whichever is
//!   larger, is refused. Strings decode to their own size, so only configurations made of hundreds of
//!   thousands of tiny values are affected (10 000 port mappings still pass).
//!
//! With these, a plugin's peak is its text, its tree, and a copy of parts of the tree (the typed
//! config): at most about four times the input at the size limit (`tests/tests/memory.rs` measures it).

use crate::error::{Error, Result};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::io::Read;
use std::path::Path;

/// The largest configuration accepted, in bytes.
pub const MAX_CONFIG_BYTES: usize = 16 << 20;
/// A tree this large is always accepted, whatever its text's size.
pub const DECODED_FLOOR: u64 = 8 << 20;

fn too_large(what: &str) -> Error {
    Error::decode(format!(
        "{what} is larger than {} MiB, the limit on a network configuration (real ones are a few KiB)",
        MAX_CONFIG_BYTES >> 20
    ))
}

/// Read a configuration from `reader`: at most [`MAX_CONFIG_BYTES`] + 1 bytes are read, and a larger
/// or too costly one is refused (code 6). `what` names it in errors ("network configuration on stdin").
pub fn read_config(reader: &mut dyn Read, what: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("read {what}"), &e))?;
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(too_large(what));
    }
    check_decoded_size(&bytes, what)?;
    Ok(bytes)
}

/// Read a configuration file, with the limits of [`read_config`] (a larger file is refused before
/// it is read).
pub fn read_config_file(path: &Path) -> Result<Vec<u8>> {
    let what = path.display().to_string();
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(format!("read {what}"), &e))?;
    let len = file.metadata().map_err(|e| Error::io(format!("read {what}"), &e))?.len();
    if len > MAX_CONFIG_BYTES as u64 {
        return Err(too_large(&what));
    }
    read_config(&mut file, &what)
}

/// Refuse (code 6) a configuration whose decoded tree would take more than [`DECODED_FLOOR`] or 1.5
/// times its size. Text that is not valid JSON passes: the real parse reports it precisely.
pub fn check_decoded_size(bytes: &[u8], what: &str) -> Result<()> {
    let Ok(Cost(cost)) = serde_json::from_slice::<Cost>(bytes) else { return Ok(()) };
    let allowed = DECODED_FLOOR.max(bytes.len() as u64 / 2 * 3);
    if cost > allowed {
        return Err(Error::decode(format!(
            "{what} holds too many small JSON values: decoded it would take about {} MiB for {} KiB of text (the \
             limit is {} MiB or 1.5 times the text); real configurations hold a few hundred values",
            cost >> 20,
            bytes.len() >> 10,
            allowed >> 20
        )));
    }
    Ok(())
}

/// What glibc's malloc hands out for a request of `n` bytes (its chunks carry 8 bytes of header and
/// come in 16-byte steps, 32 at least).
fn heap(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        (n + 8).div_ceil(16).max(2) * 16
    }
}

/// The size of one `serde_json::Value` (and of one slot of a map's node or an array).
const VALUE: u64 = 32;
/// One node of the B-tree behind `serde_json::Map`: eleven keys (24 bytes) and values (32), links.
const MAP_NODE: u64 = 640;

/// The heap a JSON value's tree takes beyond its own `Value` slot.
struct Cost(u64);

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Cost, D::Error> {
        d.deserialize_any(CostVisitor)
    }
}

/// A map key's heap: its `String`.
struct KeyCost(u64);

impl<'de> Deserialize<'de> for KeyCost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<KeyCost, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = KeyCost;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, s: &str) -> std::result::Result<KeyCost, E> {
                Ok(KeyCost(heap(s.len() as u64)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

struct CostVisitor;

impl<'de> Visitor<'de> for CostVisitor {
    type Value = Cost;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<Cost, E> {
        Ok(Cost(0))
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<Cost, E> {
        Ok(Cost(0))
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<Cost, E> {
        Ok(Cost(0))
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<Cost, E> {
        Ok(Cost(0))
    }
    fn visit_unit<E>(self) -> std::result::Result<Cost, E> {
        Ok(Cost(0))
    }
    fn visit_str<E>(self, s: &str) -> std::result::Result<Cost, E> {
        Ok(Cost(heap(s.len() as u64)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Cost, A::Error> {
        let (mut len, mut inner) = (0u64, 0u64);
        while let Some(Cost(c)) = seq.next_element::<Cost>()? {
            len += 1;
            inner = inner.saturating_add(c);
        }
        // A vector grown by doubling from four slots.
        let slots = if len == 0 { 0 } else { len.max(4).next_power_of_two() };
        Ok(Cost(inner.saturating_add(heap(slots * VALUE))))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Cost, A::Error> {
        let (mut len, mut inner) = (0u64, 0u64);
        while let Some(KeyCost(k)) = map.next_key::<KeyCost>()? {
            let Cost(v) = map.next_value::<Cost>()?;
            len += 1;
            inner = inner.saturating_add(k).saturating_add(v);
        }
        // Nodes split in halves as keys arrive: up to eleven keys fit one node, then about six each.
        let nodes = match len {
            0 => 0,
            1..=11 => 1,
            n => n.div_ceil(6),
        };
        Ok(Cost(inner.saturating_add(nodes * MAP_NODE)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn cost(json: &str) -> u64 {
        serde_json::from_slice::<Cost>(json.as_bytes()).unwrap().0
    }

    #[test]
    fn costs_follow_the_tree() {
        assert_eq!(cost("1"), 0);
        assert_eq!(cost("\"\""), 0);
        assert_eq!(cost("\"abc\""), 32);
        assert_eq!(cost(&format!("\"{}\"", "x".repeat(1000))), 1008);
        assert_eq!(cost("[]"), 0);
        assert_eq!(cost("[1,2]"), heap(4 * 32));
        assert_eq!(cost("{\"a\":1}"), 640 + 32);
        let mapping = r#"{"hostPort":8080,"containerPort":80,"protocol":"tcp"}"#;
        assert_eq!(cost(mapping), 640 + 4 * 32);
    }

    #[test]
    fn small_and_string_heavy_configurations_pass() {
        let conf =
            r#"{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}"#;
        check_decoded_size(conf.as_bytes(), "t").unwrap();
        let padded = format!(r#"{{"cniVersion":"1.0.0","name":"n","pad":"{}"}}"#, "x".repeat(MAX_CONFIG_BYTES - 100));
        check_decoded_size(padded.as_bytes(), "t").unwrap();
        // Ten thousand port mappings: about 8 MiB decoded, under the floor.
        let maps = vec![r#"{"hostPort":8080,"containerPort":80,"protocol":"tcp"}"#; 10_000].join(",");
        check_decoded_size(format!(r#"{{"runtimeConfig":{{"portMappings":[{maps}]}}}}"#).as_bytes(), "t").unwrap();
        // Not JSON: left to the real parse.
        check_decoded_size(b"{", "t").unwrap();
        check_decoded_size(&b"[".repeat(100_000), "t").unwrap();
    }

    #[test]
    fn a_tree_of_tiny_values_is_refused() {
        let numbers = format!("{{\"n\":[{}1]}}", "1,".repeat(1_000_000));
        let e = check_decoded_size(numbers.as_bytes(), "stdin").unwrap_err();
        assert_eq!(e.code, crate::code::DECODE);
        assert!(e.msg.contains("stdin") && e.msg.contains("too many small JSON values"), "{e}");
    }

    #[test]
    fn reads_stop_after_the_limit() {
        /// An endless reader that counts what was taken from it.
        struct Endless(u64);
        impl Read for Endless {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                buf.fill(b' ');
                self.0 += buf.len() as u64;
                Ok(buf.len())
            }
        }
        let mut endless = Endless(0);
        let e = read_config(&mut endless, "network configuration on stdin").unwrap_err();
        assert_eq!(e.code, crate::code::DECODE);
        assert!(e.msg.contains("16 MiB"), "{e}");
        assert_eq!(endless.0, MAX_CONFIG_BYTES as u64 + 1);
        let mut exact = std::io::repeat(b' ').take(MAX_CONFIG_BYTES as u64);
        assert_eq!(read_config(&mut exact, "t").unwrap().len(), MAX_CONFIG_BYTES);
    }

    /// The runtime side: a configuration file over the limit is refused before it is read.
    #[test]
    fn conf_files_over_the_limit_are_refused() {
        let dir = std::env::temp_dir().join(format!("cni-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("10-huge.conflist");
        let file = std::fs::File::create(&path).unwrap();
        // Sparse: a terabyte costs nothing on disk, and would cost everything if it were read.
        file.set_len(1 << 40).unwrap();
        for e in [
            read_config_file(&path).unwrap_err(),
            crate::conflist::load_conflist_file(&path).unwrap_err(),
            crate::conflist::load_single_conf_file(&path).unwrap_err(),
        ] {
            assert_eq!(e.code, crate::code::DECODE, "{e}");
            assert!(e.msg.contains(&path.display().to_string()) && e.msg.contains("16 MiB"), "{e}");
        }
        let conf = br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"loopback"}]}"#;
        std::fs::write(&path, conf).unwrap();
        assert_eq!(crate::conflist::load_conflist_file(&path).unwrap().name, "n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! How upstream Go libcni >= 1.2 prints a result (`Print()`), for tests that compare our text with
//! it byte for byte: JSON values that keep the order their keys were written in, and Go's
//! `json.MarshalIndent(v, "", "    ")` printing of them.
//!
//! The vectors in `libcni/cni/tests/testdata/conversions.json` hold each output in Go's struct field order (libcni
//! v1.1.2). libcni >= 1.2 prints 0.x results the same way, and 1.x results through a Go map (the 1.x
//! type's `MarshalJSON`): keys sorted at every level, an empty `dns` left out.

// Included by several test crates, each using part of it.
#![allow(dead_code)]

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A JSON value whose objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub enum Ordered {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Ordered>),
    Object(Vec<(String, Ordered)>),
}

impl Ordered {
    pub fn parse(text: &str) -> Ordered {
        serde_json::from_str(text).expect("JSON")
    }

    pub fn get(&self, key: &str) -> Option<&Ordered> {
        match self {
            Ordered::Object(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Ordered::String(s) => Some(s),
            _ => None,
        }
    }

    fn sorted(&self) -> Ordered {
        match self {
            Ordered::Array(items) => Ordered::Array(items.iter().map(Ordered::sorted).collect()),
            Ordered::Object(kv) => {
                let mut kv: Vec<(String, Ordered)> = kv.iter().map(|(k, v)| (k.clone(), v.sorted())).collect();
                kv.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                Ordered::Object(kv)
            }
            other => other.clone(),
        }
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = Ordered;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Ordered, E> {
        Ok(Ordered::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Ordered, E> {
        Ok(Ordered::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Ordered, E> {
        Ok(Ordered::Number(n.into()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Ordered, E> {
        Ok(Ordered::Number(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Ordered, E> {
        Ok(serde_json::Number::from_f64(n).map_or(Ordered::Null, Ordered::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Ordered, E> {
        Ok(Ordered::String(s.to_string()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ordered, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Ordered::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
        let mut kv = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Ordered>()? {
            kv.push((k, v));
        }
        Ok(Ordered::Object(kv))
    }
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ordered, D::Error> {
        d.deserialize_any(OrderedVisitor)
    }
}

/// Go's string encoding: `<`, `>`, `&`, U+2028 and U+2029 escaped too.
fn go_quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn indent(level: usize, out: &mut String) {
    out.push('\n');
    out.push_str(&"    ".repeat(level));
}

/// `json.MarshalIndent(v, "", "    ")`.
pub fn marshal_indent(v: &Ordered) -> String {
    fn go(v: &Ordered, level: usize, out: &mut String) {
        match v {
            Ordered::Null => out.push_str("null"),
            Ordered::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Ordered::Number(n) => out.push_str(&n.to_string()),
            Ordered::String(s) => go_quote(s, out),
            Ordered::Array(items) if items.is_empty() => out.push_str("[]"),
            Ordered::Object(kv) if kv.is_empty() => out.push_str("{}"),
            Ordered::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    indent(level + 1, out);
                    go(item, level + 1, out);
                }
                indent(level, out);
                out.push(']');
            }
            Ordered::Object(kv) => {
                out.push('{');
                for (i, (k, v)) in kv.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    indent(level + 1, out);
                    go_quote(k, out);
                    out.push_str(": ");
                    go(v, level + 1, out);
                }
                indent(level, out);
                out.push('}');
            }
        }
    }
    let mut out = String::new();
    go(v, 0, &mut out);
    out
}

/// What libcni >= 1.2's `Print()` writes for a result of version `version` whose fields, in Go's
/// struct order, are `result`.
pub fn go_1_2_print(result: &Ordered, version: &str) -> String {
    if !version.starts_with("1.") {
        return marshal_indent(result);
    }
    let Ordered::Object(kv) = result else { return marshal_indent(result) };
    let kept: Vec<(String, Ordered)> =
        kv.iter().filter(|(k, v)| !(k == "dns" && *v == Ordered::Object(Vec::new()))).cloned().collect();
    marshal_indent(&Ordered::Object(kept).sorted())
}

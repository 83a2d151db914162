//! Decoding JSON the way Go's `encoding/json` matches object keys to struct fields, for every typed
//! config, `runtimeConfig`, `args` and `prevResult` decode.
//!
//! Runtimes written in Go marshal structs without JSON tags (containerd's go-cni sends
//! `{"HostPort":8080,"ContainerPort":80,...}`), and the reference plugins accept that because Go
//! matches a key to a field by its exact name first, else case-insensitively (Unicode simple folding).
//! [`GoValue`] is a serde deserializer over a borrowed [`Value`] that does the same for every struct
//! it decodes, at any depth; [`get`] applies the same rule to one key of an object for code that reads
//! keys one by one. The rules:
//! - a key equal to a field's name goes to that field; else a key equal to it under simple case
//!   folding does (the first such field in declaration order, as Go's field index has it);
//! - a key that matches no field is passed on unchanged (ignored, or kept by a `Value`/map field);
//! - two keys for one field: the exact one wins, else the last folded one in key order. Go takes the
//!   last in document order; `serde_json` keeps objects sorted, so the two agree unless a config
//!   spells one key twice with different case;
//! - maps (`Map<String, Value>`, `HashMap`) and `Value` fields get their keys as written.
//!
//! Errors name the path as the user wrote it: `portMappings[0].HostPort: invalid type: ...`; a field
//! of type [`Spelled`] also keeps its key as written, for messages about its value.
//! `#[serde(flatten)]` and untagged enums buffer their input through serde's own deserializers,
//! so keys inside them match exactly.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::{Map, Value};
use std::fmt;

/// Decode `T` from `value` with Go's key matching at every level.
pub fn from_value<'a, T: de::Deserialize<'a>>(value: &'a Value) -> Result<T, DecodeError> {
    T::deserialize(GoValue::new(value))
}

/// The value of field `name` in `obj` as Go's decoder would pick it, with the key as written.
pub fn get<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<(&'a str, &'a Value)> {
    if let Some((k, v)) = obj.get_key_value(name) {
        return Some((k.as_str(), v));
    }
    obj.iter().rev().find(|(k, _)| fold_eq(k, name)).map(|(k, v)| (k.as_str(), v))
}

/// A config error naming `key` as written: `key: why` (code 7).
pub fn invalid(key: &str, why: impl fmt::Display) -> crate::Error {
    crate::Error::config(format!("{key}: {why}"))
}

/// `v` as an object, else code 7 naming `key`.
pub fn object<'a>(v: &'a Value, key: &str) -> Result<&'a Map<String, Value>, crate::Error> {
    v.as_object().ok_or_else(|| invalid(key, format!("must be an object, got {}", kind(v))))
}

/// `v` as an array, else code 7 naming `key`.
pub fn array<'a>(v: &'a Value, key: &str) -> Result<&'a [Value], crate::Error> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(invalid(key, format!("must be an array, got {}", kind(other)))),
    }
}

/// The value of `key` in `obj` as [`get`] picks it, with the key as written; null is absent.
pub fn non_null<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<(&'a str, &'a Value)> {
    get(obj, key).filter(|(_, v)| !v.is_null())
}

/// A short name for a JSON value's type, for error messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// True if `a` and `b` are equal under Unicode simple case folding, as Go's `bytes.EqualFold`.
pub fn fold_eq(a: &str, b: &str) -> bool {
    a.chars().map(fold).eq(b.chars().map(fold))
}

/// One representative of `c`'s simple case folding orbit: every member of an orbit maps to the
/// same char. Upper then lower reaches the orbit's lowercase member from any of its members
/// ('ſ' and 's' and 'S' give 's'; the Kelvin sign, 'K' and 'k' give 'k'; 'µ', 'Μ' and 'μ' give 'μ').
/// Only single-char mappings count (simple folding); a char whose full mapping is longer keeps itself.
fn fold(c: char) -> char {
    match c {
        c if c.is_ascii() => c.to_ascii_lowercase(),
        // Go's orbits for the Turkish dotted and dotless i hold only themselves: 'ı' is not 'i'.
        '\u{130}' | '\u{131}' => c,
        c => lower(upper(c)),
    }
}

fn upper(c: char) -> char {
    single(c.to_uppercase()).unwrap_or(c)
}

fn lower(c: char) -> char {
    single(c.to_lowercase()).unwrap_or(c)
}

fn single(mut it: impl Iterator<Item = char>) -> Option<char> {
    match (it.next(), it.next()) {
        (Some(c), None) => Some(c),
        _ => None,
    }
}

/// A decode error with the path (keys as written, array indices) to the value it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// Innermost first; rendered outermost first.
    path: Vec<Segment>,
    msg: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

impl DecodeError {
    fn at(mut self, segment: Segment) -> Self {
        self.path.push(segment);
        self
    }

    /// The same error for a value found under `key` (a caller that looked the value up itself).
    pub fn under(self, key: &str) -> Self {
        self.at(Segment::Key(key.to_string()))
    }

    /// The path, e.g. `portMappings[0].HostPort` ("" at the top).
    pub fn path(&self) -> String {
        let mut out = String::new();
        for seg in self.path.iter().rev() {
            match seg {
                Segment::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }

    /// What is wrong, without the path.
    pub fn message(&self) -> &str {
        &self.msg
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.msg)
        } else {
            write!(f, "{}: {}", self.path(), self.msg)
        }
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DecodeError { path: Vec::new(), msg: msg.to_string() }
    }
}

/// A serde deserializer over a JSON value that matches struct fields as Go does (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct GoValue<'a> {
    value: &'a Value,
    /// The key this value was found under, as written, for [`Spelled`].
    key: Option<&'a str>,
}

impl<'a> GoValue<'a> {
    pub fn new(value: &'a Value) -> GoValue<'a> {
        GoValue { value, key: None }
    }
}

/// The newtype name [`Spelled`] asks [`GoValue`] for: it then also gets the key as written.
const SPELLED: &str = "\0gojson::Spelled";

/// A field's value with its key as the input wrote it (`HostPort` for the field `hostPort`), so a
/// message about the value can name the key the user wrote. Without [`GoValue`] (e.g. under
/// `serde_json`) or outside a struct, `key` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spelled<T> {
    pub key: Option<String>,
    pub value: T,
}

impl<T> Spelled<T> {
    /// The key as written, else the field's own name.
    pub fn key_or<'a>(&'a self, name: &'a str) -> &'a str {
        self.key.as_deref().unwrap_or(name)
    }
}

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Spelled<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SpelledVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: de::Deserialize<'de>> Visitor<'de> for SpelledVisitor<T> {
            type Value = Spelled<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value")
            }
            fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Spelled<T>, D::Error> {
                Ok(Spelled { key: None, value: T::deserialize(d)? })
            }
            // GoValue's answer: the key, then the value.
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Spelled<T>, A::Error> {
                let key: String = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let value: T = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(1, &self))?;
                Ok(Spelled { key: Some(key), value })
            }
        }
        d.deserialize_newtype_struct(SPELLED, SpelledVisitor(std::marker::PhantomData))
    }
}

/// The two elements GoValue hands a [`Spelled`]: the key as written, then the value.
struct KeyThenValue<'de> {
    key: Option<&'de str>,
    value: Option<GoValue<'de>>,
}

impl<'de> SeqAccess<'de> for KeyThenValue<'de> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DecodeError> {
        if let Some(key) = self.key.take() {
            return seed.deserialize(BorrowedStrDeserializer::new(key)).map(Some);
        }
        match self.value.take() {
            Some(value) => seed.deserialize(value).map(Some),
            None => Ok(None),
        }
    }
}

fn unexpected(v: &Value) -> de::Unexpected<'_> {
    match v {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => de::Unexpected::Unsigned(u),
            (_, Some(i), _) => de::Unexpected::Signed(i),
            (_, _, Some(f)) => de::Unexpected::Float(f),
            _ => de::Unexpected::Other("number"),
        },
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

fn visit_array<'de, V: Visitor<'de>>(items: &'de [Value], visitor: V) -> Result<V::Value, DecodeError> {
    let mut seq = Seq { items: items.iter().enumerate() };
    let out = visitor.visit_seq(&mut seq)?;
    match seq.items.len() {
        0 => Ok(out),
        left => Err(de::Error::invalid_length(items.len() - left, &"fewer elements in the array")),
    }
}

fn visit_object<'de, V: Visitor<'de>>(
    entries: Vec<(&'de str, &'de str, &'de Value)>,
    visitor: V,
) -> Result<V::Value, DecodeError> {
    let mut map = Entries { entries: entries.into_iter(), pending: None };
    visitor.visit_map(&mut map)
}

/// The object's entries as a struct with `fields` sees them: (field name, key as written, value).
fn struct_entries<'de>(
    obj: &'de Map<String, Value>,
    fields: &'static [&'static str],
) -> Vec<(&'de str, &'de str, &'de Value)> {
    // For each field, the entry that fills it: an exact key if there is one, else the last folded key.
    let mut exact: Vec<Option<usize>> = vec![None; fields.len()];
    let mut folded: Vec<Option<usize>> = vec![None; fields.len()];
    let mut target: Vec<Option<usize>> = Vec::with_capacity(obj.len());
    for (i, key) in obj.keys().enumerate() {
        if let Some(f) = fields.iter().position(|f| f == key) {
            exact[f] = Some(i);
            target.push(Some(f));
        } else if let Some(f) = fields.iter().position(|f| fold_eq(f, key)) {
            folded[f] = Some(i);
            target.push(Some(f));
        } else {
            target.push(None);
        }
    }
    obj.iter()
        .zip(target)
        .enumerate()
        .filter_map(|(i, ((key, value), target))| match target {
            None => Some((key.as_str(), key.as_str(), value)),
            Some(f) if exact[f].or(folded[f]) == Some(i) => Some((fields[f], key.as_str(), value)),
            // A key for a field that another key fills: Go overwrites it, so it never counts.
            Some(_) => None,
        })
        .collect()
}

impl<'de> Deserializer<'de> for GoValue<'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => visitor.visit_u64(u),
                (_, Some(i), _) => visitor.visit_i64(i),
                (_, _, Some(f)) => visitor.visit_f64(f),
                _ => Err(de::Error::custom(format!("number {n} cannot be represented"))),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => visit_array(items, visitor),
            Value::Object(obj) => visit_object(obj.iter().map(|(k, v)| (k.as_str(), k.as_str(), v)).collect(), visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match (name, self.key) {
            (SPELLED, Some(key)) => visitor.visit_seq(KeyThenValue { key: Some(key), value: Some(self) }),
            _ => visitor.visit_newtype_struct(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Object(obj) => visit_object(struct_entries(obj, fields), visitor),
            // Go decodes a struct from an object only (serde_json would take an array too).
            other => Err(de::Error::invalid_type(unexpected(other), &visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::String(variant) => visitor.visit_enum(Enum { variant, value: None }),
            Value::Object(obj) if obj.len() == 1 => match obj.iter().next() {
                Some((variant, value)) => visitor.visit_enum(Enum { variant, value: Some(value) }),
                None => Err(de::Error::invalid_type(de::Unexpected::Map, &"a map with a single key")),
            },
            Value::Object(_) => Err(de::Error::invalid_value(de::Unexpected::Map, &"a map with a single key")),
            other => Err(de::Error::invalid_type(unexpected(other), &"a string or a map with a single key")),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier
    }
}

struct Seq<'de> {
    items: std::iter::Enumerate<std::slice::Iter<'de, Value>>,
}

impl<'de> SeqAccess<'de> for Seq<'de> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DecodeError> {
        match self.items.next() {
            None => Ok(None),
            Some((i, v)) => seed.deserialize(GoValue::new(v)).map(Some).map_err(|e| e.at(Segment::Index(i))),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Entries<'de> {
    entries: std::vec::IntoIter<(&'de str, &'de str, &'de Value)>,
    pending: Option<(&'de str, &'de Value)>,
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DecodeError> {
        match self.entries.next() {
            None => Ok(None),
            Some((name, written, value)) => {
                self.pending = Some((written, value));
                seed.deserialize(BorrowedStrDeserializer::new(name)).map(Some)
            }
        }
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, DecodeError> {
        match self.pending.take() {
            Some((written, value)) => {
                let value = GoValue { value, key: Some(written) };
                seed.deserialize(value).map_err(|e| e.at(Segment::Key(written.to_string())))
            }
            None => Err(de::Error::custom("a map value was asked for before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

struct Enum<'de> {
    variant: &'de str,
    value: Option<&'de Value>,
}

impl<'de> EnumAccess<'de> for Enum<'de> {
    type Error = DecodeError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), DecodeError> {
        let v = seed.deserialize(BorrowedStrDeserializer::<DecodeError>::new(self.variant))?;
        Ok((v, self))
    }
}

impl<'de> Enum<'de> {
    fn content(&self, expected: &str) -> Result<&'de Value, DecodeError> {
        self.value.ok_or_else(|| de::Error::invalid_type(de::Unexpected::UnitVariant, &expected))
    }

    fn key(&self) -> Segment {
        Segment::Key(self.variant.to_string())
    }
}

impl<'de> VariantAccess<'de> for Enum<'de> {
    type Error = DecodeError;

    fn unit_variant(self) -> Result<(), DecodeError> {
        match self.value {
            None | Some(Value::Null) => Ok(()),
            Some(other) => Err(de::Error::invalid_type(unexpected(other), &"a unit variant")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DecodeError> {
        let value = self.content("a newtype variant")?;
        seed.deserialize(GoValue::new(value)).map_err(|e| e.at(self.key()))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DecodeError> {
        let value = self.content("a tuple variant")?;
        GoValue::new(value).deserialize_seq(visitor).map_err(|e| e.at(self.key()))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        let value = self.content("a struct variant")?;
        GoValue::new(value).deserialize_struct("", fields, visitor).map_err(|e| e.at(self.key()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase")]
    struct Mapping {
        host_port: Option<i64>,
        container_port: Option<i64>,
        protocol: Option<String>,
        #[serde(rename = "hostIP")]
        host_ip: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    struct Outer {
        #[serde(rename = "portMappings", default)]
        port_mappings: Vec<Mapping>,
        #[serde(default)]
        nested: Option<Box<Outer>>,
        #[serde(default)]
        by_name: BTreeMap<String, Mapping>,
        #[serde(default)]
        raw: Option<Value>,
    }

    #[test]
    fn exact_then_folded_at_every_depth() {
        let v = json!({"PortMappings": [{"HostPort": 18090, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}],
            "NESTED": {"portmappings": [{"HOSTPORT": 1}]},
            "By_Name": {"x": {"hostport": 2}},
            "by_name": {"Web": {"hOsTpOrT": 3}},
            "Raw": {"KeepMe": 1}});
        let o: Outer = from_value(&v).unwrap();
        assert_eq!(
            o.port_mappings,
            [Mapping {
                host_port: Some(18090),
                container_port: Some(80),
                protocol: Some("tcp".into()),
                host_ip: Some(String::new())
            }]
        );
        assert_eq!(o.nested.unwrap().port_mappings[0].host_port, Some(1));
        // "by_name" is exact and beats the folded "By_Name"; map keys are data and stay as written.
        assert_eq!(o.by_name.keys().collect::<Vec<_>>(), ["Web"]);
        assert_eq!(o.by_name["Web"].host_port, Some(3));
        assert_eq!(o.raw, Some(json!({"KeepMe": 1})));
    }

    #[test]
    fn exact_beats_folded_and_the_last_folded_wins() {
        let m: Mapping = from_value(&json!({"HostPort": 1, "hostPort": 2, "HOSTPORT": 3})).unwrap();
        assert_eq!(m.host_port, Some(2));
        // No exact key: the last in key order (serde_json keeps keys sorted).
        let m: Mapping = from_value(&json!({"HostPort": 1, "HOSTPORT": 3, "hostport": 4})).unwrap();
        assert_eq!(m.host_port, Some(4));
        assert_eq!(get(json!({"HostPort": 1, "hostport": 4}).as_object().unwrap(), "hostPort").unwrap().0, "hostport");
        let obj = json!({"HostPort": 1, "hostPort": 2});
        assert_eq!(get(obj.as_object().unwrap(), "hostPort"), Some(("hostPort", &json!(2))));
        // A losing key is dropped, not passed on: its wrong type cannot fail the decode.
        let m: Mapping = from_value(&json!({"hostPort": 2, "HostPort": "x"})).unwrap();
        assert_eq!(m.host_port, Some(2));
    }

    #[test]
    fn unknown_keys_pass_through_unchanged() {
        #[derive(Deserialize)]
        struct WithRest {
            name: String,
            #[serde(flatten)]
            rest: BTreeMap<String, Value>,
        }
        let w: WithRest = from_value(&json!({"name": "n", "Other": 1, "more": {"A": 2}})).unwrap();
        assert_eq!(w.name, "n");
        assert_eq!(w.rest, BTreeMap::from([("Other".into(), json!(1)), ("more".into(), json!({"A": 2}))]));
        // Fields of a flattened struct are matched by serde's own buffer, hence exactly.
        #[derive(Deserialize)]
        struct Flat {
            #[serde(flatten)]
            m: Mapping,
        }
        let f: Flat = from_value(&json!({"hostPort": 5})).unwrap();
        assert_eq!(f.m.host_port, Some(5));
    }

    #[test]
    fn unicode_simple_folding_as_go() {
        // Go: foldName maps 'ſ' (U+017F) to 'S' and the Kelvin sign (U+212A) to 'K'.
        assert!(fold_eq("hoſtPort", "HOSTPORT"));
        assert!(fold_eq("\u{212A}ey", "key"));
        assert!(fold_eq("µ", "Μ") && fold_eq("µ", "μ") && fold_eq("ς", "Σ") && fold_eq("ϑ", "ϴ"));
        assert!(fold_eq("Å", "\u{212B}") && fold_eq("ß", "ẞ") && fold_eq("ᾀ", "ᾈ") && fold_eq("ǅ", "Ǆ"));
        // The Turkish i's are orbits of their own in Go; "ss" is not "ß" under simple folding.
        assert!(!fold_eq("ıpMasq", "ipMasq") && !fold_eq("İpMasq", "ipMasq") && !fold_eq("ss", "ß"));
        assert!(!fold_eq("host", "hostPort"));
        let m: Mapping = from_value(&json!({"Ho\u{17F}tPort": 7, "\u{212A}": 1})).unwrap();
        assert_eq!(m.host_port, Some(7));
    }

    #[test]
    fn errors_name_the_key_as_written() {
        let e = from_value::<Outer>(&json!({"PortMappings": [{"HostPort": 1}, {"HostPort": "x"}]})).unwrap_err();
        assert_eq!(e.path(), "PortMappings[1].HostPort");
        assert_eq!(e.to_string(), "PortMappings[1].HostPort: invalid type: string \"x\", expected i64");
        let e = from_value::<(u8, u8)>(&json!([1, 2, 3])).unwrap_err();
        assert!(e.to_string().contains("fewer elements"), "{e}");
        for not_an_object in [json!("x"), json!([80, 80])] {
            let e = from_value::<Mapping>(&not_an_object).unwrap_err();
            assert!(e.to_string().contains("expected struct Mapping"), "{e}");
        }
    }

    #[test]
    fn serde_attributes_behave_as_with_serde_json() {
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(rename_all = "lowercase")]
        enum Proto {
            Tcp,
            Udp,
        }
        #[derive(Debug, Deserialize, PartialEq)]
        enum Shape {
            Point { x: i64 },
            Id(u16),
            Pair(u8, u8),
        }
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(untagged)]
        enum Either {
            N(u32),
            S(String),
        }
        #[derive(Debug, Deserialize, PartialEq)]
        struct Newtype(u8);
        fn doubled<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
            let v = Value::deserialize(d)?;
            v.as_i64().map(|n| n * 2).ok_or_else(|| de::Error::custom("not a number"))
        }
        #[derive(Debug, Deserialize, PartialEq)]
        struct All {
            proto: Proto,
            shapes: Vec<Shape>,
            either: Vec<Either>,
            #[serde(default = "seven")]
            defaulted: u8,
            newtype: Newtype,
            #[serde(deserialize_with = "doubled")]
            twice: i64,
            maybe: Option<u8>,
            unit: (),
        }
        fn seven() -> u8 {
            7
        }
        let v = json!({"Proto": "udp", "SHAPES": [{"Point": {"X": 1}}, {"Id": 9}, {"Pair": [1, 2]}],
            "either": [1, "a"], "NewType": 3, "Twice": 21, "Maybe": null, "unit": null});
        let all: All = from_value(&v).unwrap();
        assert_eq!(
            all,
            All {
                proto: Proto::Udp,
                shapes: vec![Shape::Point { x: 1 }, Shape::Id(9), Shape::Pair(1, 2)],
                either: vec![Either::N(1), Either::S("a".into())],
                defaulted: 7,
                newtype: Newtype(3),
                twice: 42,
                maybe: None,
                unit: (),
            }
        );
        // Out-of-range numbers and unknown variants fail as with serde_json, naming the key.
        let e = from_value::<All>(&json!({"proto": "icmp"})).unwrap_err();
        assert!(e.to_string().starts_with("proto: unknown variant `icmp`"), "{e}");
        let e = from_value::<Newtype>(&json!(300)).unwrap_err();
        assert!(e.to_string().contains("300"), "{e}");
        let e = from_value::<All>(&json!({"Twice": "x"})).unwrap_err();
        assert_eq!(e.to_string(), "Twice: not a number");
        let e = from_value::<All>(&json!({"proto": "tcp"})).unwrap_err();
        assert_eq!(e.to_string(), "missing field `shapes`");
    }

    #[test]
    fn spelled_carries_the_key_as_written() {
        #[derive(Debug, Deserialize)]
        struct M {
            #[serde(rename = "hostPort")]
            host_port: Option<Spelled<i64>>,
            #[serde(rename = "containerPort")]
            container_port: Spelled<i64>,
        }
        let m: M = from_value(&json!({"HostPort": 0, "containerPort": 80})).unwrap();
        let host_port = m.host_port.unwrap();
        assert_eq!((host_port.key_or("hostPort"), host_port.value), ("HostPort", 0));
        assert_eq!((m.container_port.key_or("containerPort"), m.container_port.value), ("containerPort", 80));
        let m: M = from_value(&json!({"HostPort": null, "CONTAINERPORT": 1})).unwrap();
        assert!(m.host_port.is_none());
        assert_eq!(m.container_port.key.as_deref(), Some("CONTAINERPORT"));
        // Without GoValue there is no key to tell, and the value still decodes.
        let m: M = serde_json::from_value(json!({"hostPort": 5, "containerPort": 6})).unwrap();
        assert_eq!((m.host_port.unwrap().key, m.container_port.value), (None, 6));
        let top: Spelled<u8> = from_value(&json!(7)).unwrap();
        assert_eq!((top.key, top.value), (None, 7));
        let e = from_value::<M>(&json!({"containerPort": "x"})).unwrap_err();
        assert_eq!(e.to_string(), "containerPort: invalid type: string \"x\", expected i64");
    }
}

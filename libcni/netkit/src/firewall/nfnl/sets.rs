//! Sets, maps and their elements: key types and their encoding, and the messages that add sets
//! and add or delete elements.
use super::*;

/// The type of one field of a map key (nft's datatype, whose number nft stores in the set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    Ifname,
    EtherAddr,
}

impl KeyType {
    pub(super) fn name(self) -> &'static str {
        match self {
            KeyType::Ipv4Addr => "ipv4_addr",
            KeyType::Ipv6Addr => "ipv6_addr",
            KeyType::InetProto => "inet_proto",
            KeyType::InetService => "inet_service",
            KeyType::Ifname => "ifname",
            KeyType::EtherAddr => "ether_addr",
        }
    }
    /// nft's byte order of the type: host (1) for strings, big endian (2) for the rest.
    pub(super) fn byteorder(self) -> u32 {
        match self {
            KeyType::Ifname => 1,
            _ => 2,
        }
    }
    /// nft's datatype number (TYPE_IPADDR, ...) and the field's length in bytes.
    pub(super) fn id_len(self) -> (u32, u32) {
        match self {
            KeyType::Ipv4Addr => (7, 4),
            KeyType::Ipv6Addr => (8, 16),
            KeyType::InetProto => (12, 1),
            KeyType::InetService => (13, 2),
            KeyType::Ifname => (41, 16),
            KeyType::EtherAddr => (9, 6),
        }
    }
}

/// One field of a map element's key, in the order of the map's [`KeyType`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyPart {
    Addr(IpAddr),
    Proto(u8),
    Port(u16),
    Ifname(String),
    Mac([u8; 6]),
}

impl KeyPart {
    pub(super) fn bytes(&self) -> Vec<u8> {
        match self {
            KeyPart::Addr(a) => ip_bytes(*a),
            KeyPart::Proto(p) => vec![*p],
            KeyPart::Port(p) => p.to_be_bytes().to_vec(),
            KeyPart::Ifname(n) => ifname_bytes(n).to_vec(),
            KeyPart::Mac(m) => m.to_vec(),
        }
    }
    pub(super) fn text(&self) -> String {
        match self {
            KeyPart::Addr(a) => a.to_string(),
            KeyPart::Proto(p) => proto_name(*p),
            KeyPart::Port(p) => p.to_string(),
            KeyPart::Ifname(n) => format!("\"{n}\""),
            KeyPart::Mac(m) => crate::format_mac(m),
        }
    }
}

pub(super) fn proto_name(p: u8) -> String {
    match p {
        TCP => "tcp".into(),
        UDP => "udp".into(),
        SCTP => "sctp".into(),
        other => other.to_string(),
    }
}

/// An interface name as the kernel compares it: IFNAMSIZ bytes, NUL padded.
pub(super) fn ifname_bytes(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(name.as_bytes()) {
        *o = *b;
    }
    out
}

/// A key's bytes: the fields back to back, each padded to 32 bits when there are several (a
/// concatenation occupies whole registers).
pub(crate) fn key_bytes(key: &[KeyPart]) -> Vec<u8> {
    if key.len() == 1 {
        return key[0].bytes();
    }
    let mut out = Vec::new();
    for part in key {
        out.extend(part.bytes());
        out.resize(out.len().next_multiple_of(4), 0);
    }
    out
}

pub(super) fn key_text(key: &[KeyPart]) -> String {
    key.iter().map(KeyPart::text).collect::<Vec<_>>().join(" . ")
}
/// What a set holds besides its keys.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SetData<'a> {
    /// A plain set.
    None,
    /// A verdict map.
    Verdict,
    /// A map to values of these types.
    Value(&'a [KeyType]),
}

/// A set's types, and whether its elements can be given an expiry (`flags timeout`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetSpec<'a> {
    pub key: &'a [KeyType],
    pub data: SetData<'a>,
    pub timeout: bool,
}

/// The data of an element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ElemData {
    None,
    Verdict(Verdict),
    Value(Vec<KeyPart>),
}

/// One element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elem {
    pub key: Vec<KeyPart>,
    pub data: ElemData,
    /// `timeout T expires T` (milliseconds): the element goes away by itself after that.
    pub expires_ms: Option<u64>,
    pub comment: Option<String>,
}

impl Elem {
    pub(crate) fn new(key: Vec<KeyPart>, data: ElemData) -> Elem {
        Elem { key, data, expires_ms: None, comment: None }
    }
}

/// An element as the kernel lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ElemInfo {
    /// The key's bytes (fields padded to 32 bits in a concatenation).
    pub key: Vec<u8>,
    /// The data's bytes, for a map of values.
    pub data: Option<Vec<u8>>,
    /// Milliseconds until it expires, when it has an expiry.
    pub expires_ms: Option<u64>,
    pub comment: Option<String>,
}

/// The most elements one message carries (each is ~50-60 bytes; an attribute holds 64 KiB).
pub(super) const ELEMENTS_PER_MSG: usize = 256;

impl Batch {
    /// `add set|map <family> <table> <name> { type <key> [: <data>]; [flags timeout;] }` (no
    /// error if it exists alike); `create` (EEXIST if it exists) when `excl`.
    pub(crate) fn add_set(&mut self, family: TableFamily, table: &str, name: &str, spec: SetSpec<'_>, excl: bool) {
        let names = |types: &[KeyType]| types.iter().map(|k| k.name()).collect::<Vec<_>>().join(" . ");
        let fold = |types: &[KeyType]| types.iter().fold(0u32, |acc, k| (acc << 6) | k.id_len().0);
        let len = |types: &[KeyType]| -> u32 {
            match types {
                [one] => one.id_len().1,
                _ => types.iter().map(|k| k.id_len().1.next_multiple_of(4)).sum(),
            }
        };
        let order = |types: &[KeyType]| if let [one] = types { one.byteorder() } else { 0 };
        let (kind, data_text) = match spec.data {
            SetData::None => ("set", String::new()),
            SetData::Verdict => ("map", " : verdict".to_string()),
            SetData::Value(d) => ("map", format!(" : {}", names(d))),
        };
        let flags_text = if spec.timeout { "; flags timeout" } else { "" };
        let verb = if excl { "create" } else { "add" };
        let what = format!(
            "{verb} {kind} {} {table} {name} {{ type {}{data_text}{flags_text} }}",
            family.name(),
            names(spec.key)
        );
        let mut flags = if spec.timeout { NFT_SET_TIMEOUT } else { 0 };
        if !matches!(spec.data, SetData::None) {
            flags |= NFT_SET_MAP;
        }
        let set_id = self.msgs.len() as u32 + 1;
        let msg_flags = if excl { NLM_F_CREATE | NLM_F_EXCL } else { NLM_F_CREATE };
        self.push(NFT_MSG_NEWSET, msg_flags, family, what, |a| {
            a.str(NFTA_SET_TABLE, table);
            a.str(NFTA_SET_NAME, name);
            a.u32(NFTA_SET_FLAGS, flags);
            a.u32(NFTA_SET_KEY_TYPE, fold(spec.key));
            a.u32(NFTA_SET_KEY_LEN, len(spec.key));
            match spec.data {
                SetData::None => {}
                SetData::Verdict => {
                    a.u32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
                    a.u32(NFTA_SET_DATA_LEN, 0);
                }
                SetData::Value(d) => {
                    a.u32(NFTA_SET_DATA_TYPE, fold(d));
                    a.u32(NFTA_SET_DATA_LEN, len(d));
                }
            }
            // Required by the kernel; unique within the transaction.
            a.u32(NFTA_SET_ID, set_id);
            // nft reads a key's byte order from here (an ifname key prints as "" without it); a
            // concatenation has none of its own (0), nor has a verdict.
            let mut udata = vec![UDATA_SET_KEYBYTEORDER, 4];
            udata.extend_from_slice(&order(spec.key).to_ne_bytes());
            match spec.data {
                SetData::None => {}
                SetData::Verdict => {
                    udata.extend_from_slice(&[UDATA_SET_DATABYTEORDER, 4]);
                    udata.extend_from_slice(&0u32.to_ne_bytes());
                }
                SetData::Value(d) => {
                    udata.extend_from_slice(&[UDATA_SET_DATABYTEORDER, 4]);
                    udata.extend_from_slice(&order(d).to_ne_bytes());
                }
            }
            a.bytes(NFTA_SET_USERDATA, &udata);
        });
    }

    pub(super) fn elements(
        &mut self,
        ty: u16,
        flags: u16,
        verb: &str,
        (family, table, map): (TableFamily, &str, &str),
        elems: &[Elem],
    ) {
        for chunk in elems.chunks(ELEMENTS_PER_MSG) {
            let mut keys: Vec<String> = chunk.iter().take(4).map(|e| key_text(&e.key)).collect();
            if chunk.len() > 4 {
                keys.push(format!("... ({} elements)", chunk.len()));
            }
            let what = format!("{verb} element {} {table} {map} {{ {} }}", family.name(), keys.join(", "));
            self.push(ty, flags, family, what, |a| {
                a.str(NFTA_SET_ELEM_LIST_TABLE, table);
                a.str(NFTA_SET_ELEM_LIST_SET, map);
                a.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |a| {
                    for e in chunk {
                        a.nested(NFTA_LIST_ELEM, |a| {
                            a.nested(NFTA_SET_ELEM_KEY, |a| a.bytes(NFTA_DATA_VALUE, &key_bytes(&e.key)));
                            match &e.data {
                                ElemData::None => {}
                                ElemData::Verdict(v) => a.nested(NFTA_SET_ELEM_DATA, |a| v.put(a)),
                                ElemData::Value(parts) => {
                                    a.nested(NFTA_SET_ELEM_DATA, |a| a.bytes(NFTA_DATA_VALUE, &key_bytes(parts)))
                                }
                            }
                            if let Some(ms) = e.expires_ms {
                                a.bytes(NFTA_SET_ELEM_TIMEOUT, &ms.to_be_bytes());
                                a.bytes(NFTA_SET_ELEM_EXPIRATION, &ms.to_be_bytes());
                            }
                            if let Some(c) = &e.comment {
                                if c.len() > COMMENT_MAX {
                                    a.invalid =
                                        Some(format!("element comment of {} bytes (at most {COMMENT_MAX})", c.len()));
                                }
                                a.bytes(NFTA_SET_ELEM_USERDATA, &comment_udata(c));
                            }
                        });
                    }
                });
            });
        }
    }

    /// `add element <family> <table> <set> { key [timeout T expires T] [: data] [comment ".."], ... }`:
    /// an element that exists with the same data is no error (and, with `expires_ms`, is given that
    /// expiry, on kernels with element timeout updates); one with other data is EEXIST. `create` (EEXIST if any key
    /// is there) when `excl`.
    pub(crate) fn add_elems(&mut self, family: TableFamily, table: &str, set: &str, elems: &[Elem], excl: bool) {
        let (verb, flags) = if excl { ("create", NLM_F_CREATE | NLM_F_EXCL) } else { ("add", NLM_F_CREATE) };
        self.elements(NFT_MSG_NEWSETELEM, flags, verb, (family, table, set), elems);
    }

    /// `delete element <family> <table> <map> { key, ... }` (ENOENT if a key is absent).
    pub(crate) fn delete_elements(&mut self, family: TableFamily, table: &str, map: &str, keys: &[Vec<KeyPart>]) {
        let elems: Vec<Elem> = keys.iter().map(|k| Elem::new(k.clone(), ElemData::None)).collect();
        self.elements(NFT_MSG_DELSETELEM, 0, "delete", (family, table, map), &elems);
    }
}

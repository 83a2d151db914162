//! The kernel's x_tables tables (the ones iptables-legacy shows), read and replaced in process
//! through the socket options libiptc uses, for IPv4 (`IPT_SO_*` on an AF_INET raw socket) and
//! IPv6 (`IP6T_SO_*` on AF_INET6).
//!
//! A table is read whole (`SO_GET_INFO`, then `SO_GET_ENTRIES`) and parsed into chains: builtin
//! chains start at their hook's entry and end with their policy (the hook's underflow), a user
//! chain starts with an `ERROR` entry naming it and ends with an unconditional RETURN, and the
//! table ends with an `ERROR` entry named `ERROR`. Rules keep their bytes (matches and targets we
//! do not know stay opaque); jumps are kept by chain name. A change is made to the chains and the
//! table written whole (`SO_SET_REPLACE`) with hook entries, underflows and jump offsets laid out
//! anew; the kernel answers with the old table's counters, and `SO_SET_ADD_COUNTERS` hands each
//! kept rule (and policy) its counters back, so only new rules start at zero, as with libiptc.
//! A replace whose entry count no longer matches the kernel's (the table changed since it was
//! read) is refused with EAGAIN: read and plan again. A change that keeps the count is not seen
//! by the kernel, as with libiptc: writers serialize on the xtables lock, as iptables does.
//! The layouts are those of a 64-bit process on a 64-bit kernel (no 32-bit compat layout).

use crate::Family;
use libcni::{Error, Result};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockProtocol, SockType};
use std::os::fd::{AsRawFd, OwnedFd};

/// `XT_TABLE_MAXNAMELEN`.
const TABLE_NAME_LEN: usize = 32;
/// Bytes of an extension's name (`XT_EXTENSION_MAXNAMELEN` less its revision byte).
const EXT_NAME_LEN: usize = 29;
const HOOKS: usize = 5;
/// `struct ipt_getinfo`, `ipt_get_entries` and `ipt_replace` up to their entries,
/// `xt_counters_info` up to its counters (the same for IPv6).
const GETINFO_LEN: usize = 84;
const GET_ENTRIES_HEAD: usize = 40;
const REPLACE_HEAD: usize = 96;
const COUNTERS_INFO_HEAD: usize = 40;
/// `struct xt_entry_target` (and `xt_entry_match`): size, name, revision.
const EXT_HEAD: usize = 32;
/// `XT_ALIGN(sizeof(struct xt_standard_target))`, `XT_ALIGN(sizeof(struct xt_error_target))`.
const STANDARD_TARGET_LEN: usize = 40;
const ERROR_TARGET_LEN: usize = 64;
const SO_REPLACE: libc::c_int = 64;
const SO_ADD_COUNTERS: libc::c_int = 65;
const SO_GET_INFO: libc::c_int = 64;
const SO_GET_ENTRIES: libc::c_int = 65;
/// Standard verdicts: `-NF_DROP - 1`, `-NF_ACCEPT - 1`, `XT_RETURN`.
pub const DROP: i32 = -1;
pub const ACCEPT: i32 = -2;
pub const RETURN: i32 = -5;
/// The filter table's hooks, by number: PRE_ROUTING, LOCAL_IN, FORWARD, LOCAL_OUT, POST_ROUTING.
const HOOK_CHAINS: [&str; HOOKS] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// `XT_ALIGN`.
pub fn align(n: usize) -> usize {
    (n + 7) & !7
}

/// The x_tables layouts of each address family: `ipt_entry` or `ip6t_entry`.
impl Family {
    /// Bytes of `struct ipt_ip` / `ip6t_ip6`.
    pub(crate) fn ip_len(self) -> usize {
        self.pick(84, 136)
    }
    /// `sizeof(struct ipt_entry)` / `ip6t_entry`.
    pub(crate) fn entry_len(self) -> usize {
        self.pick(112, 168)
    }
    /// Where `target_offset` sits (`next_offset`, `comefrom` follow).
    fn offsets_at(self) -> usize {
        self.pick(88, 140)
    }
    /// Where `struct xt_counters` sits.
    fn counters_at(self) -> usize {
        self.pick(96, 152)
    }
    /// The iptables command of this family: `iptables` or `ip6tables`.
    pub fn tool(self) -> &'static str {
        self.pick("iptables", "ip6tables")
    }
}

/// `struct xt_counters`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
}

/// What a rule does when it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A standard verdict: [`ACCEPT`], [`DROP`], [`RETURN`], or another negative one.
    Verdict(i32),
    /// A jump to a user chain (`-j CHAIN`, or `-g CHAIN` with the goto flag in the rule's bytes).
    Jump(String),
    /// No target: on to the next rule.
    Fallthrough,
    /// Any other target, its bytes as the kernel holds them.
    Other(Vec<u8>),
}

/// One rule: its bytes up to the target (address part, nfcache, matches; offsets, comefrom and
/// counters zero), its target, and where it was in the table as read.
#[derive(Debug, Clone)]
pub struct Rule {
    pub spec: Vec<u8>,
    pub target: Target,
    pub counters: Counters,
    read_as: Option<usize>,
}

impl Rule {
    /// A new rule: `ip` (the family's `ipt_ip`/`ip6t_ip6`) and `matches` (each
    /// `xt_entry_match` with its data, aligned).
    pub fn new(family: Family, ip: &[u8], matches: &[u8], target: Target) -> Rule {
        let mut spec = vec![0; family.entry_len()];
        spec[..ip.len()].copy_from_slice(ip);
        spec.extend_from_slice(matches);
        Rule { spec, target, counters: Counters::default(), read_as: None }
    }

    /// The same rule (what `iptables -C`/`-D` compare): bytes and target, not counters.
    pub fn same(&self, other: &Rule) -> bool {
        self.spec == other.spec && self.target == other.target
    }

    /// The data of the rule's first match named `name` (its struct, as aligned in the entry).
    pub fn match_data(&self, family: Family, name: &str) -> Option<&[u8]> {
        let mut rest = self.spec.get(family.entry_len()..)?;
        while rest.len() >= EXT_HEAD {
            let size = usize::from(u16_at(rest, 0));
            let this = rest.get(..size).filter(|_| size >= EXT_HEAD)?;
            if name_at(this, 2, EXT_NAME_LEN) == name {
                return Some(&this[EXT_HEAD..]);
            }
            rest = &rest[size..];
        }
        None
    }
}

/// An `xt_entry_match` of `name` and `revision` around `data`, aligned.
pub fn entry_match(name: &str, revision: u8, data: &[u8]) -> Vec<u8> {
    let size = align(EXT_HEAD + data.len());
    let mut m = vec![0; size];
    m[..2].copy_from_slice(&(size as u16).to_ne_bytes());
    let n = name.as_bytes();
    m[2..2 + n.len().min(EXT_NAME_LEN - 1)].copy_from_slice(&n[..n.len().min(EXT_NAME_LEN - 1)]);
    m[31] = revision;
    m[EXT_HEAD..EXT_HEAD + data.len()].copy_from_slice(data);
    m
}

/// An `xt_entry_target` of `name` and `revision` around `data`, aligned (the layout of a match):
/// a [`Target::Other`] as the kernel holds it.
pub fn entry_target(name: &str, revision: u8, data: &[u8]) -> Vec<u8> {
    entry_match(name, revision, data)
}

/// A chain: builtin (with its hook and policy) or user-defined.
#[derive(Debug, Clone)]
pub struct Chain {
    pub name: String,
    pub hook: Option<usize>,
    /// A builtin chain's policy verdict and counters.
    pub policy: i32,
    pub policy_counters: Counters,
    pub rules: Vec<Rule>,
    /// The chain's own entries (user chain head, then foot or policy) in the table as read.
    head_read_as: Option<usize>,
    foot_read_as: Option<usize>,
}

/// A table as read from the kernel.
#[derive(Debug, Clone)]
pub struct Table {
    pub family: Family,
    pub name: String,
    valid_hooks: u32,
    /// Entries of the table as read: a replace hands back this many counters.
    read_entries: usize,
    pub chains: Vec<Chain>,
}

/// `struct ipt_getinfo`: the hooks, and the entry count and size of the table's blob.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Info {
    pub valid_hooks: u32,
    pub hook_entry: [u32; HOOKS],
    pub underflow: [u32; HOOKS],
    pub num_entries: u32,
    pub size: u32,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(a)
}

/// A NUL-padded name field.
fn name_at(b: &[u8], at: usize, len: usize) -> String {
    let field = &b[at..at + len];
    let end = field.iter().position(|c| *c == 0).unwrap_or(len);
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn put_name(b: &mut [u8], at: usize, len: usize, name: &str) {
    let n = &name.as_bytes()[..name.len().min(len - 1)];
    b[at..at + n.len()].copy_from_slice(n);
}

impl Info {
    /// Decodes the fields after the name of a `struct ipt_getinfo`.
    pub fn parse(b: &[u8]) -> Info {
        let word = |i: usize| u32_at(b, TABLE_NAME_LEN + 4 * i);
        let mut info = Info { valid_hooks: word(0), num_entries: word(11), size: word(12), ..Info::default() };
        for h in 0..HOOKS {
            info.hook_entry[h] = word(1 + h);
            info.underflow[h] = word(6 + h);
        }
        info
    }
}

/// One entry of a blob: its offset and bytes.
struct Raw<'a> {
    offset: usize,
    bytes: &'a [u8],
}

impl Raw<'_> {
    fn target_name(&self, family: Family) -> String {
        let t = usize::from(u16_at(self.bytes, family.offsets_at()));
        name_at(self.bytes, t + 2, EXT_NAME_LEN)
    }
    fn target(&self, family: Family) -> &[u8] {
        &self.bytes[usize::from(u16_at(self.bytes, family.offsets_at()))..]
    }
    /// The chain an `ERROR` entry names.
    fn error_name(&self, family: Family) -> Option<String> {
        (self.target_name(family) == "ERROR").then(|| name_at(self.target(family), EXT_HEAD, 30))
    }
    fn verdict(&self, family: Family) -> Option<i32> {
        let t = self.target(family);
        (self.target_name(family).is_empty() && t.len() >= EXT_HEAD + 4).then(|| u32_at(t, EXT_HEAD) as i32)
    }
    fn counters(&self, family: Family) -> Counters {
        let at = family.counters_at();
        Counters { packets: u64_at(self.bytes, at), bytes: u64_at(self.bytes, at + 8) }
    }
}

fn malformed(family: Family, table: &str, what: impl std::fmt::Display) -> Error {
    Error::network(format!("read the {} {table} table: {what}", family.tool()))
}

impl Table {
    /// Parses a table's blob as `SO_GET_ENTRIES` returned it.
    pub fn parse(family: Family, name: &str, info: &Info, blob: &[u8]) -> Result<Table> {
        let bad = |what: String| malformed(family, name, what);
        let mut raw = Vec::new();
        let mut at = 0;
        while at < blob.len() {
            let next = blob.get(at..at + family.entry_len()).map(|e| usize::from(u16_at(e, family.offsets_at() + 2)));
            let target = blob.get(at..at + family.entry_len()).map(|e| usize::from(u16_at(e, family.offsets_at())));
            match (next, target) {
                (Some(n), Some(t)) if n >= t + EXT_HEAD && t >= family.entry_len() && at + n <= blob.len() => {
                    raw.push(Raw { offset: at, bytes: &blob[at..at + n] });
                    at += n;
                }
                _ => return Err(bad(format!("entry at offset {at} is malformed"))),
            }
        }
        let hook_at = |offset: usize| {
            (0..HOOKS).find(|h| info.valid_hooks & (1 << h) != 0 && info.hook_entry[*h] as usize == offset)
        };
        let mut table = Table {
            family,
            name: name.to_string(),
            valid_hooks: info.valid_hooks,
            read_entries: raw.len(),
            chains: Vec::new(),
        };
        // Chains first, with their rules' entries; jumps are resolved by offset afterwards.
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut i = 0;
        while i < raw.len() {
            let e = &raw[i];
            let mut chain = Chain {
                name: String::new(),
                hook: hook_at(e.offset),
                policy: 0,
                policy_counters: Counters::default(),
                rules: Vec::new(),
                head_read_as: None,
                foot_read_as: None,
            };
            let (first, foot) = if let Some(h) = chain.hook {
                let under = info.underflow[h] as usize;
                let foot = (i..raw.len())
                    .find(|j| raw[*j].offset == under)
                    .ok_or_else(|| bad(format!("no policy entry for hook {h}")))?;
                chain.name = HOOK_CHAINS[h].to_string();
                chain.policy = raw[foot].verdict(family).ok_or_else(|| bad(format!("{} has no policy", chain.name)))?;
                chain.policy_counters = raw[foot].counters(family);
                (i, foot)
            } else {
                match e.error_name(family) {
                    Some(n) if n == "ERROR" && i + 1 == raw.len() => break,
                    Some(n) => {
                        let end = (i + 1..raw.len())
                            .find(|j| raw[*j].error_name(family).is_some())
                            .ok_or_else(|| bad("the table has no end".to_string()))?;
                        if end < i + 2 {
                            return Err(bad(format!("chain {n} has no end")));
                        }
                        chain.name = n;
                        chain.head_read_as = Some(i);
                        (i + 1, end - 1)
                    }
                    None => return Err(bad(format!("entry at offset {} belongs to no chain", e.offset))),
                }
            };
            chain.foot_read_as = Some(foot);
            members.push((first..foot).collect());
            table.chains.push(chain);
            i = foot + 1;
        }
        // A jump's offset is the first entry after the target chain's head.
        let starts: Vec<(usize, String)> = table
            .chains
            .iter()
            .filter_map(|c| c.head_read_as.map(|h| (raw[h].offset + raw[h].bytes.len(), c.name.clone())))
            .collect();
        for (chain, entries) in table.chains.iter_mut().zip(members) {
            for j in entries {
                let e = &raw[j];
                let target = match e.verdict(family) {
                    Some(v) if v < 0 => Target::Verdict(v),
                    Some(v) if raw.get(j + 1).is_some_and(|n| n.offset == v as usize) => Target::Fallthrough,
                    Some(v) => match starts.iter().find(|(o, _)| *o == v as usize) {
                        Some((_, n)) => Target::Jump(n.clone()),
                        None => return Err(bad(format!("a rule of {} jumps to offset {v}, no chain", chain.name))),
                    },
                    None => Target::Other(e.target(family).to_vec()),
                };
                let mut spec = e.bytes[..usize::from(u16_at(e.bytes, family.offsets_at()))].to_vec();
                spec[family.offsets_at()..family.entry_len()].fill(0);
                chain.rules.push(Rule { spec, target, counters: e.counters(family), read_as: Some(j) });
            }
        }
        Ok(table)
    }

    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn chain_mut(&mut self, name: &str) -> Option<&mut Chain> {
        self.chains.iter_mut().find(|c| c.name == name)
    }

    /// Adds an empty user chain, among the user chains in name order (as libiptc keeps them).
    pub fn add_chain(&mut self, name: &str) {
        if self.chain(name).is_some() {
            return;
        }
        let at =
            self.chains.iter().position(|c| c.hook.is_none() && c.name.as_str() > name).unwrap_or(self.chains.len());
        let chain = Chain {
            name: name.to_string(),
            hook: None,
            policy: 0,
            policy_counters: Counters::default(),
            rules: Vec::new(),
            head_read_as: None,
            foot_read_as: None,
        };
        self.chains.insert(at, chain);
    }

    /// The table as `SO_SET_REPLACE` takes it: the `ipt_replace` head (without the counters
    /// pointer) followed by the entries, and for each entry where it was in the table as read.
    pub fn serialize(&self) -> Result<(Vec<u8>, Vec<Option<usize>>)> {
        let f = self.family;
        let error_len = f.entry_len() + ERROR_TARGET_LEN;
        let verdict_len = f.entry_len() + STANDARD_TARGET_LEN;
        let target_len = |t: &Target| match t {
            Target::Other(b) => b.len(),
            _ => STANDARD_TARGET_LEN,
        };
        // Offsets first: where each chain's rules start.
        let mut starts = Vec::new();
        let mut at = 0;
        for c in &self.chains {
            if c.hook.is_none() {
                at += error_len;
            }
            starts.push((c.name.as_str(), at));
            at += c.rules.iter().map(|r| r.spec.len() + target_len(&r.target)).sum::<usize>() + verdict_len;
        }
        let mut blob = Vec::with_capacity(at + error_len);
        let mut from = Vec::new();
        // Hooks the table has not stay at the kernel's impossible value.
        let (mut hook_entry, mut underflow) = ([u32::MAX; HOOKS], [u32::MAX; HOOKS]);
        let standard = |v: i32| {
            let mut t = vec![0; STANDARD_TARGET_LEN];
            t[..2].copy_from_slice(&(STANDARD_TARGET_LEN as u16).to_ne_bytes());
            t[EXT_HEAD..EXT_HEAD + 4].copy_from_slice(&v.to_ne_bytes());
            t
        };
        let entry = |blob: &mut Vec<u8>, spec: &[u8], target: &[u8]| {
            let start = blob.len();
            blob.extend_from_slice(spec);
            blob[start + f.offsets_at()..start + f.entry_len()].fill(0);
            blob[start + f.offsets_at()..start + f.offsets_at() + 2]
                .copy_from_slice(&(spec.len() as u16).to_ne_bytes());
            let next = (spec.len() + target.len()) as u16;
            blob[start + f.offsets_at() + 2..start + f.offsets_at() + 4].copy_from_slice(&next.to_ne_bytes());
            blob.extend_from_slice(target);
        };
        let empty = vec![0; f.entry_len()];
        let error = |name: &str| {
            let mut t = vec![0; ERROR_TARGET_LEN];
            t[..2].copy_from_slice(&(ERROR_TARGET_LEN as u16).to_ne_bytes());
            put_name(&mut t, 2, EXT_NAME_LEN, "ERROR");
            put_name(&mut t, EXT_HEAD, 30, name);
            t
        };
        for c in &self.chains {
            if let Some(h) = c.hook {
                hook_entry[h] = blob.len() as u32;
            } else {
                entry(&mut blob, &empty, &error(&c.name));
                from.push(c.head_read_as);
            }
            for r in &c.rules {
                let next = blob.len() + r.spec.len() + target_len(&r.target);
                let target = match &r.target {
                    Target::Verdict(v) => standard(*v),
                    Target::Fallthrough => standard(next as i32),
                    Target::Jump(to) => match starts.iter().find(|(n, _)| n == to) {
                        Some((_, o)) => standard(*o as i32),
                        None => {
                            return Err(Error::network(format!(
                                "write the {} {} table: a rule of {} jumps to chain {to}, which the table lacks",
                                f.tool(),
                                self.name,
                                c.name
                            )))
                        }
                    },
                    Target::Other(b) => b.clone(),
                };
                entry(&mut blob, &r.spec, &target);
                from.push(r.read_as);
            }
            if let Some(h) = c.hook {
                underflow[h] = blob.len() as u32;
            }
            entry(&mut blob, &empty, &standard(if c.hook.is_some() { c.policy } else { RETURN }));
            from.push(c.foot_read_as);
        }
        entry(&mut blob, &empty, &error("ERROR"));
        from.push(self.read_entries.checked_sub(1));
        let mut out = vec![0; REPLACE_HEAD];
        put_name(&mut out, 0, TABLE_NAME_LEN, &self.name);
        let words = [self.valid_hooks, from.len() as u32, blob.len() as u32];
        for (i, w) in words.iter().chain(&hook_entry).chain(&underflow).chain(&[self.read_entries as u32]).enumerate() {
            out[TABLE_NAME_LEN + 4 * i..TABLE_NAME_LEN + 4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        out.extend_from_slice(&blob);
        Ok((out, from))
    }

    /// The family's table `name` from the kernel of the calling thread's network namespace.
    pub fn read(family: Family, name: &str) -> Result<Table> {
        let sock = Sock::open(family, name)?;
        let mut head = [0u8; GETINFO_LEN];
        put_name(&mut head, 0, TABLE_NAME_LEN, name);
        sock.get(SO_GET_INFO, &mut head, "get its info")?;
        let info = Info::parse(&head);
        let mut buf = vec![0u8; GET_ENTRIES_HEAD + info.size as usize];
        put_name(&mut buf, 0, TABLE_NAME_LEN, name);
        buf[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&info.size.to_ne_bytes());
        sock.get(SO_GET_ENTRIES, &mut buf, "get its entries")?;
        let table = Table::parse(family, name, &info, &buf[GET_ENTRIES_HEAD..])?;
        if table.read_entries != info.num_entries as usize {
            return Err(malformed(family, name, format!("{} entries, not {}", table.read_entries, info.num_entries)));
        }
        Ok(table)
    }

    /// Writes the table whole, then gives every entry kept from the table as read its counters
    /// back. EAGAIN (kept as the error's errno): the kernel's table changed since it was read.
    pub fn replace(&self) -> Result<()> {
        let (mut buf, from) = self.serialize()?;
        let mut old = vec![Counters::default(); self.read_entries];
        // ipt_replace.counters: where the kernel writes the old table's `read_entries` counters
        // (num_counters) during the setsockopt below; `old` lives past it.
        let ptr = old.as_mut_ptr() as usize as u64;
        buf[REPLACE_HEAD - 8..REPLACE_HEAD].copy_from_slice(&ptr.to_ne_bytes());
        let sock = Sock::open(self.family, &self.name)?;
        sock.set(SO_REPLACE, &buf, "replace it")?;
        let mut add = vec![0u8; COUNTERS_INFO_HEAD];
        put_name(&mut add, 0, TABLE_NAME_LEN, &self.name);
        add[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&(from.len() as u32).to_ne_bytes());
        for f in &from {
            let c = f.and_then(|i| old.get(i)).copied().unwrap_or_default();
            add.extend_from_slice(&c.packets.to_ne_bytes());
            add.extend_from_slice(&c.bytes.to_ne_bytes());
        }
        sock.set(SO_ADD_COUNTERS, &add, "restore its counters")
    }

    /// Whether the kernel has the family's table (code 50 naming it when not).
    pub fn available(family: Family, name: &str) -> Result<()> {
        let sock = Sock::open(family, name)?;
        let mut head = [0u8; GETINFO_LEN];
        put_name(&mut head, 0, TABLE_NAME_LEN, name);
        sock.get(SO_GET_INFO, &mut head, "get its info")
            .map_err(|e| Error::new(libcni::code::NOT_AVAILABLE, e.msg.clone()).with_errno(e.errno.unwrap_or(0)))
    }
}

/// The raw socket the table's socket options go through.
struct Sock {
    fd: OwnedFd,
    family: Family,
    table: String,
}

impl Sock {
    fn open(family: Family, table: &str) -> Result<Sock> {
        let domain = family.pick(AddressFamily::Inet, AddressFamily::Inet6);
        let fd = socket::socket(domain, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Raw)
            .map_err(|e| Error::os(e as i32, format!("open a raw socket for the {} {table} table", family.tool())))?;
        Ok(Sock { fd, family, table: table.to_string() })
    }

    fn level(&self) -> libc::c_int {
        self.family.pick(libc::IPPROTO_IP, libc::IPPROTO_IPV6)
    }

    fn fail(&self, what: &str) -> Error {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let hint = match errno {
            libc::ENOPROTOOPT | libc::ENOENT => " (is the kernel's ip_tables / ip6_tables module loaded?)",
            _ => "",
        };
        Error::os(errno, format!("{} {} table: {what}{hint}", self.family.tool(), self.table))
    }

    fn get(&self, opt: libc::c_int, buf: &mut [u8], what: &str) -> Result<()> {
        let mut len = buf.len() as libc::socklen_t;
        // nix has no option for IPT_SO_GET_* (a table's bytes of any length).
        // SAFETY: buf is valid for writes of len bytes, and len is written back by the kernel.
        let rc = unsafe { libc::getsockopt(self.fd.as_raw_fd(), self.level(), opt, buf.as_mut_ptr().cast(), &mut len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(self.fail(what))
        }
    }

    fn set(&self, opt: libc::c_int, buf: &[u8], what: &str) -> Result<()> {
        // nix has no option for IPT_SO_SET_* (a table's bytes of any length).
        // SAFETY: buf is valid for reads of its length.
        let rc = unsafe {
            libc::setsockopt(self.fd.as_raw_fd(), self.level(), opt, buf.as_ptr().cast(), buf.len() as libc::socklen_t)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(self.fail(what))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;

//! GETs and dumps: listing a chain, a set's elements and the ruleset's generation, and parsing
//! what the kernel answers.
use super::*;

/// One chain as the kernel lists it: whether it is a base chain, and each rule's comment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ChainListing {
    pub base: bool,
    pub comments: Vec<Option<String>>,
    /// Each rule's handle and expressions ([`Rule::encoded`]'s form, counters at zero).
    pub rules: Vec<(u64, Vec<u8>)>,
}

/// NETLINK_NETFILTER requests and batches on one socket, in the calling thread's network
/// namespace, opened at the first of them: an operation that lists chains, reads the generation
/// and sends a batch (every iptables-nft and nftables backend operation) opens one socket, not
/// one per request. [`generation`], [`Batch::send`] and [`Batch::send_each`] are one request
/// on a socket of their own, for callers that make only that one.
#[derive(Debug, Default)]
pub(crate) struct Conn {
    nl: std::cell::OnceCell<Exchange>,
}

impl Conn {
    /// A connection that opens its socket at its first request.
    pub(crate) fn new() -> Conn {
        Conn::default()
    }

    fn nl(&self) -> Result<&Exchange> {
        if let Some(nl) = self.nl.get() {
            return Ok(nl);
        }
        let nl = open()?;
        Ok(self.nl.get_or_init(|| nl))
    }

    /// Lists one chain: NFT_MSG_GETCHAIN (is it there, does it have a hook), then a dump of its
    /// rules (NFT_MSG_GETRULE with the table and chain), reading each rule's comment from its user
    /// data as nft writes it. None when the chain or its table does not exist. Two round trips,
    /// whatever else the table holds.
    pub(crate) fn list_chain(&self, family: TableFamily, table: &str, chain: &str) -> Result<Option<ChainListing>> {
        list_chain_on(self.nl()?, family, table, chain)
    }

    /// [`generation`] on this socket.
    pub(crate) fn generation(&self) -> Result<u32> {
        generation_on(self.nl()?)
    }

    /// The elements of a set as the kernel lists them: the one with `key` (NFT_MSG_GETSETELEM for
    /// that key: one round trip, whatever the set holds), or all of them (a dump) when `key` is None.
    /// Empty when there is no such element, set or table (the kernel answers ENOENT to all three).
    pub(crate) fn get_elements(
        &self,
        family: TableFamily,
        table: &str,
        set: &str,
        key: Option<&[KeyPart]>,
    ) -> Result<Vec<ElemInfo>> {
        get_elements_on(self.nl()?, family, table, set, key)
    }

    /// [`Batch::send`] on this socket.
    pub(crate) fn send(&self, b: &Batch) -> Result<()> {
        b.send_on(self)
    }

    /// [`Batch::send_each`] on this socket.
    pub(crate) fn send_each(&self, b: &Batch) -> Result<Vec<Failure>> {
        b.send_each_on(self)
    }

    pub(super) fn exchange(&self) -> Result<&Exchange> {
        self.nl()
    }
}

fn list_chain_on(nl: &Exchange, family: TableFamily, table: &str, chain: &str) -> Result<Option<ChainListing>> {
    let what = format!("list chain {} {table} {chain}", family.name());
    let mut attrs = Attrs::default();
    attrs.str(NFTA_CHAIN_TABLE, table);
    attrs.str(NFTA_CHAIN_NAME, chain);
    let answers = get_on(nl, family, NFT_MSG_GETCHAIN, false, &attrs, &what)?.unwrap_or_default();
    let Some((_, chain_attrs)) = answers.iter().find(|(ty, _)| *ty == NFT_MSG_NEWCHAIN) else { return Ok(None) };
    let base = attributes(chain_attrs).any(|(t, _)| t == NFTA_CHAIN_HOOK);
    let mut attrs = Attrs::default();
    attrs.str(NFTA_RULE_TABLE, table);
    attrs.str(NFTA_RULE_CHAIN, chain);
    // None: gone since it was looked up (a parallel DEL).
    let Some(rules) = get_on(nl, family, NFT_MSG_GETRULE, true, &attrs, &what)? else { return Ok(None) };
    let rules: Vec<&[u8]> = rules.iter().filter(|(ty, _)| *ty == NFT_MSG_NEWRULE).map(|(_, r)| &r[..]).collect();
    let attr = |rule: &[u8], ty: u16| attributes(rule).find(|(t, _)| *t == ty).map(|(_, v)| v.to_vec());
    let comments = rules.iter().map(|r| attr(r, NFTA_RULE_USERDATA).and_then(|v| udata_comment(&v))).collect();
    let rules = rules
        .iter()
        .map(|r| {
            let handle = attr(r, NFTA_RULE_HANDLE).and_then(|h| h.try_into().ok()).map_or(0, u64::from_be_bytes);
            let mut exprs = Attrs::default();
            for (_, e) in attributes(&attr(r, NFTA_RULE_EXPRESSIONS).unwrap_or_default()) {
                match attr(e, NFTA_EXPR_NAME) {
                    Some(name) if name == b"counter\0" => Expr::Counter.put(&mut exprs),
                    Some(name) if name == b"bitwise\0" => exprs.bytes(NFTA_LIST_ELEM | NLA_F_NESTED, &bool_bitwise(e)),
                    _ => exprs.bytes(NFTA_LIST_ELEM | NLA_F_NESTED, e),
                }
            }
            (handle, unflag(&exprs.buf))
        })
        .collect();
    Ok(Some(ChainListing { base, comments, rules }))
}

/// The packets the `counter` expressions of a chain's rules have counted, summed (one dump of
/// the chain's rules); None when the chain or its table does not exist.
pub(crate) fn chain_packets(family: TableFamily, table: &str, chain: &str) -> Result<Option<u64>> {
    const NFTA_COUNTER_PACKETS: u16 = 2;
    let what = format!("list chain {} {table} {chain}", family.name());
    let mut attrs = Attrs::default();
    attrs.str(NFTA_RULE_TABLE, table);
    attrs.str(NFTA_RULE_CHAIN, chain);
    let Some(rules) = get_on(&open()?, family, NFT_MSG_GETRULE, true, &attrs, &what)? else { return Ok(None) };
    let attr = |m: &[u8], ty: u16| attributes(m).find(|(t, _)| *t == ty).map(|(_, v)| v.to_vec());
    let mut packets = 0;
    for (_, rule) in rules.iter().filter(|(ty, _)| *ty == NFT_MSG_NEWRULE) {
        for (_, e) in attributes(&attr(rule, NFTA_RULE_EXPRESSIONS).unwrap_or_default()) {
            if attr(e, NFTA_EXPR_NAME).as_deref() == Some(b"counter\0") {
                let count = attr(e, NFTA_EXPR_DATA).and_then(|d| attr(&d, NFTA_COUNTER_PACKETS));
                packets += count.and_then(|c| <[u8; 8]>::try_from(c).ok()).map_or(0, u64::from_be_bytes);
            }
        }
    }
    Ok(Some(packets))
}

/// ERESTART: a batch with a [`Batch::genid`] was refused because the ruleset changed.
pub(crate) const GENERATION_CHANGED: i32 = 85;

/// The ruleset's generation (NFT_MSG_GETGEN), for [`Batch::genid`]; an error also when the
/// kernel does not answer nf_tables requests.
pub(crate) fn generation() -> Result<u32> {
    Conn::new().generation()
}

fn generation_on(nl: &Exchange) -> Result<u32> {
    let answers =
        get_on(nl, TableFamily::Inet, NFT_MSG_GETGEN, false, &Attrs::default(), "get generation")?.unwrap_or_default();
    let id =
        answers.iter().filter(|(ty, _)| *ty == NFT_MSG_NEWGEN).flat_map(|(_, m)| attributes(m)).find(|(t, _)| *t == 1);
    match id.and_then(|(_, v)| <[u8; 4]>::try_from(v).ok()) {
        Some(v) => Ok(u32::from_be_bytes(v)),
        None => Err(Error::network("nft get generation: the kernel gave none")),
    }
}

fn get_elements_on(
    nl: &Exchange,
    family: TableFamily,
    table: &str,
    set: &str,
    key: Option<&[KeyPart]>,
) -> Result<Vec<ElemInfo>> {
    let what = match key {
        Some(k) => format!("get element {} {table} {set} {{ {} }}", family.name(), key_text(k)),
        None => format!("list set {} {table} {set}", family.name()),
    };
    let mut attrs = Attrs::default();
    attrs.str(NFTA_SET_ELEM_LIST_TABLE, table);
    attrs.str(NFTA_SET_ELEM_LIST_SET, set);
    if let Some(k) = key {
        attrs.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |a| {
            a.nested(NFTA_LIST_ELEM, |a| a.nested(NFTA_SET_ELEM_KEY, |a| a.bytes(NFTA_DATA_VALUE, &key_bytes(k))))
        });
    }
    let answers = get_on(nl, family, NFT_MSG_GETSETELEM, key.is_none(), &attrs, &what)?.unwrap_or_default();
    Ok(answers
        .iter()
        .filter(|(ty, _)| *ty == NFT_MSG_NEWSETELEM)
        .flat_map(|(_, msg)| attributes(msg).filter(|(t, _)| *t == NFTA_SET_ELEM_LIST_ELEMENTS))
        .flat_map(|(_, list)| attributes(list).map(|(_, elem)| elem_info(elem)))
        .collect())
}

/// One nf_tables message answering a request: its type and its attributes.
pub(super) type Answer = (u16, Vec<u8>);

/// Sends one GET request (a dump when `dump`) and collects the nf_tables messages that answer it
/// (type, attributes). None when the kernel answers ENOENT (no such table, chain, set or element).
pub(super) fn get_on(
    nl: &Exchange,
    family: TableFamily,
    ty: u16,
    dump: bool,
    attrs: &Attrs,
    what: &str,
) -> Result<Option<Vec<Answer>>> {
    let flags = if dump { NLM_F_REQUEST | NLM_F_DUMP } else { NLM_F_REQUEST };
    let encode = |seq| {
        let mut req = Vec::new();
        nlmsg(&mut req, (NFNL_SUBSYS_NFTABLES << 8) | ty, flags, seq, [family.nfproto(), 0, 0, 0], &attrs.buf);
        req
    };
    let collect = |out: &mut Vec<Answer>, h: &Header, msg: &[u8]| {
        if h.ty >> 8 == NFNL_SUBSYS_NFTABLES {
            out.push((h.ty & 0xff, msg.get(NLMSG_HDRLEN + 4..).unwrap_or_default().to_vec()));
        }
        Ok(())
    };
    let answers = if dump {
        nl.dump(encode, collect)
    } else {
        let seq = nl.next_seqs(1);
        let mut out = Vec::new();
        nl.request(&encode(seq), seq, Ends::One, |h, m| collect(&mut out, h, m)).map(|()| out)
    };
    match answers {
        Ok(answers) => Ok(Some(answers)),
        Err(NlFailure::Errno(libc::ENOENT, _)) => Ok(None),
        Err(f) => Err(f.into_error(format_args!("nft {what}"))),
    }
}

pub(super) fn elem_info(elem: &[u8]) -> ElemInfo {
    let value = |v: &[u8]| attributes(v).find(|(t, _)| *t == NFTA_DATA_VALUE).map(|(_, b)| b.to_vec());
    let mut info = ElemInfo::default();
    for (t, v) in attributes(elem) {
        match t {
            NFTA_SET_ELEM_KEY => info.key = value(v).unwrap_or_default(),
            NFTA_SET_ELEM_DATA => info.data = value(v),
            NFTA_SET_ELEM_EXPIRATION if v.len() == 8 => {
                info.expires_ms = Some(u64::from_be_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]))
            }
            NFTA_SET_ELEM_USERDATA => info.comment = udata_comment(v),
            _ => {}
        }
    }
    info
}

/// The kernel's refusal of `what` (in nft syntax), with the OS error number as data and the
/// kernel's own text (extended ack) when it gave one.
pub(super) fn refused(what: &str, errno: i32, text: Option<String>) -> Error {
    let kernel = text.map(|t| format!(" ({t})")).unwrap_or_default();
    Error::os(errno, format_args!("nft {what}{kernel}"))
}

/// A listed `bitwise` expression without the NFTA_BITWISE_OP the kernel adds when it is the
/// plain mask-and-xor one (NFT_BITWISE_BOOL, what nft and iptables-nft send without it).
fn bool_bitwise(e: &[u8]) -> Vec<u8> {
    const NFTA_BITWISE_OP: u16 = 6;
    let mut out = Attrs::default();
    for (t, v) in attributes(e) {
        if t != NFTA_EXPR_DATA {
            out.bytes(t, v);
            continue;
        }
        let mut data = Attrs::default();
        for (t, v) in attributes(v).filter(|(t, v)| !(*t == NFTA_BITWISE_OP && *v == [0; 4])) {
            data.bytes(t, v);
        }
        out.bytes(NFTA_EXPR_DATA, &data.buf);
    }
    out.buf
}

/// Each expression of a rule in [`Rule::encoded`]'s form (as [`ChainListing::rules`] holds a
/// listed one): its name and the attributes of its data.
fn expressions(encoded: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    attributes(encoded).filter_map(|(_, e)| {
        let find = |ty| attributes(e).find(|(t, _)| *t == ty).map(|(_, v)| v);
        Some((find(NFTA_EXPR_NAME)?.split(|&c| c == 0).next()?, find(NFTA_EXPR_DATA)?))
    })
}

fn nul_terminated(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or_default()).into_owned()
}

/// The chain a rule in [`Rule::encoded`]'s form jumps or goes to, when its verdict is one.
pub(crate) fn rule_jump(encoded: &[u8]) -> Option<String> {
    const NFT_JUMP: i32 = -3;
    const NFT_GOTO: i32 = -4;
    let (_, data) = expressions(encoded).find(|(name, _)| *name == b"immediate")?;
    let find = |b, ty| attributes(b).find(|(t, _)| *t == ty).map(|(_, v)| v);
    let verdict = find(find(data, 2)?, NFTA_DATA_VERDICT)?; // NFTA_IMMEDIATE_DATA
    let code = i32::from_be_bytes(find(verdict, NFTA_VERDICT_CODE)?.try_into().ok()?);
    [NFT_JUMP, NFT_GOTO].contains(&code).then(|| find(verdict, NFTA_VERDICT_CHAIN).map(nul_terminated)).flatten()
}

/// The text of the xtables `comment` match (iptables' `-m comment --comment`) of a rule in
/// [`Rule::encoded`]'s form, when it has one.
pub(crate) fn rule_xt_comment(encoded: &[u8]) -> Option<String> {
    expressions(encoded).filter(|(name, _)| *name == b"match").find_map(|(_, data)| {
        let find = |ty| attributes(data).find(|(t, _)| *t == ty).map(|(_, v)| v);
        (nul_terminated(find(1)?) == "comment").then(|| find(3).map(nul_terminated)).flatten()
    })
}

/// Attributes with NLA_F_NESTED cleared in every nest that has it (the kernel lists the nests
/// inside an expression without it, whatever it was given).
pub(super) fn unflag(mut b: &[u8]) -> Vec<u8> {
    let mut out = Attrs::default();
    while b.len() >= 4 {
        let (len, ty) = (usize::from(u16::from_ne_bytes([b[0], b[1]])), u16::from_ne_bytes([b[2], b[3]]));
        let Some(value) = b.get(4..len) else { break };
        match ty & NLA_F_NESTED {
            0 => out.bytes(ty, value),
            _ => out.bytes(ty & !NLA_F_NESTED, &unflag(value)),
        }
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    out.buf
}

/// The comment TLV of a rule's user data (NFTNL_UDATA_RULE_COMMENT), without its NUL.
pub(super) fn udata_comment(mut udata: &[u8]) -> Option<String> {
    while udata.len() >= 2 {
        let (ty, len) = (udata[0], usize::from(udata[1]));
        let value = udata.get(2..2 + len)?;
        if ty == UDATA_COMMENT {
            let text = value.split(|&c| c == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        udata = &udata[2 + len..];
    }
    None
}

/// A NETLINK_NETFILTER socket in the calling thread's network namespace.
pub(super) fn open() -> Result<Exchange> {
    Exchange::open(SockProtocol::NetlinkNetFilter)
        .map_err(|e| Error::network(format!("open a netfilter netlink socket: {e}")))
}

#[cfg(test)]
mod tests;

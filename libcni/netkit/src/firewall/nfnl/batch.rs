//! The transaction: netlink attributes and messages as written, the [`Batch`] of messages sent
//! between NFNL_MSG_BATCH_BEGIN and NFNL_MSG_BATCH_END, and the reading of every answer to it.
use super::*;

/// Netlink attributes being written (nested ones get their length when closed).
#[derive(Default)]
pub(super) struct Attrs {
    pub(super) buf: Vec<u8>,
    /// An attribute came out longer than its 16-bit length field can say.
    pub(super) too_long: bool,
    /// Something the message cannot carry, reported by [`Batch::send`].
    pub(super) invalid: Option<String>,
}

impl Attrs {
    pub(super) fn header(&mut self, ty: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        at
    }
    pub(super) fn close(&mut self, at: usize) {
        let len = self.buf.len() - at;
        match u16::try_from(len) {
            Ok(l) => self.buf[at..at + 2].copy_from_slice(&l.to_ne_bytes()),
            Err(_) => self.too_long = true,
        }
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
    }
    pub(super) fn bytes(&mut self, ty: u16, data: &[u8]) {
        let at = self.header(ty);
        self.buf.extend_from_slice(data);
        self.close(at);
    }
    pub(super) fn u32(&mut self, ty: u16, v: u32) {
        self.bytes(ty, &v.to_be_bytes());
    }
    pub(super) fn str(&mut self, ty: u16, s: &str) {
        let at = self.header(ty);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self.close(at);
    }
    pub(super) fn nested(&mut self, ty: u16, f: impl FnOnce(&mut Attrs)) {
        let at = self.header(ty | NLA_F_NESTED);
        f(self);
        self.close(at);
    }
}

/// One message of a batch.
#[derive(Debug, Clone)]
pub(super) struct Msg {
    pub(super) ty: u16,
    pub(super) flags: u16,
    pub(super) family: TableFamily,
    pub(super) attrs: Vec<u8>,
    pub(super) too_long: bool,
    pub(super) invalid: Option<String>,
    /// The operation in nft syntax, for errors.
    pub(super) what: String,
}

/// A message of a batch the kernel refused.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// The message's index in the batch.
    pub index: usize,
    pub errno: i32,
    /// What [`Batch::send`] would return for it alone.
    pub error: Error,
}

/// nf_tables changes applied together by [`Batch::send`]: all of them or none.
#[derive(Debug, Clone, Default)]
pub(crate) struct Batch {
    pub(super) msgs: Vec<Msg>,
    /// The kernel refuses the batch with ERESTART ([`GENERATION_CHANGED`]) when the ruleset is
    /// no longer at this generation ([`generation`]): what was read is still what it changes.
    pub genid: Option<u32>,
}

impl Batch {
    pub(crate) fn new() -> Batch {
        Batch::default()
    }

    /// The number of messages.
    pub(crate) fn len(&self) -> usize {
        self.msgs.len()
    }

    pub(super) fn push(&mut self, ty: u16, flags: u16, family: TableFamily, what: String, f: impl FnOnce(&mut Attrs)) {
        let mut a = Attrs::default();
        f(&mut a);
        self.msgs.push(Msg { ty, flags, family, attrs: a.buf, too_long: a.too_long, invalid: a.invalid, what });
    }

    /// The batch as sent: BATCH_BEGIN (sequence `seq`), the messages (`seq + 1 + i`), BATCH_END.
    pub(super) fn encode(&self, seq: u32) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let res_id = NFNL_SUBSYS_NFTABLES.to_be_bytes();
        let mut begin = Attrs::default();
        if let Some(g) = self.genid {
            begin.u32(1, g); // NFNL_BATCH_GENID
        }
        nlmsg(&mut out, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, [0, 0, res_id[0], res_id[1]], &begin.buf);
        for (i, m) in self.msgs.iter().enumerate() {
            if m.too_long || m.attrs.len() > u32::MAX as usize / 2 {
                return Err(Error::network(format!("nft {}: message too long for netlink", m.what)));
            }
            if let Some(why) = &m.invalid {
                return Err(Error::network(format!("nft {}: {why}", m.what)));
            }
            let ty = (NFNL_SUBSYS_NFTABLES << 8) | m.ty;
            let flags = NLM_F_REQUEST | NLM_F_ACK | m.flags;
            nlmsg(&mut out, ty, flags, seq.wrapping_add(1 + i as u32), [m.family.nfproto(), 0, 0, 0], &m.attrs);
        }
        let end = seq.wrapping_add(1 + self.msgs.len() as u32);
        nlmsg(&mut out, NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, [0, 0, res_id[0], res_id[1]], &[]);
        Ok(out)
    }

    /// Sends the batch as one transaction and reads every answer. Ok when the kernel applied it
    /// all; otherwise nothing was applied and the error (code 100) names the first message that
    /// failed, ending with its OS error (`... : File exists (os error 17)`). An empty batch sends
    /// nothing. One batch on a socket of its own: see [`Conn::send`].
    pub(crate) fn send(&self) -> Result<()> {
        self.send_on(&Conn::new())
    }

    pub(super) fn send_on(&self, nl: &Conn) -> Result<()> {
        let failures = self.send_each_on(nl)?;
        match failures.first() {
            None => Ok(()),
            Some(first) => {
                let err = first.error.clone();
                if failures.len() > 1 {
                    let others: Vec<&str> = failures[1..].iter().map(|f| f.error.msg.as_str()).collect();
                    return Err(err.with_details(format!("also failed (nothing was applied): {}", others.join("; "))));
                }
                Err(err)
            }
        }
    }

    /// Like [`Batch::send`], but tells every message that failed (index in the batch, as
    /// [`Batch::len`] counted before adding it), first message first, so a caller can drop those
    /// and send the rest again. Ok(empty): applied. Ok(failures): nothing was applied. Err: the
    /// batch could not be sent or answered, or the commit itself failed.
    pub(crate) fn send_each(&self) -> Result<Vec<Failure>> {
        self.send_each_on(&Conn::new())
    }

    pub(super) fn send_each_on(&self, conn: &Conn) -> Result<Vec<Failure>> {
        if self.msgs.is_empty() {
            return Ok(Vec::new());
        }
        let nl = conn.exchange()?;
        // BATCH_BEGIN, the messages, BATCH_END.
        let first = nl.next_seqs(self.msgs.len() as u32 + 2);
        let buf = self.encode(first)?;
        nl.make_room(self.msgs.len(), buf.len());
        self.read_answers(nl, &buf, first)
    }

    pub(super) fn read_answers(&self, nl: &Exchange, batch: &[u8], first: u32) -> Result<Vec<Failure>> {
        let n = self.msgs.len();
        let mut answered = vec![false; n];
        let mut pending = n;
        // (message index, errno, kernel's message) of every failure, in the kernel's order.
        let mut failures: Vec<(usize, i32, Option<String>)> = Vec::new();
        let mut commit = None;
        nl.acks(batch, first, n as u32 + 2, |offset, outcome| {
            let refusal = match outcome {
                Err(NlFailure::Errno(errno, text)) => Some((errno, text)),
                _ => None,
            };
            let Some(idx) = (offset as usize).checked_sub(1).filter(|i| *i < n) else {
                // The batch's begin or end: the commit failed.
                commit = refusal;
                return commit.is_some();
            };
            if let Some(done) = answered.get_mut(idx).filter(|done| !**done) {
                *done = true;
                pending -= 1;
            }
            if let Some((errno, text)) = refusal {
                failures.push((idx, errno, text));
            }
            pending == 0
        })
        .map_err(|f| f.into_error(format_args!("nft transaction of {n} messages ({}, ...)", self.msgs[0].what)))?;
        if let Some((errno, text)) = commit {
            return Err(self.failed(None, errno, text));
        }
        failures.sort_by_key(|f| f.0);
        Ok(failures
            .into_iter()
            .map(|(index, errno, text)| Failure { index, errno, error: self.failed(Some(index), errno, text) })
            .collect())
    }

    pub(super) fn failed(&self, idx: Option<usize>, errno: i32, text: Option<String>) -> Error {
        match idx {
            Some(i) => refused(&self.msgs[i].what, errno, text),
            None => {
                let what = format!("commit of {} messages ({}, ...)", self.msgs.len(), self.msgs[0].what);
                refused(&what, errno, text)
            }
        }
    }
}

/// A comment as nft stores it in a chain's or rule's user data: one TLV, NUL-terminated.
pub(super) fn comment_udata(text: &str) -> Vec<u8> {
    let mut udata = vec![UDATA_COMMENT, (text.len() + 1).min(255) as u8];
    udata.extend_from_slice(text.as_bytes());
    udata.push(0);
    udata
}

/// Appends one netlink message with an nfgenmsg header.
pub(super) fn nlmsg(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, nfgen: [u8; 4], attrs: &[u8]) {
    let len = (NLMSG_HDRLEN + 4 + attrs.len()) as u32;
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&nfgen);
    out.extend_from_slice(attrs);
}

#[cfg(test)]
mod tests;

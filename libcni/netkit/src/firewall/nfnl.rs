//! nf_tables over netlink, in process: a [`Batch`] of typed messages sent as one transaction.
//!
//! Running `nft -f -` costs a process, libnftables and a ruleset cache fill (~3.5-5 ms) per
//! operation; this is one `sendmsg` of a netfilter batch (`NFNL_MSG_BATCH_BEGIN`, the messages,
//! `NFNL_MSG_BATCH_END`) on a `NETLINK_NETFILTER` socket and reading the kernel's answers. Every
//! message asks for an ack (`NLM_F_ACK`); the kernel applies all of them or none, and an error
//! names the message that failed in nft syntax, e.g.
//! `nft add set inet cni_rs_portmap own4 { ... }: File exists (os error 17)`, and carries the
//! OS error number as data ([`Error::os`]) for [`crate::is_exists`] and [`crate::is_not_found`].
//!
//! Messages and expressions are encoded the way nft 1.0 encodes them (the same attributes, the
//! same registers, the same dependencies), so a rule added here lists exactly like the one nft
//! adds from the text in the docs of [`Rule`]; the tests check that against `nft` for every rule
//! shape the backend uses. Objects are referred to by name (sets and chains added earlier in the
//! same batch are found by name too).

use crate::nlsock::{attributes, Answer as Ends, Exchange, Failure as NlFailure, Header, NLMSG_HDRLEN};
use crate::Family;
use ipnetwork::IpNetwork;
use libcni::{Error, Result};
use nix::sys::socket::SockProtocol;
use std::net::IpAddr;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
#[cfg(test)]
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;

// enum nf_tables_msg_types
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_CHAIN_USERDATA: u16 = 12;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
/// NFTA_RULE_COMPAT { PROTO, FLAGS }: what iptables-nft adds to every rule (zeros without `-p`).
const NFTA_RULE_COMPAT: u16 = 5;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
/// NFTNL_UDATA_SET_KEYBYTEORDER / _DATABYTEORDER: how nft prints the keys and data of a set.
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_DATABYTEORDER: u8 = 1;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_SET_ELEM_EXPIRATION: u16 = 5;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
/// NFTNL_UDATA_CHAIN_COMMENT / NFTNL_UDATA_RULE_COMMENT: the TLV nft keeps a comment in.
const UDATA_COMMENT: u8 = 0;
/// NFT_USERDATA_MAXLEN is 256 bytes for the whole user data (2 bytes of TLV header, a NUL).
const COMMENT_MAX: usize = 253;

const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// RTN_LOCAL, the route type `fib ... type local` compares with (host byte order, 4 bytes).
const RTN_LOCAL: u32 = 2;
/// IPS_DST_NAT: the conntrack status bit of `ct status dnat` (host byte order, 4 bytes).
const IPS_DST_NAT: u32 = 1 << 5;

/// `ct state` bits (NF_CT_STATE_*_BIT, host byte order): what [`Rule::ct_state_any`] and
/// [`Rule::ct_state_none`] test. A packet conntrack does not track is `untracked`, one it
/// could not make sense of `invalid`.
pub(crate) const CT_INVALID: u32 = 1;
pub(crate) const CT_ESTABLISHED: u32 = 1 << 1;
pub(crate) const CT_RELATED: u32 = 1 << 2;
pub(crate) const CT_UNTRACKED: u32 = 1 << 6;

/// Protocol numbers for [`Rule::dport`] and map keys.
pub(crate) const TCP: u8 = 6;
pub(crate) const UDP: u8 = 17;
pub(crate) const SCTP: u8 = 132;

/// The protocol number of a mapping's protocol.
pub(crate) fn proto_number(p: super::Protocol) -> u8 {
    match p {
        super::Protocol::Tcp => TCP,
        super::Protocol::Udp => UDP,
        super::Protocol::Sctp => SCTP,
    }
}

/// An nf_tables table family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableFamily {
    Inet,
    Ip,
    Ip6,
    Bridge,
}

impl TableFamily {
    fn nfproto(self) -> u8 {
        match self {
            TableFamily::Inet => 1,
            TableFamily::Ip => NFPROTO_IPV4,
            TableFamily::Ip6 => NFPROTO_IPV6,
            TableFamily::Bridge => 7,
        }
    }
    /// The family as nft spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TableFamily::Inet => "inet",
            TableFamily::Ip => "ip",
            TableFamily::Ip6 => "ip6",
            TableFamily::Bridge => "bridge",
        }
    }
}

/// The verdict of a rule or of a verdict-map element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accept,
    Drop,
    Jump(String),
    Return,
}

impl Verdict {
    fn code(&self) -> i32 {
        match self {
            Verdict::Drop => 0,
            Verdict::Accept => 1,
            Verdict::Jump(_) => -3,
            Verdict::Return => -5,
        }
    }
    fn chain(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) => Some(c),
            _ => None,
        }
    }
    /// NFTA_DATA_VERDICT { CODE, CHAIN } inside an nft_data attribute.
    fn put(&self, a: &mut Attrs) {
        a.nested(NFTA_DATA_VERDICT, |a| {
            a.u32(NFTA_VERDICT_CODE, self.code() as u32);
            if let Some(chain) = self.chain() {
                a.str(NFTA_VERDICT_CHAIN, chain);
            }
        });
    }
}

mod batch;
mod exprs;
mod list;
mod sets;
mod tables;

pub(crate) use batch::*;
pub(crate) use exprs::*;
pub(crate) use list::*;
pub(crate) use sets::*;
pub(crate) use tables::*;

#[cfg(test)]
pub(crate) mod tests;

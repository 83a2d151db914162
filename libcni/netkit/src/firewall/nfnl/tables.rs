//! Tables and chains: the hooks and types of base chains, and the messages that add, flush and
//! delete them.
use super::*;

/// A netfilter hook a base chain attaches to (the value is its number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hook {
    Prerouting = 0,
    Input = 1,
    Forward = 2,
    Output = 3,
    Postrouting = 4,
}

/// A base chain's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChainType {
    Filter,
    Nat,
}

impl ChainType {
    pub(super) fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        }
    }
}

/// What makes a chain a base chain: `{ type <kind> hook <hook> priority <priority>; policy <..>; }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BaseChain {
    pub hook: Hook,
    pub priority: i32,
    pub kind: ChainType,
    /// `policy accept` when true, `policy drop` when false.
    pub policy_accept: bool,
}

impl Batch {
    /// `add table <family> <name>` (no error if it exists).
    pub(crate) fn add_table(&mut self, family: TableFamily, name: &str) {
        self.push(NFT_MSG_NEWTABLE, NLM_F_CREATE, family, format!("add table {} {name}", family.name()), |a| {
            a.str(NFTA_TABLE_NAME, name);
            a.u32(NFTA_TABLE_FLAGS, 0);
        });
    }

    /// `delete table <family> <name>` (ENOENT if absent; an `add table` first makes it none).
    pub(crate) fn delete_table(&mut self, family: TableFamily, name: &str) {
        self.push(NFT_MSG_DELTABLE, 0, family, format!("delete table {} {name}", family.name()), |a| {
            a.str(NFTA_TABLE_NAME, name);
        });
    }

    /// `add chain <family> <table> <name> { [type .. hook .. priority ..; policy ..;] [comment ".."] }`
    /// (no error if it exists with the same hook). A comment longer than nft allows is cut.
    pub(crate) fn add_chain(
        &mut self,
        family: TableFamily,
        table: &str,
        name: &str,
        base: Option<BaseChain>,
        comment: Option<&str>,
    ) {
        let what = format!("add chain {} {table} {name}", family.name());
        self.push(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, what, |a| {
            a.str(NFTA_CHAIN_TABLE, table);
            a.str(NFTA_CHAIN_NAME, name);
            if let Some(b) = base {
                a.nested(NFTA_CHAIN_HOOK, |a| {
                    a.u32(NFTA_HOOK_HOOKNUM, b.hook as u32);
                    a.u32(NFTA_HOOK_PRIORITY, b.priority as u32);
                });
                a.u32(NFTA_CHAIN_POLICY, u32::from(b.policy_accept)); // NF_ACCEPT 1, NF_DROP 0
                a.str(NFTA_CHAIN_TYPE, b.kind.name());
            }
            if let Some(c) = comment {
                let mut cut = c.len().min(COMMENT_MAX);
                while !c.is_char_boundary(cut) {
                    cut -= 1;
                }
                a.bytes(NFTA_CHAIN_USERDATA, &comment_udata(&c[..cut]));
            }
        });
    }

    pub(super) fn chain_msg(&mut self, ty: u16, verb: &str, family: TableFamily, table: &str, chain: &str) {
        let what = format!("{verb} chain {} {table} {chain}", family.name());
        // DELRULE takes the chain as NFTA_RULE_CHAIN, DELCHAIN as NFTA_CHAIN_NAME.
        let chain_attr = if ty == NFT_MSG_DELRULE { NFTA_RULE_CHAIN } else { NFTA_CHAIN_NAME };
        self.push(ty, 0, family, what, |a| {
            a.str(NFTA_CHAIN_TABLE, table);
            a.str(chain_attr, chain);
        });
    }

    /// `flush chain <family> <table> <chain>`: delete all its rules (ENOENT if no such chain).
    pub(crate) fn flush_chain(&mut self, family: TableFamily, table: &str, chain: &str) {
        self.chain_msg(NFT_MSG_DELRULE, "flush", family, table, chain);
    }

    /// `delete chain <family> <table> <chain>` (ENOENT if absent, EBUSY if not empty or in use).
    pub(crate) fn delete_chain(&mut self, family: TableFamily, table: &str, chain: &str) {
        self.chain_msg(NFT_MSG_DELCHAIN, "delete", family, table, chain);
    }
}

#[cfg(test)]
mod tests;

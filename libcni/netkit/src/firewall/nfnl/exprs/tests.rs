//! Registers and keys as nft lays them out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::firewall::nfnl::tests::*;

#[test]
fn registers_and_keys() {
    assert_eq!(Reg::slot(0), Reg(1));
    assert_eq!(Reg::slot(1), Reg(9));
    assert_eq!(Reg::slot(4), Reg(2));
    assert_eq!(Reg::slot(5), Reg(13));
    let key = [KeyPart::Addr(ip("10.0.0.1")), KeyPart::Proto(TCP), KeyPart::Port(8080)];
    assert_eq!(key_bytes(&key), [10, 0, 0, 1, 6, 0, 0, 0, 0x1f, 0x90, 0, 0]);
    assert_eq!(key_bytes(&[KeyPart::Port(80)]), [0, 80]);
    assert_eq!(key_text(&key), "10.0.0.1 . tcp . 8080");
    // ip6 daddr . meta l4proto . th dport: registers 1, 2 and 13 (slots 0, 4, 5).
    let exprs = Rule::new(TableFamily::Ip6).vmap(&[Field::Ip6Daddr, Field::L4proto, Field::ThDport], "m").exprs;
    let regs: Vec<Reg> = exprs
        .iter()
        .filter_map(|e| match e {
            Expr::Payload { dreg, .. } | Expr::Meta { dreg, .. } => Some(*dreg),
            _ => None,
        })
        .collect();
    assert_eq!(regs, [Reg(1), Reg(2), Reg(13)]);
}

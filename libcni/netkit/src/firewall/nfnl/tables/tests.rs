//! Chains flushed and deleted as nft does it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::firewall::nfnl::tests::*;

#[test]
fn flush_and_delete_match_nft() {
    require_root_and_nft();
    in_netns(|| {
        // The state after removing things must be the same too: a flushed chain, a deleted chain,
        // deleted elements.
        let text = format!(
            "{FLAT}\nflush chain inet {{T}} hairpin\nadd chain inet {{T}} gone\ndelete chain inet {{T}} gone\n\
             delete element inet {{T}} dnat4 {{ tcp . 8080, udp . 53 }}\n"
        );
        same_as_nft(TableFamily::Inet, &text, |b, t| {
            build_flat(b, t);
            b.flush_chain(TableFamily::Inet, t, "hairpin");
            b.add_chain(TableFamily::Inet, t, "gone", None, None);
            b.delete_chain(TableFamily::Inet, t, "gone");
            let keys = [vec![KeyPart::Proto(TCP), KeyPart::Port(8080)], vec![KeyPart::Proto(UDP), KeyPart::Port(53)]];
            b.delete_elements(TableFamily::Inet, t, "dnat4", &keys);
        });
    });
}

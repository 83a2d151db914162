//! The codec against tables the kernel returned after iptables-legacy 1.8.9 wrote known rules
//! (filter-v4.txt, filter-v6.txt: see `legacy_fixture_dump` in the firewall's forward tests).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

/// The `SO_GET_INFO` fields as one fixture line.
pub(crate) fn info_line(i: &Info) -> String {
    let list = |a: &[u32]| a.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    format!("{} {} {} {} {}", i.valid_hooks, list(&i.hook_entry), list(&i.underflow), i.num_entries, i.size)
}

/// The table's info and blob as the kernel returns them.
pub(crate) fn raw(family: Family, name: &str) -> (Info, Vec<u8>) {
    let sock = Sock::open(family, name).unwrap();
    let mut head = [0u8; GETINFO_LEN];
    put_name(&mut head, 0, TABLE_NAME_LEN, name);
    sock.get(SO_GET_INFO, &mut head, "info").unwrap();
    let info = Info::parse(&head);
    let mut buf = vec![0u8; GET_ENTRIES_HEAD + info.size as usize];
    put_name(&mut buf, 0, TABLE_NAME_LEN, name);
    buf[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&info.size.to_ne_bytes());
    sock.get(SO_GET_ENTRIES, &mut buf, "entries").unwrap();
    (info, buf[GET_ENTRIES_HEAD..].to_vec())
}

/// A fixture: the info fields and the blob.
pub(crate) fn fixture(family: Family) -> (Info, Vec<u8>) {
    let text = match family {
        Family::V4 => include_str!("filter-v4.txt"),
        Family::V6 => include_str!("filter-v6.txt"),
    };
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let f: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let list = |s: &str| -> [u32; HOOKS] {
        let v: Vec<u32> = s.split(',').map(|x| x.parse().unwrap()).collect();
        v.try_into().unwrap()
    };
    let info = Info {
        valid_hooks: f[1].parse().unwrap(),
        hook_entry: list(f[2]),
        underflow: list(f[3]),
        num_entries: f[4].parse().unwrap(),
        size: f[5].parse().unwrap(),
    };
    let hex: String = lines.collect();
    let blob = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    (info, blob)
}

/// The fixture's table.
pub(crate) fn table(family: Family) -> Table {
    let (info, blob) = fixture(family);
    Table::parse(family, "filter", &info, &blob).unwrap()
}

/// `blob` with every entry's counters and comefrom zeroed (what the kernel fills in).
fn without_counters(family: Family, blob: &[u8]) -> Vec<u8> {
    let mut out = blob.to_vec();
    let mut at = 0;
    while at < out.len() {
        let next = usize::from(u16_at(&out, at + family.offsets_at() + 2));
        out[at + family.offsets_at() + 4..at + family.entry_len()].fill(0);
        at += next;
    }
    out
}

#[test]
fn fixtures_parse_into_chains_and_serialize_byte_for_byte() {
    for family in [Family::V4, Family::V6] {
        let (info, blob) = fixture(family);
        let t = table(family);
        let names: Vec<&str> = t.chains.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "INPUT",
                "FORWARD",
                "OUTPUT",
                "CNI-ADMIN",
                "CNI-FORWARD",
                "CNI-ISOLATION-STAGE-1",
                "CNI-ISOLATION-STAGE-2",
                "OTHER"
            ],
            "{family:?}"
        );
        let forward = t.chain("FORWARD").unwrap();
        assert_eq!((forward.hook, forward.policy), (Some(2), DROP));
        assert_eq!(t.chain("INPUT").unwrap().policy, ACCEPT);
        let first: Vec<&Target> = forward.rules.iter().map(|r| &r.target).collect();
        let stage1 = Target::Jump("CNI-ISOLATION-STAGE-1".into());
        let want = if family == Family::V4 { vec![&stage1, &stage1] } else { vec![&stage1] };
        assert_eq!(first[..first.len() - 1], want[..], "{family:?}");
        assert_eq!(first.last(), Some(&&Target::Jump("CNI-FORWARD".into())));
        let input = &t.chain("INPUT").unwrap().rules;
        assert_eq!(
            (&input[0].target, input[0].counters),
            (&Target::Jump("OTHER".into()), Counters { packets: 3, bytes: 300 })
        );
        let other = &t.chain("OTHER").unwrap().rules;
        assert!(matches!(&other[0].target, Target::Other(b) if name_at(b, 2, EXT_NAME_LEN) == "LOG"), "{:?}", other[0]);
        assert_eq!(other[0].counters, Counters { packets: 7, bytes: 700 });
        assert_eq!(other[1].target, Target::Fallthrough);
        assert_eq!(other[2].target, Target::Jump("CNI-ADMIN".into()));
        assert!(t.chain("CNI-ADMIN").unwrap().rules.is_empty());

        let (out, from) = t.serialize().unwrap();
        let head = Info::parse(&{
            // ipt_replace's fields in ipt_getinfo's order, to compare with the kernel's info.
            let mut g = vec![0u8; GETINFO_LEN];
            g[32..36].copy_from_slice(&out[32..36]);
            g[36..76].copy_from_slice(&out[44..84]);
            g[76..80].copy_from_slice(&out[36..40]);
            g[80..84].copy_from_slice(&out[40..44]);
            g
        });
        assert_eq!(head, info, "{family:?}");
        assert_eq!(u32_at(&out, 84) as usize, from.len(), "num_counters: the entries as read");
        assert!(out[REPLACE_HEAD..] == without_counters(family, &blob)[..], "{family:?}: the blob differs");
        assert_eq!(from, (0..info.num_entries as usize).map(Some).collect::<Vec<_>>());
    }
}

#[test]
fn a_changed_table_lays_out_jumps_hooks_and_counters_anew() {
    let mut t = table(Family::V4);
    let before = t.clone();
    // A new chain sorts among the user chains; a rule goes first in INPUT and jumps to it.
    t.add_chain("AAA");
    let jump = Rule { target: Target::Jump("AAA".into()), ..before.chain("INPUT").unwrap().rules[0].clone() };
    let jump = Rule::new(Family::V4, &jump.spec[..Family::V4.ip_len()], &[], jump.target);
    t.chain_mut("INPUT").unwrap().rules.insert(0, jump);
    t.chain_mut("CNI-FORWARD").unwrap().rules.remove(1);
    let (out, from) = t.serialize().unwrap();
    let names: Vec<&str> = t.chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(&names[3..5], ["AAA", "CNI-ADMIN"]);
    // The first entry is the new rule, then INPUT's old first rule (entry 0 as read).
    assert_eq!(&from[..2], [None, Some(0)]);
    assert_eq!(from.len(), before.read_entries + 2 - 1 + 1);
    let mut words = [0u32; 14];
    for (i, w) in words.iter_mut().enumerate() {
        *w = u32_at(&out, 32 + 4 * i);
    }
    let info = Info {
        valid_hooks: words[0],
        num_entries: words[1],
        size: words[2],
        hook_entry: words[3..8].try_into().unwrap(),
        underflow: words[8..13].try_into().unwrap(),
    };
    let again = Table::parse(Family::V4, "filter", &info, &out[REPLACE_HEAD..]).unwrap();
    for (a, b) in again.chains.iter().zip(&t.chains) {
        assert_eq!((&a.name, a.hook, a.policy, a.rules.len()), (&b.name, b.hook, b.policy, b.rules.len()));
        for (x, y) in a.rules.iter().zip(&b.rules) {
            assert!(x.same(y), "{}: {x:?} != {y:?}", a.name);
        }
    }
    // A jump to a chain the table lacks is refused, naming both.
    t.chain_mut("OTHER").unwrap().rules[2].target = Target::Jump("GONE".into());
    let err = t.serialize().unwrap_err();
    assert!(err.msg.contains("OTHER") && err.msg.contains("GONE"), "{}", err.msg);
}

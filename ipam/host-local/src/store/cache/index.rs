//! The scan cache: a hidden file in the network directory that records, for every reservation file, its name,
//! inode number and owner, so a scan reads only the files that are new since (or replaced since) it was written.
//!
//! It is only a cache. Whatever is wrong with it (missing, torn, another version, written before the directory
//! last changed) makes the scan read every file, as it would without it.
//! - The name starts with '.', so it is never taken for a reservation (the reference parses names as IPs).
//! - The reference's DEL removes any file whose trimmed content equals `<cid>\r\n<ifname>` or `<cid>`: owners
//!   are escaped so the index never holds a '\r', and its header holds spaces, so it never matches either.
//! - It records the directory's inode and change times when it was written: a directory changed since by
//!   anyone who did not rewrite the index (the reference plugin, a human) invalidates it as a whole, because
//!   a removed and re-created reservation file may get the same inode number back.
//! - A trailer with the entry count and a checksum catches a torn write.

use super::Owner;
use std::fmt::Write as _;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

pub(in crate::store) const INDEX_FILE: &str = ".cni-rs-index";
const HEADER: &str = "cni-rs host-local scan cache v1";
const TRAILER: &str = "end ";

/// The directory as it was when the index was written: any entry created, removed or renamed changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) struct DirStamp {
    ino: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

impl DirStamp {
    pub(in crate::store) fn of(meta: &Metadata) -> DirStamp {
        DirStamp { ino: meta.ino(), ctime: (meta.ctime(), meta.ctime_nsec()), mtime: (meta.mtime(), meta.mtime_nsec()) }
    }
}

/// Where one recorded file's line (`<ino> <name> <owner>`, without its newline) lies in the index text.
/// Owners stay there, encoded, until someone asks for one: most scans only compare them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Line {
    start: u32,
    name: u32,
    owner: u32,
    end: u32,
}

impl Line {
    fn span(from: u32, to: u32) -> std::ops::Range<usize> {
        from as usize..to as usize
    }
}

/// A file as `render` writes it: a line of the index read earlier, unchanged, or one made from scratch.
pub(super) enum Entry<'a> {
    Recorded(&'a str),
    Fresh { name: &'a str, ino: u64, owner: &'a Owner },
}

/// The index's text for a directory in state `stamp` holding `files` (about `count` of them).
pub(super) fn render<'a>(stamp: &DirStamp, count: usize, files: impl Iterator<Item = Entry<'a>>) -> String {
    let mut out = String::with_capacity(128 + 96 * count);
    let (ino, (cs, cn), (ms, mn)) = (stamp.ino, stamp.ctime, stamp.mtime);
    // Writing to a String cannot fail.
    let _ = writeln!(out, "{HEADER} {ino} {cs}.{cn} {ms}.{mn}");
    let mut count = 0usize;
    for file in files {
        match file {
            Entry::Recorded(line) => out.push_str(line),
            Entry::Fresh { name, ino, owner } => {
                let _ = write!(out, "{ino} ");
                escape_into(&mut out, name);
                out.push(' ');
                out.push_str(&encode_owner(owner));
            }
        }
        out.push('\n');
        count += 1;
    }
    let sum = checksum(out.as_bytes());
    let _ = writeln!(out, "{TRAILER}{count} {sum:016x}");
    out
}

/// An owner as the index spells it: `a <cid> <ifname>` or `l <cid>`, each field escaped. Escaping is
/// one-to-one, so two owners are equal exactly when their encodings are.
pub(super) fn encode_owner(owner: &Owner) -> String {
    let mut out = String::with_capacity(80);
    match owner {
        Owner::Attachment { container_id, ifname } => {
            out.push_str("a ");
            escape_into(&mut out, container_id);
            out.push(' ');
            escape_into(&mut out, ifname);
        }
        Owner::Legacy { container_id } => {
            out.push_str("l ");
            escape_into(&mut out, container_id);
        }
    }
    out
}

/// The encoded owner of a line of `text`.
pub(super) fn owner_field<'t>(text: &'t str, line: &Line) -> Option<&'t str> {
    text.get(Line::span(line.owner, line.end))
}

/// The file name of a line of `text`.
pub(super) fn name<'t>(text: &'t str, line: &Line) -> Option<&'t str> {
    text.get(Line::span(line.name, line.owner.checked_sub(1)?))
}

/// The whole line (for copying it into a new index unchanged).
pub(super) fn line<'t>(text: &'t str, line: &Line) -> Option<&'t str> {
    text.get(Line::span(line.start, line.end))
}

pub(super) fn decode_owner(text: &str, line: &Line) -> Option<Owner> {
    let field = owner_field(text, line)?;
    if let Some(rest) = field.strip_prefix("a ") {
        let (cid, ifname) = rest.split_once(' ')?;
        return Some(Owner::Attachment { container_id: unescape(cid)?, ifname: unescape(ifname)? });
    }
    Some(Owner::Legacy { container_id: unescape(field.strip_prefix("l ")?)? })
}

/// Hands every recorded file (name, inode number, line) to `each`, if `text` is a whole, well-formed index of
/// this version written when the directory was in state `now`. `None` if it is not, or if `each` refused one.
pub(super) fn parse<'t>(
    text: &'t str,
    now: &DirStamp,
    mut each: impl FnMut(&'t str, u64, Line) -> Option<()>,
) -> Option<()> {
    let without_last_newline = text.strip_suffix('\n')?;
    let body_len = without_last_newline.rfind('\n')? + 1;
    let (body, trailer) = (text.get(..body_len)?, without_last_newline.get(body_len..)?);
    let (count, sum) = trailer.strip_prefix(TRAILER)?.split_once(' ')?;
    let count: usize = count.parse().ok()?;
    if u64::from_str_radix(sum, 16).ok()? != checksum(body.as_bytes()) {
        return None;
    }
    let header_len = body.find('\n')?;
    let header = body.get(..header_len)?.strip_prefix(HEADER)?.strip_prefix(' ')?;
    if parse_stamp(header)? != *now {
        return None;
    }
    let mut seen = 0usize;
    let mut start = header_len + 1;
    // The checksum vouches for the content, so a line is only cut up here; its owner is decoded (and
    // checked) when someone asks for it.
    while let Some((name_at, owner_at, end)) = body.get(start..).and_then(split_line) {
        let (name_at, owner_at, end) = (start + name_at, start + owner_at, start + end);
        let ino = body.get(start..name_at - 1)?.parse().ok()?;
        let name = body.get(name_at..owner_at - 1)?;
        let offset = |at: usize| u32::try_from(at).ok();
        let line = Line { start: offset(start)?, name: offset(name_at)?, owner: offset(owner_at)?, end: offset(end)? };
        each(name, ino, line)?;
        seen += 1;
        start = end + 1;
    }
    (start == body_len && seen == count).then_some(())
}

/// Where the name and the owner of a line `<ino> <name> <owner>` start, and where it ends.
fn split_line(rest: &str) -> Option<(usize, usize, usize)> {
    let end = rest.find('\n')?;
    let name_at = rest.get(..end)?.find(' ')? + 1;
    let owner_at = name_at + rest.get(name_at..end)?.find(' ')? + 1;
    Some((name_at, owner_at, end))
}

fn parse_stamp(s: &str) -> Option<DirStamp> {
    let time = |t: &str| -> Option<(i64, i64)> {
        let (secs, nanos) = t.split_once('.')?;
        Some((secs.parse().ok()?, nanos.parse().ok()?))
    };
    let mut fields = s.split(' ');
    let stamp =
        DirStamp { ino: fields.next()?.parse().ok()?, ctime: time(fields.next()?)?, mtime: time(fields.next()?)? };
    fields.next().is_none().then_some(stamp)
}

/// Needs no escaping: printable ASCII other than '%'.
fn is_plain(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic() && b != b'%')
}

/// Printable ASCII other than '%' stays; every other byte (space, '\r', '\n', non-ASCII) becomes %XX.
fn escape_into(out: &mut String, s: &str) {
    if is_plain(s) {
        out.push_str(s);
        return;
    }
    for b in s.bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

fn unescape(s: &str) -> Option<String> {
    if is_plain(s) {
        return Some(s.to_string());
    }
    let mut bytes = Vec::with_capacity(s.len());
    let mut rest = s.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = tail.get(2..)?;
        } else if b.is_ascii_graphic() {
            bytes.push(b);
            rest = tail;
        } else {
            return None;
        }
    }
    String::from_utf8(bytes).ok()
}

/// A cheap 64-bit checksum, eight bytes at a time in two lanes (a sum, and an order-sensitive rotate-xor): it
/// only has to notice a torn or damaged file, not resist anyone.
fn checksum(bytes: &[u8]) -> u64 {
    let (mut sum, mut mix) = (bytes.len() as u64, 0x9e37_79b9_7f4a_7c15u64);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let w = <[u8; 8]>::try_from(word).map_or(0, u64::from_le_bytes);
        sum = sum.wrapping_add(w);
        mix = (mix ^ w).rotate_left(23);
    }
    for &b in words.remainder() {
        sum = sum.wrapping_add(u64::from(b));
        mix = (mix ^ u64::from(b)).rotate_left(23);
    }
    (sum ^ mix.rotate_left(32)).wrapping_mul(0x0000_0100_0000_01b3) ^ mix
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn collect<'t>(text: &'t str, now: &DirStamp) -> Option<Vec<(&'t str, u64, Line)>> {
        let mut files = Vec::new();
        parse(text, now, |name, ino, line| {
            files.push((name, ino, line));
            Some(())
        })?;
        Some(files)
    }

    fn stamp() -> DirStamp {
        DirStamp { ino: 42, ctime: (1_700_000_000, 123), mtime: (1_700_000_000, 456) }
    }

    fn owners() -> Vec<(String, u64, Owner)> {
        vec![
            ("10.0.0.2".into(), 7, Owner::parse("cid1\r\neth0")),
            ("fd00::2".into(), 8, Owner::parse("cid 2 with spaces%\r\nif\r\nodd")),
            ("10.0.0.4".into(), 9, Owner::parse("legacy")),
            ("10.0.0.5".into(), 10, Owner::parse("")),
            ("10.0.0.6".into(), 11, Owner::parse("n\u{e9}-ascii\r\neth1")),
        ]
    }

    fn rendered() -> String {
        let owners = owners();
        render(&stamp(), 5, owners.iter().map(|(name, ino, owner)| Entry::Fresh { name, ino: *ino, owner }))
    }

    #[test]
    fn round_trip_keeps_every_owner_and_lines_copy_unchanged() {
        let text = rendered();
        let files = collect(&text, &stamp()).unwrap();
        assert_eq!(files.len(), 5);
        for ((name, ino, owner), (got_name, got_ino, line)) in owners().iter().zip(&files) {
            assert_eq!((name.as_str(), *ino), (*got_name, *got_ino));
            assert_eq!(super::name(&text, line), Some(name.as_str()));
            assert_eq!(decode_owner(&text, line).as_ref(), Some(owner), "{name}");
            assert_eq!(owner_field(&text, line), Some(encode_owner(owner).as_str()));
        }
        let copied = render(&stamp(), 5, files.iter().map(|(_, _, l)| Entry::Recorded(super::line(&text, l).unwrap())));
        assert_eq!(copied, text);
        assert_eq!(collect(&render(&stamp(), 0, std::iter::empty()), &stamp()).unwrap().len(), 0);
    }

    #[test]
    fn a_malformed_owner_is_unknown_not_a_failure() {
        let lines = ["5 10.0.0.9 x%zz", "6 10.0.0.8 a only-one-field", "7 10.0.0.7 l %C3"];
        let text = render(&stamp(), 3, lines.iter().map(|l| Entry::Recorded(l)));
        let files = collect(&text, &stamp()).unwrap();
        assert_eq!(files.len(), 3);
        for (name, _, line) in &files {
            assert_eq!(decode_owner(&text, line), None, "{name}");
        }
    }

    #[test]
    fn encodings_are_equal_exactly_when_owners_are() {
        let owners: Vec<Owner> = owners().into_iter().map(|(_, _, o)| o).collect();
        for a in &owners {
            for b in &owners {
                assert_eq!(a == b, encode_owner(a) == encode_owner(b), "{a:?} {b:?}");
            }
        }
        let a = Owner::Attachment { container_id: "x y".into(), ifname: "z".into() };
        let b = Owner::Attachment { container_id: "x".into(), ifname: "y z".into() };
        assert_ne!(encode_owner(&a), encode_owner(&b));
    }

    #[test]
    fn never_looks_like_an_attachment_key_to_the_reference() {
        let text = rendered();
        assert!(!text.contains('\r'), "{text:?}");
        assert!(text.trim().contains(' '));
        let empty = render(&stamp(), 0, std::iter::empty());
        assert!(!empty.contains('\r') && empty.trim().contains(' '), "{empty:?}");
        assert!(INDEX_FILE.starts_with('.') && INDEX_FILE.parse::<std::net::IpAddr>().is_err());
    }

    #[test]
    fn torn_damaged_foreign_or_outdated_text_is_refused() {
        let text = rendered();
        // Every proper prefix, as a torn write or a reader racing an in-place write leaves it.
        for cut in 0..text.len() {
            assert!(collect(&text[..cut], &stamp()).is_none(), "prefix of {cut} bytes accepted");
        }
        // A shorter index written over a longer one, cut short before the file was truncated.
        let shorter = render(&stamp(), 1, std::iter::once(Entry::Recorded("7 10.0.0.2 a x eth0")));
        let mixed = format!("{shorter}{}", &text[shorter.len()..]);
        assert!(collect(&mixed, &stamp()).is_none());
        let damaged = text.replacen("cid1", "cid9", 1);
        assert!(collect(&damaged, &stamp()).is_none());
        assert!(collect(&text.replacen("v1", "v2", 1), &stamp()).is_none());
        assert!(collect("garbage\n", &stamp()).is_none());
        assert!(collect("", &stamp()).is_none());
        // The directory changed after the index was written.
        let later = DirStamp { ctime: (1_700_000_000, 124), ..stamp() };
        assert!(collect(&text, &later).is_none());
        let moved = DirStamp { ino: 43, ..stamp() };
        assert!(collect(&text, &moved).is_none());
    }
}

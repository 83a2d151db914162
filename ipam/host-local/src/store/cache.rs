//! The scan cache: what one listing of the network directory knows about each reservation file, and the
//! hidden index file ([`index`]) that carries it from one plugin call to the next.
//!
//! Every verb needs the owner of every reservation (a repeated ADD returns what the attachment holds, DEL
//! releases it). Reading a thousand files per call would dominate ADD on a busy node, so the index
//! remembers the owner of each file by name and inode, and a listing reads only the files it does not
//! know. An owner taken from the index is confirmed by reading its file before anything is returned or
//! released on its word: a file removed and re-created behind our back may have got the same inode back.

mod index;

pub(super) use index::{DirStamp, INDEX_FILE};

use super::reference::{reserved_address, Owner};
use super::Store;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// One reservation file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reservation {
    /// Its inode number; 0 when unknown (never a valid inode, so never matches the index).
    ino: u64,
    record: Record,
    /// Found by the directory listing (a recorded file that is not was removed behind the index's back).
    listed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Record {
    /// Known from the index (the file was not read): a line of `Reservations::index_text`.
    Indexed(index::Line),
    /// Read from the file during this process (boxed: a thousand of these are moved around per scan).
    Read(Box<ReadFile>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ReadFile {
    name: String,
    owner: Owner,
}

impl Reservation {
    fn read(ino: u64, name: String, owner: Owner) -> Reservation {
        Reservation { ino, record: Record::Read(Box::new(ReadFile { name, owner })), listed: true }
    }

    /// Whether its owner came from the index, unconfirmed.
    pub(super) fn is_from_index(&self) -> bool {
        matches!(self.record, Record::Indexed(_))
    }
}

/// Every reservation of a network at one moment, by address (the order the index is written in).
#[derive(Debug, Clone, Default)]
pub struct Reservations {
    /// The index as loaded. Owners taken from it stay there, encoded: comparing an encoded owner is all most
    /// verbs need, and an unchanged line is copied as it is into the next index.
    index_text: String,
    pub(super) files: BTreeMap<IpAddr, Reservation>,
}

impl Reservations {
    pub fn is_taken(&self, ip: IpAddr) -> bool {
        self.files.contains_key(&ip)
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The owner as recorded: it may come from the index, so confirm it before acting on it.
    pub fn owner(&self, ip: IpAddr) -> Option<Owner> {
        self.files.get(&ip).and_then(|r| self.owner_of(r))
    }

    /// Every address and its owner as recorded (see [`Reservations::owner`]), by address.
    pub fn owners(&self) -> Vec<(IpAddr, Owner)> {
        self.files.iter().filter_map(|(ip, r)| Some((*ip, self.owner_of(r)?))).collect()
    }

    fn owner_of(&self, r: &Reservation) -> Option<Owner> {
        match &r.record {
            // None only for a line we did not write (the checksum makes that unlikely): an unknown owner, on
            // whose word nothing is released and which a confirmation replaces.
            Record::Indexed(line) => index::decode_owner(&self.index_text, line),
            Record::Read(file) => Some(file.owner.clone()),
        }
    }

    fn name_of<'r>(&'r self, r: &'r Reservation) -> Option<&'r str> {
        match &r.record {
            Record::Indexed(line) => index::name(&self.index_text, line),
            Record::Read(file) => Some(&file.name),
        }
    }

    /// The file name recorded for `ip`, if it is reserved.
    pub(super) fn file_name(&self, ip: IpAddr) -> Option<&str> {
        self.files.get(&ip).and_then(|r| self.name_of(r))
    }

    /// Record a reservation file this process wrote.
    pub(super) fn insert_written(&mut self, ip: IpAddr, ino: u64, name: String, owner: Owner) {
        self.files.insert(ip, Reservation::read(ino, name, owner));
    }

    /// Forget a reservation; whether there was one.
    pub(super) fn forget(&mut self, ip: IpAddr) -> bool {
        self.files.remove(&ip).is_some()
    }

    /// The addresses an attachment holds, confirmed: its own files, or, when it has none, old-format files of
    /// its container (the reference's rule for DEL).
    pub fn held_by(&mut self, store: &Store, cid: &str, ifname: &str) -> Vec<IpAddr> {
        self.confirmed_held_by(store, cid, ifname).0
    }

    fn held_by_as_recorded(&self, cid: &str, ifname: &str) -> Vec<IpAddr> {
        let exact = Owner::Attachment { container_id: cid.to_string(), ifname: ifname.to_string() };
        let legacy = Owner::Legacy { container_id: cid.to_string() };
        let owned_by = |wanted: &Owner| -> Vec<IpAddr> {
            let encoded = index::encode_owner(wanted);
            let is_wanted = |r: &Reservation| match &r.record {
                Record::Indexed(line) => index::owner_field(&self.index_text, line) == Some(encoded.as_str()),
                Record::Read(file) => file.owner == *wanted,
            };
            self.files.iter().filter(|(_, r)| is_wanted(r)).map(|(ip, _)| *ip).collect()
        };
        let held = owned_by(&exact);
        if !held.is_empty() {
            return held;
        }
        owned_by(&legacy)
    }

    /// [`Reservations::held_by`], and whether confirming changed the view.
    pub(super) fn confirmed_held_by(&mut self, store: &Store, cid: &str, ifname: &str) -> (Vec<IpAddr>, bool) {
        let mut changed_any = false;
        loop {
            let held = self.held_by_as_recorded(cid, ifname);
            let mut changed = false;
            for ip in &held {
                changed |= self.confirm(store, *ip);
            }
            // A claim that did not hold can hide others (old-format files count only when no exact one does).
            if !changed {
                return (held, changed_any);
            }
            changed_any = true;
        }
    }

    /// Re-read the file behind `ip` if its owner came from the index (a file removed and re-created behind
    /// our back may have got the same inode number). Returns whether the view changed.
    pub(super) fn confirm(&mut self, store: &Store, ip: IpAddr) -> bool {
        let Some(r) = self.files.get(&ip) else { return false };
        if !r.is_from_index() {
            return false;
        }
        let recorded = (r.ino, self.owner_of(r));
        let name = self.name_of(r).map(str::to_string);
        let read = name.map(|name| {
            let content = store.read_reservation(&name);
            (name, content)
        });
        match read {
            Some((name, Ok((ino, owner)))) => {
                let changed = recorded != (ino, Some(owner.clone()));
                self.files.insert(ip, Reservation::read(ino, name, owner));
                changed
            }
            // Vanished or unreadable: a scan skips such files, so does the view.
            _ => {
                self.files.remove(&ip);
                true
            }
        }
    }

    /// The index's text for these reservations in a directory in state `stamp`.
    pub(super) fn render_index(&self, stamp: &DirStamp) -> String {
        let text = &self.index_text;
        let entries = self.files.values().filter_map(|r| match &r.record {
            Record::Indexed(line) => index::line(text, line).map(index::Entry::Recorded),
            Record::Read(file) => Some(index::Entry::Fresh { name: &file.name, ino: r.ino, owner: &file.owner }),
        });
        index::render(stamp, self.files.len(), entries)
    }
}

/// One listing of the network directory, merged with the index: each reservation whose name and inode the
/// index knows keeps the recorded owner; only new or replaced files are read.
pub(super) struct Listing {
    index_text: String,
    files: BTreeMap<IpAddr, Reservation>,
    fresh: Vec<(IpAddr, Reservation)>,
    /// The index is missing, unusable or out of date: rewrite it when the lock is held.
    stale: bool,
}

impl Listing {
    /// Starts from the index's text, if it is whole and was written when the directory was in state `now`;
    /// otherwise from nothing (every file will be read).
    pub(super) fn new(index_text: String, now: Option<DirStamp>) -> Listing {
        match now.and_then(|now| recorded_files(&index_text, &now)) {
            Some(files) => Listing { index_text, files, fresh: Vec::new(), stale: false },
            None => Listing { index_text: String::new(), files: BTreeMap::new(), fresh: Vec::new(), stale: true },
        }
    }

    /// A reservation file the listing found: true if the index knows it by this name and inode, so it need
    /// not be read. Otherwise the index is stale and the caller reads the file ([`Listing::read`]).
    pub(super) fn known(&mut self, ip: IpAddr, name: &str, ino: u64) -> bool {
        if let Some(r) = self.files.get_mut(&ip) {
            if let Record::Indexed(line) = &r.record {
                if !r.listed && r.ino == ino && index::name(&self.index_text, line) == Some(name) {
                    r.listed = true;
                    return true;
                }
            }
        }
        self.stale = true;
        false
    }

    /// A reservation file the index did not know, as read.
    pub(super) fn read(&mut self, ip: IpAddr, name: &str, ino: u64, owner: Owner) {
        self.fresh.push((ip, Reservation::read(ino, name.to_string(), owner)));
    }

    /// Every reservation found, and whether the index is stale.
    pub(super) fn finish(self) -> (Reservations, bool) {
        let Listing { index_text, mut files, fresh, mut stale } = self;
        let recorded = files.len();
        // Recorded files that are gone, or that were replaced and read again.
        files.retain(|_, r| r.listed);
        stale |= files.len() != recorded;
        // A file read again replaces what the index said.
        files.extend(fresh);
        (Reservations { index_text, files }, stale)
    }
}

/// The files the index records, if it is whole and current; none of them listed yet.
fn recorded_files(text: &str, now: &DirStamp) -> Option<BTreeMap<IpAddr, Reservation>> {
    // No line is shorter than 16 bytes.
    let mut files: Vec<(IpAddr, Reservation)> = Vec::with_capacity(text.len() / 16);
    index::parse(text, now, |name, ino, line| {
        let ip = reserved_address(name)?;
        // Written in address order: anything else is not an index we wrote.
        if files.last().is_some_and(|(last, _)| *last >= ip) {
            return None;
        }
        files.push((ip, Reservation { ino, record: Record::Indexed(line), listed: false }));
        Some(())
    })?;
    // Already in order: the map is built in one pass instead of an insertion per file.
    Some(files.into_iter().collect())
}

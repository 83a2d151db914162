//! DEL's concurrency. A link deletion waits out RCU grace periods in the kernel after it released
//! the rtnl lock (~16-28 ms for a veth here, more for an ifb), so what needs neither that link nor
//! its wait (releasing addresses from IPAM's own state, removing rules, deleting another link) runs
//! on a thread of its own alongside it instead of after it.
//!
//! Work that itself ends in a grace period (an nf_tables commit that deletes something) can make
//! the deletion's wait longer when the two start together: the side then waits until the deletion
//! has been under way for a head start ([`Deletion::under_way_for`]) before it begins that part.

use libcni::{code, Error, Result};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The side's view of the main closure's link deletion.
pub struct Deletion(mpsc::Receiver<Instant>);

impl Deletion {
    /// Waits until the deletion has been under way for `head_start`; returns at once when the
    /// main closure ended without one (nothing to delete, or it failed first).
    pub fn under_way_for(&self, head_start: Duration) {
        if let Ok(at) = self.0.recv() {
            std::thread::sleep((at + head_start).saturating_duration_since(Instant::now()));
        }
    }
}

/// The main closure's word that its link deletion is going out ([`Deletion::under_way_for`]
/// waits on it). Dropped unsent, it tells the side there is no deletion to wait for.
pub struct Starting(mpsc::Sender<Instant>);

impl Starting {
    pub fn now(self) {
        let _ = self.0.send(Instant::now());
    }
}

/// Runs `side` on a thread of its own while `main` runs on this one; both results. `main` says
/// through [`Starting`] when its link deletion goes out, for a side that waits on [`Deletion`]. A
/// panic on the thread is an error naming `what` (code 110).
pub fn alongside<A: Send, B>(
    what: &str,
    side: impl FnOnce(&Deletion) -> A + Send,
    main: impl FnOnce(Starting) -> B,
) -> (Result<A>, B) {
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let thread = s.spawn(move || side(&Deletion(rx)));
        let b = main(Starting(tx));
        let a = thread.join().map_err(|_| Error::new(code::INTERNAL, format!("{what} panicked")));
        (a, b)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn alongside_overlaps_and_reports_a_panic() {
        // The side waits for the main closure to have started: run one after the other, it would
        // time out (the overlap is the point of DEL's link deletion alongside the release).
        let (tx, rx) = mpsc::channel();
        let (side, main) = alongside(
            "the side",
            move |_| rx.recv_timeout(Duration::from_secs(5)).is_ok(),
            move |_| tx.send(()).is_ok(),
        );
        assert!(side.unwrap() && main, "the side never saw the main closure run alongside it");
        let (side, main): (Result<()>, u8) = alongside("releasing the addresses", |_| panic!("boom"), |_| 7);
        let e = side.unwrap_err();
        assert_eq!((e.code, main), (code::INTERNAL, 7));
        assert!(e.msg.contains("releasing the addresses panicked"), "{}", e.msg);
    }

    #[test]
    fn the_side_waits_for_the_head_start_or_for_no_deletion() {
        let head_start = Duration::from_millis(30);
        let (waited, started) = alongside(
            "the side",
            |deletion| {
                deletion.under_way_for(head_start);
                Instant::now()
            },
            |starting| {
                let at = Instant::now();
                starting.now();
                at
            },
        );
        assert!(waited.unwrap() >= started + head_start, "the side began before the head start ran out");
        // No deletion: the side does not wait at all, let alone forever.
        let begun = Instant::now();
        let (waited, ()) = alongside("the side", |d| d.under_way_for(Duration::from_secs(60)), drop);
        waited.unwrap();
        assert!(begun.elapsed() < Duration::from_secs(30), "the side waited for a deletion that never came");
    }
}

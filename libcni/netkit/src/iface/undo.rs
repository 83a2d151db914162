//! A failed ADD's reversal: each step registers its undoing as it starts, and a failure runs them.

use libcni::Result;

/// What a failed ADD must undo: each step registers its reversal as it starts, and [`Undo::run`]
/// runs them newest first, best effort. A successful ADD drops it unrun.
#[derive(Default)]
pub struct Undo<'a> {
    steps: Vec<Box<dyn FnOnce() + 'a>>,
}

impl<'a> Undo<'a> {
    pub fn push(&mut self, step: impl FnOnce() + 'a) {
        self.steps.push(Box::new(step));
    }

    /// Runs the reversals, the last registered first.
    pub fn run(self) {
        self.steps.into_iter().rev().for_each(|step| step());
    }

    /// Runs an ADD's steps with a fresh `Undo`, and the reversals they registered when they fail.
    pub fn guarded<T>(steps: impl FnOnce(&mut Undo<'a>) -> Result<T>) -> Result<T> {
        let mut undo = Undo::default();
        let done = steps(&mut undo);
        if done.is_err() {
            undo.run();
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn undo_runs_newest_first() {
        let log = RefCell::new(Vec::new());
        let mut undo = Undo::default();
        for step in ["veth", "ipam", "masquerade"] {
            let log = &log;
            undo.push(move || log.borrow_mut().push(step));
        }
        undo.run();
        assert_eq!(*log.borrow(), ["masquerade", "ipam", "veth"]);
    }
}

//! The open group of the calling thread: between `ncclGroupStart` and the outermost
//! `ncclGroupEnd`, checked calls wait here; at the end they are queued, one unit per
//! communicator ([`super::calls`]).

use super::work::Call;
use crate::stream::Key;
use std::cell::RefCell;

/// A checked call waiting for the end of its group.
pub struct Grouped {
    /// The communicator's address (a `*mut Comm`, checked live again at the end).
    pub comm: usize,
    pub call: Call,
    /// The stream the call was given.
    pub stream: Key,
}

thread_local! {
    /// ncclGroupStart depth, and the calls waiting for the outermost ncclGroupEnd.
    static GROUP: RefCell<(usize, Vec<Grouped>)> = const { RefCell::new((0, Vec::new())) };
}

/// Whether a group is open on this thread.
pub fn open() -> bool {
    GROUP.with(|g| g.borrow().0 > 0)
}

/// The first answer `f` gives for the calls waiting in this thread's open group, in
/// issue order (`None` if no group is open).
pub fn find<R>(mut f: impl FnMut(&Grouped) -> Option<R>) -> Option<R> {
    GROUP.with(|g| g.borrow().1.iter().find_map(&mut f))
}

/// `ncclGroupStart`: one level deeper.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().0 += 1);
}

/// Keeps `call` for the end of the open group; gives it back if none is open.
pub fn add(call: Grouped) -> Result<(), Grouped> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return Err(call);
        }
        g.1.push(call);
        Ok(())
    })
}

/// `ncclGroupEnd`: one level up. The calls to queue now (all of them at the outermost
/// end, none at an inner one), or `None` if no group was open.
pub fn end() -> Option<Vec<Grouped>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.0 {
            0 => None,
            1 => {
                g.0 = 0;
                Some(std::mem::take(&mut g.1))
            }
            _ => {
                g.0 -= 1;
                Some(Vec::new())
            }
        }
    })
}

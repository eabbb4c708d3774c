//! The open group of the calling thread: between `ncclGroupStart` and the outermost
//! `ncclGroupEnd`, checked calls wait here; at the end they are queued, one unit per
//! communicator ([`super::calls`]).
//!
//! As in NCCL (`group.cc`, `ncclGroupErrCheck`), a call that fails inside a group makes
//! the group fail: its outermost `ncclGroupEnd` drops every call of the group and returns
//! that error. And from NCCL 2.22, `ncclCommAbort` runs through the same machinery
//! (`ncclAsyncLaunch`): called inside an open group, it only raises the communicator's
//! abort flag and queues the freeing into the group, to run at its end; a group that
//! failed drops it (`groupCleanup`), and the communicator is never freed.

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

/// One thread's open group.
#[derive(Default)]
struct Open {
    /// ncclGroupStart depth.
    depth: usize,
    /// The calls waiting for the outermost ncclGroupEnd.
    calls: Vec<Grouped>,
    /// The first error of a call inside the group.
    error: Option<super::NcclResult>,
    /// Communicators whose ncclCommAbort was queued into the group (NCCL 2.22 on).
    aborts: Vec<usize>,
}

/// What the outermost `ncclGroupEnd` has to do.
pub struct Ended {
    pub calls: Vec<Grouped>,
    /// A call of the group failed: nothing of it runs, and this is what the end returns.
    pub error: Option<super::NcclResult>,
    /// Aborts queued into the group, to run at its end (lost if it failed).
    pub aborts: Vec<usize>,
}

thread_local! {
    static GROUP: RefCell<Open> = RefCell::new(Open::default());
}

/// Whether a group is open on this thread.
pub fn open() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// The first answer `f` gives for the calls waiting in this thread's open group, in
/// issue order (`None` if no group is open).
pub fn find<R>(mut f: impl FnMut(&Grouped) -> Option<R>) -> Option<R> {
    GROUP.with(|g| g.borrow().calls.iter().find_map(&mut f))
}

/// `ncclGroupStart`: one level deeper.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Keeps `call` for the end of the open group; gives it back if none is open.
pub fn add(call: Grouped) -> Result<(), Grouped> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(call);
        }
        g.calls.push(call);
        Ok(())
    })
}

/// A call failed with `code`: inside an open group, the group fails (the first error counts).
pub fn failed(code: super::NcclResult) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && code != super::SUCCESS && code != super::IN_PROGRESS {
            g.error.get_or_insert(code);
        }
    })
}

/// Queues the freeing of `comm` (its ncclCommAbort) into the open group, as NCCL 2.22 and
/// later do; `false` if no group is open or the played NCCL is older (it frees at once).
pub fn defer_abort(comm: usize) -> bool {
    if crate::version::version() < 22200 {
        return false;
    }
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return false;
        }
        g.aborts.push(comm);
        true
    })
}

/// `ncclGroupEnd`: one level up. What to do now (everything at the outermost end,
/// nothing at an inner one), or `None` if no group was open.
pub fn end() -> Option<Ended> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => None,
            1 => {
                let open = std::mem::take(&mut *g);
                Some(Ended {
                    calls: open.calls,
                    error: open.error,
                    aborts: open.aborts,
                })
            }
            _ => {
                g.depth -= 1;
                Some(Ended {
                    calls: Vec::new(),
                    error: None,
                    aborts: Vec::new(),
                })
            }
        }
    })
}

//! Split communicators (`ncclCommSplit`): the world's ranks in groups, each group a
//! communicator of its own, as Megatron and PyTorch make their tensor-, pipeline- and
//! data-parallel groups. [`Session::split`] makes one; [`Session::on`] runs a lesson's
//! calls on it: collectives, tables, checks and timings, with ranks numbered in it.

use super::Session;
use crate::Communicator;
use anyhow::{Context, Result, anyhow};
use std::collections::BTreeMap;
use workbook_runtime::error::usage;

/// NCCL's `NCCL_SPLIT_NOCOLOR`: the color of a rank that joins no communicator of a split.
pub const SPLIT_NOCOLOR: i32 = -1;

/// This rank's part of a split ([`Session::split`]): its communicator (none for
/// [`SPLIT_NOCOLOR`]) and who is in which, alike on every rank.
pub struct Split {
    comm: Option<Communicator>,
    /// This rank's color and key, as given.
    color: i32,
    /// Every world rank's color, in world order.
    colors: Vec<i32>,
    /// Each color's members (world ranks), in their order in its communicator.
    groups: BTreeMap<i32, Vec<usize>>,
    /// Which split of the session this is (from 1): names its keys in the store.
    id: u64,
    /// Numbers the meetings (tables, checks, timings) held on it.
    seq: u64,
}

impl Split {
    /// This rank's color (or [`SPLIT_NOCOLOR`]).
    pub fn color(&self) -> i32 {
        self.color
    }

    /// This rank's rank in its communicator: `None` for [`SPLIT_NOCOLOR`].
    pub fn rank(&self) -> Option<usize> {
        self.comm.as_ref().map(Communicator::rank)
    }

    /// The number of ranks in this rank's communicator (0 for [`SPLIT_NOCOLOR`]).
    pub fn size(&self) -> usize {
        self.comm.as_ref().map_or(0, Communicator::world)
    }

    /// The world's ranks in this rank's communicator, in their order in it (rank i of
    /// the communicator is world rank `members()[i]`).
    pub fn members(&self) -> &[usize] {
        self.groups.get(&self.color).map_or(&[], Vec::as_slice)
    }

    /// Each color's members (world ranks, in their order in its communicator).
    pub fn groups(&self) -> &BTreeMap<i32, Vec<usize>> {
        &self.groups
    }
}

/// What the session knows while it runs calls on a split ([`Session::on`]).
pub(super) struct Scope {
    pub(super) id: u64,
    pub(super) seq: u64,
    pub(super) color: i32,
    pub(super) groups: BTreeMap<i32, Vec<usize>>,
    /// The world ranks with a color, in world order: those that meet in the store.
    pub(super) participants: Vec<usize>,
}

impl Scope {
    /// The world's rank of rank `r` of this rank's communicator.
    pub(super) fn world_rank(&self, r: usize) -> usize {
        self.groups[&self.color][r]
    }
}

/// Whom a rank's (color, key) puts in which communicator, as `ncclCommSplit` does: the
/// ranks of one color, ordered by key, then by their rank in the parent.
fn groups_of(said: &[(i32, i32)]) -> BTreeMap<i32, Vec<usize>> {
    let mut groups: BTreeMap<i32, Vec<(i32, usize)>> = BTreeMap::new();
    for (r, &(color, key)) in said.iter().enumerate() {
        if color != SPLIT_NOCOLOR {
            groups.entry(color).or_default().push((key, r));
        }
    }
    groups
        .into_iter()
        .map(|(c, mut v)| {
            v.sort();
            (c, v.into_iter().map(|(_, r)| r).collect())
        })
        .collect()
}

impl Session {
    /// Splits the world's ranks into communicators, as `ncclCommSplit` does (every rank
    /// calls it): the ranks that give one `color` form a communicator, numbered in the
    /// order of their `key`, then of their world rank; a rank that gives
    /// [`SPLIT_NOCOLOR`] joins none. On NCCL, the call itself (non-blocking, under
    /// `--timeout`); on the CPU backend, a communicator over the world's links between its
    /// ranks (nothing new connects). Run calls on it with [`Session::on`].
    pub fn split(&mut self, color: i32, key: i32) -> Result<Split> {
        let rank = self.rank();
        if color < 0 && color != SPLIT_NOCOLOR {
            return Err(usage(format!(
                "rank {rank}: split color {color} is negative: a color is 0 or more, or SPLIT_NOCOLOR (-1) to join none"
            )));
        }
        if self.scope.is_some() {
            return Err(usage(format!(
                "rank {rank}: a split inside Session::on: split the world's communicator, outside it"
            )));
        }
        self.say_p2p()?;
        self.splits += 1;
        let id = self.splits;
        let key_name = self.next_key("split");
        let world = self.world_size();
        let said: Vec<(i32, i32)> = self.store.share_json(
            &key_name,
            rank,
            world,
            &(color, key),
            "every rank's color and key for the split",
        )?;
        // The test hook `NCCL_WORKBOOK_FAULT=die-in-split:RANK`: that rank is killed here,
        // once every rank has said its color, as the others start the split itself.
        if workbook_runtime::fault::asked("die-in-split", Some(rank)).is_some() {
            // SAFETY: raise has no memory effects; the process ends at once.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        let groups = groups_of(&said);
        let members = groups.get(&color).cloned().unwrap_or_default();
        let (store, timeout) = (&self.store, self.timeout);
        let comm = self
            .comm
            .split((color, key), &members, || {
                workbook_nccl::watchdog::Watchdog::new(store, rank, world, timeout)
            })
            .with_context(|| format!("rank {rank}: splitting the communicator (color {color}, key {key})"))?;
        if comm.is_none() != (color == SPLIT_NOCOLOR) {
            return Err(anyhow!(
                "rank {rank}: the split gave {} communicator for color {color}",
                match comm {
                    Some(_) => "a",
                    None => "no",
                }
            ));
        }
        Ok(Split {
            comm,
            color,
            colors: said.iter().map(|(c, _)| *c).collect(),
            groups,
            id,
            seq: 0,
        })
    }

    /// Runs `calls` on `split`'s communicator: inside, every collective, send and receive
    /// runs on it, with ranks (roots, peers, blocks) numbered in it; tables are printed
    /// one per communicator, titled with its color; checks and timings count its ranks.
    /// Every rank of the split with a color must call it at the same point (a rank of
    /// [`SPLIT_NOCOLOR`] may not: it has no communicator to run calls on).
    pub fn on<R>(&mut self, split: &mut Split, calls: impl FnOnce(&mut Session) -> Result<R>) -> Result<R> {
        let rank = self.rank();
        let Some(comm) = split.comm.take() else {
            return Err(usage(format!(
                "rank {rank}: Session::on a split this rank joined with SPLIT_NOCOLOR: it is in no communicator of it"
            )));
        };
        if self.scope.is_some() {
            split.comm = Some(comm);
            return Err(usage(format!("rank {rank}: Session::on inside Session::on")));
        }
        self.say_p2p()?;
        // The test hook `NCCL_WORKBOOK_FAULT=stop-in-split:RANK`: that rank stops itself
        // (SIGSTOP) as it first runs calls on a split, its communicators open.
        if split.seq == 0 && workbook_runtime::fault::asked("stop-in-split", Some(rank)).is_some() {
            // SAFETY: raise has no memory effects; the process stops until continued or killed.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        let world = std::mem::replace(&mut self.comm, comm);
        let participants = (0..self.world_size())
            .filter(|&r| split.colors[r] != SPLIT_NOCOLOR)
            .collect();
        self.scope = Some(Scope {
            id: split.id,
            seq: split.seq,
            color: split.color,
            groups: split.groups.clone(),
            participants,
        });
        workbook_runtime::record::peers_are(Some(split.members().to_vec()));
        // Failed on the split: explained, and its communicator aborted now saying why (it
        // would otherwise be dropped on the way out, and a hung abort would end the rank
        // without the cause).
        let ran = calls(self).map_err(|e| {
            let e = self.explain(e);
            self.comm.abandon(&e);
            e
        });
        workbook_runtime::record::peers_are(None);
        let scope = self.scope.take().expect("the scope set above");
        split.seq = scope.seq;
        split.comm = Some(std::mem::replace(&mut self.comm, world));
        ran
    }

    /// Frees `split`'s communicator, as `ncclCommDestroy` does after `ncclCommFinalize`
    /// (every queued call on it finished first): a lesson's last call on a split. A split
    /// dropped without it (a failure on the way) is aborted instead (`ncclCommAbort`).
    pub fn destroy(&mut self, mut split: Split) -> Result<()> {
        let rank = self.rank();
        match split.comm.as_mut() {
            Some(comm) => comm
                .close()
                .with_context(|| format!("rank {rank}: freeing the communicator of color {}", split.color)),
            None => Ok(()),
        }
    }

    /// The world ranks that meet in the store now, in world order: every rank, or inside
    /// [`Session::on`] those of the split with a color.
    pub(super) fn participants(&self) -> Vec<usize> {
        match &self.scope {
            Some(s) => s.participants.clone(),
            None => (0..self.world_size()).collect(),
        }
    }

    /// The rank that prints: rank 0, or inside [`Session::on`] the first rank with a color.
    pub(super) fn printer(&self) -> usize {
        self.scope.as_ref().map_or(0, |s| s.participants[0])
    }

    /// Every participant's `value` ([`Session::participants`], in their order), through
    /// the store under `key`: [`workbook_runtime::rendezvous::Store::share`] among them.
    pub(super) fn share_here(&mut self, key: &str, value: &[u8], what: &str) -> Result<Vec<Vec<u8>>> {
        let rank = self.rank();
        self.store.set(&format!("{key}/{rank}"), value)?;
        let keys: Vec<(String, usize)> = self
            .participants()
            .into_iter()
            .map(|r| (format!("{key}/{r}"), r))
            .collect();
        self.store.wait(&keys, what)
    }

    /// This rank as the calls of the current communicator name it: "rank 5", or inside
    /// [`Session::on`] "rank 5 (rank 1 of color 1)", for messages.
    pub(super) fn who(&self) -> String {
        let rank = self.rank();
        match &self.scope {
            Some(s) => format!("rank {rank} (rank {} of color {})", self.comm.rank(), s.color),
            None => format!("rank {rank}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_of_one_color_are_ordered_by_key_then_rank_and_nocolor_joins_none() {
        let said = [(0, 5), (1, 0), (0, 1), (SPLIT_NOCOLOR, 0), (0, 1), (1, -3)];
        let g = groups_of(&said);
        assert_eq!(g[&0], vec![2, 4, 0]);
        assert_eq!(g[&1], vec![5, 1]);
        assert_eq!(g.len(), 2);
    }
}

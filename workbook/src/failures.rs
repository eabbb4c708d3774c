//! What the checker makes of a job that failed: the failed ranks' records
//! (`workbook_runtime::failure`), not their sentences. A job the checker runs is asked for
//! records ([`ENV`]); each failed rank writes one line of data after its error line, and
//! from those the checker tells a deadlock (every failed rank stuck in a send or receive
//! with another stuck rank) from a crash, finds the rank the others waited on, and the
//! message nobody received. The sentences people read can be reworded freely.

use workbook_runtime::failure::{Ended, Record};

pub use workbook_runtime::failure::{ENV, PREFIX};

/// Every failed rank's record in `stderr`, the first of each rank, in the order written.
pub fn records(stderr: &str) -> Vec<Record> {
    let mut all: Vec<Record> = Vec::new();
    for record in stderr.lines().filter_map(Record::parse) {
        if !all.iter().any(|r| r.rank == record.rank) {
            all.push(record);
        }
    }
    all
}

/// `stderr` without the records: what a person reads.
pub fn for_people(stderr: &str) -> impl Iterator<Item = &str> {
    stderr.lines().filter(|l| !l.starts_with(PREFIX))
}

/// The rank after `prefix` in `text`: `rank 3` → 3.
pub fn rank_after(text: &str, prefix: &str) -> Option<usize> {
    let (_, rest) = text.split_once(prefix)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The ranks' error lines, the rank that the others waited on first: ordered by how many
/// other ranks' records say they waited for it (in a send or receive with it, on the GPU,
/// at a meeting it did not come to, or gone), most first, else as they came. A rank whose
/// message its peer never received names the cause itself: first of all.
pub fn awaited_first<'a>(lines: impl Iterator<Item = &'a str>, records: &[Record]) -> Vec<String> {
    let score = |line: &str| {
        let Some(rank) = rank_after(line, "error: rank ") else {
            return 0;
        };
        if records.iter().any(|r| r.rank == rank && r.unreceived_by.is_some()) {
            return usize::MAX;
        }
        records
            .iter()
            .filter(|r| r.rank != rank && r.awaited.contains(&rank))
            .count()
    };
    let mut sorted: Vec<(usize, &str)> = lines.map(|l| (score(l), l)).collect();
    sorted.sort_by_key(|(score, _)| std::cmp::Reverse(*score));
    sorted.into_iter().map(|(_, l)| l.to_string()).collect()
}

/// When the ranks that failed were all stuck sending or receiving, each waiting for
/// another of them, until a `--timeout` ran out: the words that say this is a deadlock,
/// and its usual causes. Nothing otherwise (a rank that crashed, a wrong count, a rank
/// waiting for one that had finished).
pub fn deadlock(records: &[Record]) -> Vec<String> {
    // On NCCL, only a wait that ran out with every rank alive.
    let stuck = |r: &&Record| r.waiting.is_some_and(|w| !w.on_gpu || r.ended == Ended::Deadline);
    let stuck: Vec<&Record> = records.iter().filter(stuck).collect();
    if stuck.len() < 2 || stuck.len() != records.len() || !stuck.iter().any(|r| r.ended == Ended::Deadline) {
        return Vec::new();
    }
    let peer = |r: &Record| r.waiting.map_or(usize::MAX, |w| w.peer);
    if !stuck.iter().all(|s| stuck.iter().any(|t| t.rank == peer(s))) {
        return Vec::new();
    }
    let mut sorted = stuck.clone();
    sorted.sort_by_key(|r| r.rank);
    let waits: Vec<String> = sorted
        .iter()
        .filter_map(|r| Some((r.rank, r.waiting?)))
        .map(|(rank, w)| match (w.on_gpu, w.sending) {
            (false, true) => format!("rank {rank} was sending to rank {}", w.peer),
            (false, false) => format!("rank {rank} was receiving from rank {}", w.peer),
            (true, true) => format!(
                "rank {rank} was waiting for its GPU to finish a send to rank {}",
                w.peer
            ),
            (true, false) => format!(
                "rank {rank} was waiting for its GPU to finish a receive from rank {}",
                w.peer
            ),
        })
        .collect();
    let sends = sorted.iter().filter(|r| r.waiting.is_some_and(|w| w.sending)).count();
    let recvs = sorted.len() - sends;
    let why = if sorted.iter().any(|r| r.waiting.is_some_and(|w| w.on_gpu)) {
        "On NCCL a rank's sends and receives run one after the other on its GPU, so a send waits for every \
         receive called before it: put the send and the receive of a step in one ncclGroupStart/ncclGroupEnd \
         (send_recv does)."
    } else if recvs == 0 {
        "Here every rank sends first: a small message fits in a buffer on the way and its send returns at once, \
         but a large one waits until the receiver takes it, and the receiver is itself sending."
    } else if sends == 0 {
        "Here every rank receives first: nobody sends, so nothing ever arrives."
    } else {
        "Here some ranks wait in a send and others in a receive, but never the pairs that match."
    };
    let text = format!(
        "This is a deadlock: {}. Each rank waited for a rank that was itself waiting, so none could ever go \
         on, and --timeout ended the job. A send must meet the matching receive on its peer; the usual \
         causes are that both ranks of a pair send first, or both receive first, or a ring in which every \
         rank waits for its left neighbour before it sends to its right. {why} Order the calls so that one \
         side of every pair sends while the other receives (in a chain, the first rank only sends), or use \
         send_recv, which sends and receives at once. Or issue a rank's sends and receives together, in one \
         group (s.group(), then g.end()): they progress together, whatever their order.",
        waits.join("; ")
    );
    crate::wrap(&text, 90).lines().map(str::to_string).collect()
}

/// When a rank sent a message that its peer never received: the words that say what
/// that is, why it shows where it does, and where to look. Nothing otherwise.
pub fn unreceived(records: &[Record]) -> Vec<String> {
    let Some((from, to)) = records.iter().find_map(|r| Some((r.rank, r.unreceived_by?))) else {
        return Vec::new();
    };
    let text = format!(
        "This is a send with no matching recv: rank {from} sent to rank {to}, and rank {to} went on without \
         the recv that would take it. A small message waits in the CPU backend's buffers, and only the end of the \
         job notices; a large one, or any on NCCL, holds its sender until --timeout. Every send must meet one recv \
         on its peer, as large: list, rank by rank, whom each one sends to and receives from, and look for the \
         send that has no recv (often one step too many at the end of a chain)."
    );
    crate::wrap(&text, 90).lines().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use workbook_runtime::failure::Waiting;

    /// A record: `waiting` as (sending, peer, on_gpu).
    fn rec(rank: usize, waiting: Option<(bool, usize, bool)>, ended: Ended, awaited: &[usize]) -> Record {
        Record {
            rank,
            backend: "cpu".into(),
            collective: None,
            waiting: waiting.map(|(sending, peer, on_gpu)| Waiting { sending, peer, on_gpu }),
            ended,
            awaited: awaited.to_vec(),
            unreceived_by: None,
        }
    }

    /// Three ranks each receiving first from its left, as a ring whose every rank receives
    /// before it sends leaves them: rank 2's --timeout ran out first, the others then saw
    /// it gone (or ran out too).
    fn recv_first() -> Vec<Record> {
        vec![
            rec(2, Some((false, 1, false)), Ended::Deadline, &[1]),
            rec(1, Some((false, 0, false)), Ended::Deadline, &[2, 0]),
            rec(0, Some((false, 2, false)), Ended::Deadline, &[2]),
        ]
    }

    #[test]
    fn records_are_read_from_stderr_and_left_out_for_people() {
        let r = rec(1, Some((true, 2, false)), Ended::Deadline, &[2]);
        let stderr = format!(
            "error: rank 1: stuck\n{}\n{}\nlauncher: rank 1 failed first\n",
            r.line(),
            r.line()
        );
        assert_eq!(records(&stderr), vec![r]);
        assert_eq!(
            for_people(&stderr).collect::<Vec<_>>(),
            ["error: rank 1: stuck", "launcher: rank 1 failed first"]
        );
    }

    #[test]
    fn every_rank_stuck_on_another_stuck_rank_is_a_deadlock() {
        let said = deadlock(&recv_first()).join(" ");
        assert!(
            said.starts_with(
                "This is a deadlock: rank 0 was receiving from rank 2; rank 1 was receiving from rank 0; rank 2 \
                 was receiving from rank 1."
            ),
            "{said}"
        );
        assert!(said.contains("Here every rank receives first"), "{said}");
        // Rank 0 saw rank 2 exit (after rank 2's own timeout) before its own ran out.
        let mut raced = recv_first();
        raced[2].ended = Ended::PeerLost;
        assert!(
            deadlock(&raced)
                .join(" ")
                .starts_with("This is a deadlock: rank 0 was receiving from rank 2;")
        );
        // On NCCL: each waited for its GPU, which had a send queued first.
        let gpu = vec![
            rec(0, Some((true, 1, true)), Ended::Deadline, &[1]),
            rec(1, Some((true, 0, true)), Ended::Deadline, &[0]),
        ];
        let said = deadlock(&gpu).join(" ");
        assert!(
            said.contains("rank 0 was waiting for its GPU to finish a send to rank 1"),
            "{said}"
        );
        assert!(said.contains("On NCCL"), "{said}");
    }

    #[test]
    fn other_failures_are_no_deadlock() {
        // A rank that failed otherwise, and the others waiting for it.
        let mut crashed = recv_first();
        crashed[0] = rec(2, None, Ended::Other, &[]);
        assert_eq!(deadlock(&crashed), Vec::<String>::new());
        // One rank stuck, waiting for a rank that did not fail (it finished, or never came).
        assert_eq!(
            deadlock(&[rec(1, Some((false, 0, false)), Ended::Deadline, &[0])]),
            Vec::<String>::new()
        );
        // Both saw the other gone: no --timeout ran out, something else ended them.
        let lost = [
            rec(0, Some((false, 1, false)), Ended::PeerLost, &[1]),
            rec(1, Some((false, 0, false)), Ended::PeerLost, &[0]),
        ];
        assert_eq!(deadlock(&lost), Vec::<String>::new());
        assert_eq!(deadlock(&[]), Vec::<String>::new());
    }

    #[test]
    fn the_rank_the_others_wait_on_comes_first() {
        // A chain whose last rank also sends 16 MiB to the root: rank 2 is stuck in that
        // send; rank 0 went on to a table and rank 1 to the check, both waiting for rank 2.
        let mut stuck = rec(2, Some((true, 0, false)), Ended::Deadline, &[0]);
        stuck.unreceived_by = Some(0);
        let all = [
            rec(1, None, Ended::Other, &[2]),
            rec(0, None, Ended::Other, &[2]),
            stuck,
        ];
        let lines = ["error: rank 1: a", "error: rank 0: b", "error: rank 2: c"];
        let sorted = awaited_first(lines.into_iter(), &all);
        assert_eq!(sorted, ["error: rank 2: c", "error: rank 0: b", "error: rank 1: a"]);
        let said = unreceived(&all).join(" ");
        assert!(
            said.starts_with("This is a send with no matching recv: rank 2 sent to rank 0"),
            "{said}"
        );
    }
}

//! What a failed rank was doing, as a record for programs: the exercises' checker reads it
//! to tell a deadlock from a crash, rather than reading the sentences a person reads.
//!
//! The places that know a fact note it on the failure's way up ([`attach`],
//! [`WithFact::fact`]): a send or receive that was waiting, and for whom; a deadline that
//! ran out; a peer that was lost; the ranks awaited; a message nobody received. The error
//! itself is left as it was (every way of printing it unchanged); what the error's own
//! types say (a link that failed, the store's answer) is read from its chain. The failed
//! rank's one line is unchanged; where [`ENV`] is set it then writes its [`Record`], one
//! more line on stderr starting with [`PREFIX`]. The sentences can be reworded freely: no
//! program reads them.

use crate::error::LinkFailed;
use serde::{Deserialize, Serialize};

/// Set (to anything) in a job's environment, each failed rank writes its [`Record`].
pub const ENV: &str = "NCCL_WORKBOOK_FAILURE_RECORD";
/// What starts the line of a [`Record`] on stderr (then its JSON).
pub const PREFIX: &str = "failure-record: ";

/// One fact about a failure, noted where it is known ([`note`]); the error's sentence
/// says it for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact {
    /// The rank was waiting in a send (`sending`) or a receive, with `peer` (the world's
    /// number); on NCCL (`on_gpu`), waiting for its GPU to finish it.
    Waiting {
        /// A send (else a receive).
        sending: bool,
        /// The other rank, as the world numbers it.
        peer: usize,
        /// The call was queued on the GPU (NCCL), which runs a rank's calls in order.
        on_gpu: bool,
    },
    /// Its own `--timeout` ran out: nothing moved for that long.
    Deadline,
    /// A rank it waited for is gone (its connection closed, its process ended).
    PeerLost(usize),
    /// The ranks it waited for, or blames (the store's wait they never came to, the rank
    /// that failed first).
    Awaited(Vec<usize>),
    /// It sent a message that `to` went on without receiving.
    Unreceived {
        /// The rank that never received it.
        to: usize,
    },
    /// It was in this collective (nccl-tests' name: `all_reduce`).
    Collective(&'static str),
}

/// The facts this process noted, in the order it noted them ([`note`]): a rank fails
/// once, and every place that notes one is on the way to that failure.
static NOTED: std::sync::Mutex<Vec<Fact>> = std::sync::Mutex::new(Vec::new());

/// Notes `fact` for this rank's record, if it fails. Kept beside the error rather than in
/// it, so that every way of printing the error stays as it was.
pub fn note(fact: Fact) {
    NOTED.lock().unwrap_or_else(|p| p.into_inner()).push(fact);
}

/// `err`, with `fact` noted for the record ([`note`]): the error itself is unchanged.
pub fn attach(err: anyhow::Error, fact: Fact) -> anyhow::Error {
    note(fact);
    err
}

/// [`attach`] on a result's error.
pub trait WithFact<T> {
    /// The result as it is; if it is an error, `fact()` noted for the record.
    fn fact(self, fact: impl FnOnce() -> Fact) -> anyhow::Result<T>;
}

impl<T> WithFact<T> for anyhow::Result<T> {
    fn fact(self, fact: impl FnOnce() -> Fact) -> anyhow::Result<T> {
        self.map_err(|e| attach(e, fact()))
    }
}

/// How a failed rank's wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ended {
    /// Its own `--timeout` ran out.
    Deadline,
    /// A peer was lost while it waited.
    PeerLost,
    /// Anything else (a wrong result, a crash of its own, a bad argument).
    Other,
}

/// A send or receive a failed rank was waiting in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// A send (else a receive).
    pub sending: bool,
    /// The other rank, as the world numbers it.
    pub peer: usize,
    /// Queued on the GPU (NCCL).
    pub on_gpu: bool,
}

/// What one failed rank was doing: what the checker reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The rank that failed.
    pub rank: usize,
    /// `cpu` or `nccl` (empty before a backend was chosen).
    pub backend: String,
    /// The collective it was in, if any (nccl-tests' name).
    pub collective: Option<String>,
    /// The send or receive it was waiting in, if any.
    pub waiting: Option<Waiting>,
    /// How its wait ended.
    pub ended: Ended,
    /// The ranks it waited for or blames, each once, itself never.
    pub awaited: Vec<usize>,
    /// The rank that never received a message it sent, if that is what went wrong.
    pub unreceived_by: Option<usize>,
}

impl Record {
    /// The record of `err`, which ended `rank` on `backend`: the facts this process noted
    /// on its way to it, and those its error holds (a link that failed, the store's answer).
    pub fn of(rank: usize, backend: &str, err: &anyhow::Error) -> Record {
        let noted = NOTED.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Record::from_facts(rank, backend, &noted, err)
    }

    /// The record of `err` and the facts `noted` ([`Record::of`]'s).
    pub fn from_facts(rank: usize, backend: &str, noted: &[Fact], err: &anyhow::Error) -> Record {
        let mut record = Record {
            rank,
            backend: backend.to_string(),
            collective: None,
            waiting: None,
            ended: Ended::Other,
            awaited: Vec::new(),
            unreceived_by: None,
        };
        let mut seen: Vec<usize> = Vec::new();
        let add = |r: usize, seen: &mut Vec<usize>| {
            if r != rank && !seen.contains(&r) {
                seen.push(r);
            }
        };
        for fact in noted {
            match fact {
                Fact::Waiting { sending, peer, on_gpu } => {
                    record.waiting.get_or_insert(Waiting {
                        sending: *sending,
                        peer: *peer,
                        on_gpu: *on_gpu,
                    });
                    add(*peer, &mut seen);
                }
                Fact::Deadline => record.ended = Ended::Deadline,
                Fact::PeerLost(peer) => {
                    if record.ended == Ended::Other {
                        record.ended = Ended::PeerLost;
                    }
                    add(*peer, &mut seen);
                }
                Fact::Awaited(ranks) => ranks.iter().for_each(|r| add(*r, &mut seen)),
                Fact::Unreceived { to } => record.unreceived_by = Some(*to),
                Fact::Collective(name) => {
                    record.collective.get_or_insert_with(|| name.to_string());
                }
            }
        }
        for cause in err.chain() {
            if let Some(link) = cause.downcast_ref::<LinkFailed>() {
                if record.ended == Ended::Other {
                    record.ended = if link.timed_out {
                        Ended::Deadline
                    } else {
                        Ended::PeerLost
                    };
                }
                add(link.peer, &mut seen);
            } else if let Some(ranks) = crate::rendezvous::store_awaited(cause) {
                ranks.iter().for_each(|r| add(*r, &mut seen));
            }
        }
        record.awaited = seen;
        record
    }

    /// Its line on stderr: [`PREFIX`] and its JSON.
    pub fn line(&self) -> String {
        format!("{PREFIX}{}", serde_json::to_string(self).unwrap_or_default())
    }

    /// The record a line of stderr holds, if it is one.
    pub fn parse(line: &str) -> Option<Record> {
        serde_json::from_str(line.strip_prefix(PREFIX)?).ok()
    }
}

/// Writes `rank`'s record of `err` on stderr, where the job asked for records ([`ENV`]).
pub fn say(rank: usize, backend: &str, err: &anyhow::Error) {
    if std::env::var_os(ENV).is_some() {
        crate::error::say_line(&Record::of(rank, backend, err).line());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    #[test]
    fn the_noted_facts_and_the_errors_types_make_the_record() {
        let err = anyhow!(LinkFailed {
            peer: 2,
            timed_out: true,
            message: "nothing moved to or from rank 2 for the whole --timeout".into()
        })
        .context("sending 7 elements to (rank 2 over shared memory)");
        let noted = [
            Fact::Waiting {
                sending: true,
                peer: 2,
                on_gpu: false,
            },
            Fact::Awaited(vec![3, 2, 1]),
        ];
        let r = Record::from_facts(1, "cpu", &noted, &err);
        assert_eq!(
            r.waiting,
            Some(Waiting {
                sending: true,
                peer: 2,
                on_gpu: false
            })
        );
        assert_eq!(r.ended, Ended::Deadline);
        assert_eq!(r.awaited, vec![2, 3]);
        assert_eq!(Record::parse(&r.line()), Some(r));
        assert_eq!(Record::parse("error: rank 1: boom"), None);
        // Noting leaves the error as it was, however it is printed.
        let err = attach(err, Fact::Deadline);
        assert_eq!(
            format!("{err:#}"),
            "sending 7 elements to (rank 2 over shared memory): nothing moved to or from rank 2 for the whole --timeout"
        );
    }
}

//! Checking a result: every rank compares its buffer with what the collective must
//! give, and rank 0 says how many elements were wrong, and where.

use super::Session;
use crate::backend::Buffer;
use crate::report::Check;
use anyhow::Result;
use workbook_runtime::element::{Element, ReduceOp};

/// Test hook: `NCCL_WORKBOOK_FAULT=corrupt:RANK:INDEX` doubles one element of one
/// rank's result before the check (tests corrupt non-zero results), so that tests can
/// prove a wrong result is caught, reported and fails the run. Every check calls it on
/// what it read back (the session's, and the benchmark's). Public for the benchmark's
/// crate (`workbook-perf`) alone; hidden from the docs, no lesson calls it.
#[doc(hidden)]
pub fn corrupt_for_tests<T: Element>(rank: usize, data: &mut [T]) {
    if let Some(at) = workbook_runtime::fault::asked("corrupt", Some(rank))
        && let Some(v) = at
            .first()
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| data.get_mut(i))
    {
        *v = v.combine(*v, ReduceOp::Sum);
    }
}

impl Session {
    /// Checks every element of every rank's buffer against `expected`, as nccl-tests
    /// counts `#wrong`; rank 0 reports. Fails on every rank if any element is wrong.
    pub fn check<T: Element>(&mut self, buf: &Buffer<T>, expected: T) -> Result<()> {
        self.check_by(buf, &expected.to_string(), |_| expected)
    }

    /// The check itself: element i of every rank's buffer must match `expected(i)`;
    /// `holds` is what the OK line says the ranks hold.
    pub(crate) fn check_by<T: Element>(
        &mut self,
        buf: &Buffer<T>,
        holds: &str,
        expected: impl Fn(usize) -> T,
    ) -> Result<()> {
        self.flush_steps(false)?;
        let _range = self.nvtx("check");
        let mut all = self.comm.download(buf, buf.len())?;
        corrupt_for_tests(self.rank(), &mut all);
        let bad = |i: &usize| !all[*i].matches(expected(*i));
        let wrong = (0..all.len()).filter(bad).count();
        let first = (0..all.len())
            .find(bad)
            .map(|i| format!("element {i} is {} instead of {}", all[i], expected(i)));
        let key = self.next_key("check");
        let mine = serde_json::to_vec(&(wrong, first, holds))?;
        self.say_p2p()?;
        let replies = self.share_here(&key, &mine, "every rank's check")?;
        let results: Vec<(usize, Option<String>, String)> = replies
            .iter()
            .map(|r| serde_json::from_slice(r))
            .collect::<Result<_, _>>()?;
        let participants = self.participants();
        let world = participants.len();
        let on = self
            .scope
            .as_ref()
            .map(|s| {
                format!(
                    " (on {} communicator{} of the split)",
                    s.groups.len(),
                    if s.groups.len() == 1 { "" } else { "s" }
                )
            })
            .unwrap_or_default();
        let total: usize = results.iter().map(|(w, _, _)| w).sum();
        self.report.check = Some(Check {
            ok: total == 0,
            wrong: total as u64,
        });
        if total == 0 {
            let who = match world {
                1 => "the one rank holds".to_string(),
                n => format!("all {n} ranks hold"),
            };
            let elements = match (all.len(), world) {
                (1, 1) => "its one element".to_string(),
                (1, _) => "their one element".to_string(),
                (n, _) => format!("all {n} elements"),
            };
            let holds = match &self.scope {
                // Each communicator has its own result: what each color's ranks hold.
                Some(scope) => {
                    let of = |r: &usize| participants.iter().position(|p| p == r).map(|i| results[i].2.clone());
                    let each: Vec<String> = scope
                        .groups
                        .iter()
                        .map(|(c, m)| {
                            let mut said: Vec<String> = m.iter().filter_map(of).collect();
                            said.dedup();
                            format!("color {c}'s {} hold {}", ranks(m.len()), said.join(" or "))
                        })
                        .collect();
                    let mut all: Vec<&String> = results.iter().map(|r| &r.2).collect();
                    all.dedup();
                    match all.as_slice() {
                        [one] => one.to_string(),
                        _ => return self.say_ok(&format!("Check: OK, {} in {elements}", each.join(", "))),
                    }
                }
                None => holds.to_string(),
            };
            return self.say_ok(&format!("Check: OK, {who} {holds} in {elements}{on}"));
        }
        let bad: Vec<String> = results
            .iter()
            .zip(&participants)
            .filter(|((w, _, _), _)| *w > 0)
            .map(|((w, first, _), r)| format!("rank {r}: {w} wrong ({})", first.as_deref().unwrap_or("?")))
            .collect();
        let plural = if total == 1 { "" } else { "s" };
        let message = format!("check FAILED, {total} wrong element{plural}: {}", bad.join("; "));
        self.say(&format!("Check: {}", message.replace("check FAILED", "FAILED")));
        // Like nccl-tests, carry on (timing, the report) and fail at the end, with the first failure.
        self.failed.get_or_insert(message);
        Ok(())
    }
}

/// "1 rank", "4 ranks".
fn ranks(n: usize) -> String {
    format!("{n} rank{}", if n == 1 { "" } else { "s" })
}

impl Session {
    /// Says a check's OK line.
    fn say_ok(&self, line: &str) -> Result<()> {
        self.say(line);
        Ok(())
    }
}

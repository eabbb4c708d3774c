//! The launcher: what this program does when nothing says which rank it is.
//!
//! Like `torchrun --nproc-per-node N`, it starts N copies of itself on this machine,
//! each with the variables a rank reads (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, and the job's [`crate::secret`]),
//! lets them write straight to this terminal, and waits. When one fails, the others get
//! a moment to say what they saw (a lost peer), then are stopped, and the launcher exits
//! non-zero naming the rank at fault and how: the rank its ranks blame
//! ([`crate::blame`]), which may run on another node, else the first of its own that
//! failed.

use crate::error::{EXIT_FAILURE, EXIT_USAGE, usage};
use crate::launch::{ENV_JOB_ID, ENV_LAUNCHED, ENV_SECRET, Plan};
use anyhow::{Context, Result};
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

/// How long the other ranks may take to exit on their own after the first failure.
const GRACE: Duration = Duration::from_secs(3);
/// How long past `--timeout` the launcher lets its ranks stay stopped before it ends them:
/// time for the ranks of other nodes to notice, give up and say so first.
const STOPPED_SLACK: Duration = Duration::from_secs(5);
/// How often the launcher looks whether its ranks are stopped (a read of /proc each).
const STOPPED_LOOK: Duration = Duration::from_millis(250);

/// Starts this node's ranks and waits for them; returns the launcher's exit status.
/// `extra_env` is added to every rank's environment (the backend's needs). `left_by`
/// removes, once the ranks have ended, the files the ranks of these process ids made and
/// may have left (a rank killed before its peers opened its shared-memory channels left
/// their names): the backends know their files, the launcher only the ranks.
///
/// `timeout` is the ranks' `--timeout`: no rank waits for another longer, so ranks of this
/// node that stay stopped (SIGSTOP, a debugger) longer than that, with no other rank of this
/// node left to fail, are past any use: the ranks of other nodes gave up on them.
pub fn run(
    plan: &Plan,
    nproc: usize,
    timeout: Duration,
    extra_env: &[(String, String)],
    left_by: &dyn Fn(&[u32]),
) -> Result<u8> {
    let world = nproc * plan.nnodes;
    let port = match plan.master_port {
        Some(p) => p,
        None => free_port(&plan.master_addr)?,
    };
    let job_id = match &plan.job_id {
        Some(id) => id.clone(),
        // Several nodes must agree on the job's name without talking: derive it.
        None if plan.nnodes > 1 => format!("launch@{}:{port}", plan.master_addr),
        None => format!("launch-{:016x}", random_u64()),
    };
    // The ranks of one node get a secret of their own, which the store asks of every join:
    // no other process can join their job, though its id and port are easy to work out.
    // The launchers of several nodes cannot agree on one without talking: their ranks take
    // the user's, if the user set one on every node (inherited, as the rest of the
    // environment is).
    let secret = match plan.nnodes {
        1 => Some(crate::secret::Secret::fresh().context("making the job's secret")?),
        _ => None,
    };
    let exe = std::env::current_exe().context("finding this program's own path to start the ranks")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut ranks: Vec<(usize, Child)> = Vec::with_capacity(nproc);
    // Where the ranks say whom they blame: a rank on another node, this launcher cannot see.
    let mut verdicts = crate::blame::Verdicts::new();
    for local in 0..nproc {
        let rank = plan.node_rank * nproc + local;
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("GROUP_RANK", plan.node_rank.to_string())
            .env("MASTER_ADDR", &plan.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env(ENV_JOB_ID, &job_id)
            .env(ENV_LAUNCHED, "1")
            .env_remove("TORCHELASTIC_USE_AGENT_STORE");
        if let Some(secret) = &secret {
            cmd.env(ENV_SECRET, secret.text());
        }
        cmd.envs(extra_env.iter().map(|(k, v)| (k, v)));
        if let Some(v) = &verdicts {
            v.pass_to(&mut cmd);
        }
        die_with_parent(&mut cmd);
        match cmd.spawn() {
            Ok(child) => ranks.push((rank, child)),
            Err(e) => {
                stop(&mut ranks);
                return Err(e).with_context(|| format!("starting rank {rank} ({})", exe.display()));
            }
        }
    }
    if let Some(v) = &mut verdicts {
        v.started();
    }
    let pids: Vec<u32> = ranks.iter().map(|(_, c)| c.id()).collect();
    let code = watch(ranks, verdicts.as_ref(), timeout);
    left_by(&pids);
    Ok(code)
}

/// A rank whose launcher dies (killed, its terminal closed) is told to stop, by the kernel
/// (Linux's `PR_SET_PDEATHSIG`), instead of living on as an orphan: SIGTERM, which the
/// rank takes to remove what it made before it goes ([`crate::signals`]). A launcher
/// that died between the fork and the `prctl` is seen at once: the rank does not start.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    unsafe extern "C" {
        fn prctl(option: std::ffi::c_int, ...) -> std::ffi::c_int;
    }
    const PR_SET_PDEATHSIG: std::ffi::c_int = 1;
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: prctl and getppid are async-signal-safe, as code between fork and exec must be.
    unsafe {
        cmd.pre_exec(move || {
            prctl(PR_SET_PDEATHSIG, libc::SIGTERM as std::ffi::c_ulong);
            match libc::getppid() == launcher {
                true => Ok(()),
                false => Err(std::io::Error::other("the launcher is gone")),
            }
        });
    }
}

/// Waits for every rank; on the first failure, gives the rest a grace period, then stops
/// them. The line it says names the rank the ranks blamed (`verdicts`), as every node's
/// launcher does, else what it saw itself. Ranks still running that all stay stopped for
/// longer than `timeout` (and [`STOPPED_SLACK`]) are stopped for good: nothing else ends
/// them once the other nodes' ranks have given up on them.
fn watch(mut ranks: Vec<(usize, Child)>, verdicts: Option<&crate::blame::Verdicts>, timeout: Duration) -> u8 {
    let mut first: Option<(usize, ExitStatus)> = None;
    let mut grace_end: Option<Instant> = None;
    let mut live = ranks.len();
    let mut done = vec![false; ranks.len()];
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; ranks.len()];
    // The ranks this launcher killed (frozen, or still running after the grace period).
    let mut killed = vec![false; ranks.len()];
    let mut stopped = 0;
    let mut frozen: Option<Vec<usize>> = None;
    // Since when every rank still running has been seen stopped, and when it was last looked at.
    let (mut all_stopped_since, mut looked): (Option<Instant>, Option<Instant>) = (None, None);
    while live > 0 {
        let mut ended = vec![];
        for (i, (rank, child)) in ranks.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            if let Ok(Some(status)) = child.try_wait() {
                done[i] = true;
                statuses[i] = Some(status);
                live -= 1;
                ended.push((*rank, status));
            }
        }
        // Of the ranks that failed since the last look, one killed by a signal went first:
        // the others exited because they lost it.
        let failed = ended.iter().filter(|(_, s)| !s.success());
        let pick = failed
            .clone()
            .find(|(_, s)| s.code().is_none())
            .or(failed.clone().next());
        if let (Some(&(rank, status)), None) = (pick, &first) {
            first = Some((rank, status));
            grace_end = Some(Instant::now() + GRACE);
        }
        // When the first failure comes, a rank that is frozen (stopped by a signal, or
        // held by a debugger) is the likely cause: the others gave up waiting for it.
        if first.is_some() && grace_end.is_some() && frozen.is_none() {
            let stopped_now: Vec<usize> = ranks
                .iter()
                .enumerate()
                .filter(|(i, (_, child))| !done[*i] && is_stopped(child.id()))
                .map(|(i, _)| i)
                .collect();
            // A stopped rank cannot exit on its own: no grace period for it.
            for &i in &stopped_now {
                let _ = ranks[i].1.kill();
                killed[i] = true;
                stopped += 1;
            }
            frozen = Some(stopped_now.iter().map(|&i| ranks[i].0).collect());
        }
        // Before any failure, every so often: are the ranks still running all stopped?
        let now = Instant::now();
        if first.is_none() && looked.is_none_or(|t| now - t >= STOPPED_LOOK) {
            // A long gap since the last look: this launcher was stopped too (Ctrl-Z stops
            // the whole job), and what it saw before says nothing of the time between.
            if looked.is_some_and(|t| now - t > 8 * STOPPED_LOOK) {
                all_stopped_since = None;
            }
            looked = Some(now);
            let running: Vec<usize> = (0..ranks.len()).filter(|&i| !done[i]).collect();
            let all_stopped = !running.is_empty() && running.iter().all(|&i| is_stopped(ranks[i].1.id()));
            all_stopped_since = all_stopped.then(|| all_stopped_since.unwrap_or(now));
            if all_stopped_since.is_some_and(|t| now - t > timeout + STOPPED_SLACK) {
                for &i in &running {
                    let _ = ranks[i].1.kill();
                    let _ = ranks[i].1.wait();
                }
                let which: Vec<u64> = running.iter().map(|&i| ranks[i].0 as u64).collect();
                let (who, was) = match which.len() {
                    1 => (format!("rank {}", which[0]), "was"),
                    _ => (crate::rank::list(&which), "were"),
                };
                crate::error::say_line(&format!(
                    "launcher: {who} {was} frozen (stopped: SIGSTOP, or a debugger) for longer than --timeout ({}), \
                     past which no rank waits for it: stopped for good",
                    crate::units::human_duration(timeout)
                ));
                return EXIT_FAILURE;
            }
        }
        if grace_end.is_some_and(|end| Instant::now() >= end) {
            for (i, (_, child)) in ranks.iter_mut().enumerate() {
                if !done[i] {
                    let _ = child.kill();
                    killed[i] = true;
                    stopped += 1;
                }
            }
            grace_end = None;
        }
        if live > 0 {
            thread::sleep(Duration::from_millis(10));
        }
    }
    match first {
        None => 0,
        // Rank 0 has already said what the user got wrong: nothing to add.
        Some((_, s)) if s.code() == Some(EXIT_USAGE as i32) => EXIT_USAGE,
        Some(first) => {
            let rest = match stopped {
                0 => String::new(),
                1 => "; stopped 1 rank still running".into(),
                n => format!("; stopped {n} ranks still running"),
            };
            // How each rank ended, unless this launcher ended it.
            let ended: Vec<(usize, Option<ExitStatus>)> = ranks
                .iter()
                .zip(statuses)
                .zip(killed)
                .map(|(((r, _), s), by_us)| (*r, s.filter(|_| !by_us)))
                .collect();
            let blamed = verdicts.and_then(|v| v.first());
            let said = fault_line(first, &ended, &frozen.unwrap_or_default(), blamed);
            crate::error::say_line(&format!("launcher: {said}{rest}"));
            EXIT_FAILURE
        }
    }
}

/// What the launcher says of a failure (after "launcher: "): the rank at fault and how,
/// then, if that is not the first of its ranks to fail, which one did. `first` is the
/// first of its ranks that failed, `ended` how each of its ranks ended (in the order it
/// started them; `None`: ended by this launcher), `frozen` those it found stopped,
/// `blamed` whom the ranks blamed.
fn fault_line(
    first: (usize, ExitStatus),
    ended: &[(usize, Option<ExitStatus>)],
    frozen: &[usize],
    blamed: Option<(usize, String)>,
) -> String {
    let failed = |rank: usize, status: ExitStatus| {
        // The launcher sends no SIGKILL before the first failure: someone else did, and
        // most often that is the kernel's out-of-memory killer.
        let oom = match status.signal() {
            Some(9) => {
                ": by someone, or by the kernel's out-of-memory killer (memory ran out: `dmesg`, or `sacct -o State` \
                 under Slurm, says which)"
            }
            _ => "",
        };
        format!("rank {rank} failed first ({}{oom})", describe(status))
    };
    let (rank, status) = first;
    let frozen_line = || {
        let cause = match frozen {
            [] => String::new(),
            [one] => format!("rank {one} was frozen (its process was stopped: SIGSTOP, or a debugger); then "),
            many => format!(
                "{} were frozen (their processes were stopped: SIGSTOP, or a debugger); then ",
                crate::rank::list(&many.iter().map(|r| *r as u64).collect::<Vec<_>>())
            ),
        };
        format!("{cause}{}", failed(rank, status))
    };
    let Some((culprit, cause)) = blamed else {
        return frozen_line();
    };
    // The ranks blame one of this node's ranks: what this launcher saw of it says how.
    if frozen.contains(&culprit) {
        return frozen_line();
    }
    // "rank 0, which hosts the store, ...", "rank 3 stopped responding ...".
    let sep = if cause.starts_with("which") { ", " } else { " " };
    match ended.iter().find(|(r, _)| *r == culprit) {
        Some((_, Some(s))) if !s.success() => failed(culprit, *s),
        // Neither ended by itself nor stopped here (or ended well): as the ranks say.
        Some(_) => format!(
            "rank {culprit}{sep}{cause}; then rank {rank} failed ({})",
            describe(status)
        ),
        // A rank of another node: as the ranks say, then what happened here.
        None => format!(
            "rank {culprit} (on another node){sep}{cause}; then rank {rank} here failed ({})",
            describe(status)
        ),
    }
}

/// Whether process `pid` is alive (neither gone nor a zombie), from /proc: how the
/// backends tell the files of dead processes, which they remove, from a live job's.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "1234 (name) S ...".
        Ok(stat) => !matches!(
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => false,
    }
}

/// Whether process `pid` is stopped (state `T`, or `t` under a debugger), from /proc.
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state == 'T' || state == 't')
}

fn stop(ranks: &mut [(usize, Child)]) {
    for (_, child) in ranks.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// "exit status 1" or "killed by signal 9 (SIGKILL)".
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    let sig = status.signal().unwrap_or(0);
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "",
    };
    if name.is_empty() {
        format!("killed by signal {sig}")
    } else {
        format!("killed by signal {sig} ({name})")
    }
}

/// A port that was free a moment ago on `addr` (the store binds it soon after).
fn free_port(addr: &str) -> Result<u16> {
    let listener =
        TcpListener::bind((addr, 0)).map_err(|e| usage(format!("cannot listen on the master address {addr}: {e}")))?;
    Ok(listener.local_addr()?.port())
}

/// A random number from the standard library's randomly seeded hasher.
pub fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos() ^ u128::from(std::process::id()));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn signal(sig: i32) -> ExitStatus {
        ExitStatus::from_raw(sig)
    }

    #[test]
    fn every_launcher_names_the_rank_its_ranks_blame() {
        let silent = || {
            Some((
                3,
                "stopped responding (no heartbeat for 4 s: its process is stopped or frozen)".into(),
            ))
        };
        // On another node: as the ranks say, then what happened here.
        let here = [(0, Some(exit(1))), (1, Some(exit(1)))];
        assert_eq!(
            fault_line((0, exit(1)), &here, &[], silent()),
            "rank 3 (on another node) stopped responding (no heartbeat for 4 s: its process is stopped or frozen); \
             then rank 0 here failed (exit status 1)"
        );
        // On this node, found frozen: as this launcher saw it.
        let here = [(2, Some(exit(1))), (3, None)];
        assert_eq!(
            fault_line((2, exit(1)), &here, &[3], silent()),
            "rank 3 was frozen (its process was stopped: SIGSTOP, or a debugger); then rank 2 failed first (exit \
             status 1)"
        );
        // Killed on this node, though another of its ranks exited first.
        let lost = Some((2, "failed first (its connection closed)".to_string()));
        let here = [(2, Some(signal(9))), (3, Some(exit(1)))];
        assert!(
            fault_line((3, exit(1)), &here, &[], lost.clone())
                .starts_with("rank 2 failed first (killed by signal 9 (SIGKILL): by someone, or by the kernel's")
        );
        // The store's host, on another node.
        assert_eq!(
            fault_line(
                (1, exit(1)),
                &[(1, Some(exit(1)))],
                &[],
                Some((0, "which hosts the store, stopped answering or is gone".into()))
            ),
            "rank 0 (on another node), which hosts the store, stopped answering or is gone; then rank 1 here failed \
             (exit status 1)"
        );
        // Nobody blamed: the first of its own that failed.
        assert_eq!(
            fault_line((1, exit(1)), &[(1, Some(exit(1)))], &[], None),
            "rank 1 failed first (exit status 1)"
        );
    }
}

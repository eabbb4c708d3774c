//! NCCL's `TUNING` lines, written where `NCCL_DEBUG_FILE` says (`%h` the host, `%p` the
//! pid): with `NCCL_DEBUG=INFO` and `TUNING` in `NCCL_DEBUG_SUBSYS`, rank 0 of a
//! communicator of several ranks prints at init the table of the double's tuning model,
//! in NCCL's format (blocks of three algorithms), and one line per collective naming the
//! algorithm and protocol it runs (`NCCL_ALGO` forces it), in the format of the NCCL
//! version played. Played with `nccl-double-bare` (a blocking loop of all-reduces of 8
//! bytes: 2 float32) on 1, 2 and 4 ranks.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

const BARE: &str = env!("CARGO_BIN_EXE_nccl-double-bare");

/// One rank's end, and the debug file it wrote (`None`: no file).
struct Rank {
    out: support::Out,
    pid: u32,
    log: Option<String>,
}

/// `world` ranks of a loop of 2 all-reduces (1 warm-up, 1 timed) playing NCCL `version`
/// with `NCCL_DEBUG=INFO`, `NCCL_DEBUG_FILE=<fresh folder>/<file>` and `env`: every
/// rank's end, with the file named `file` with `%h`, `%p` and `%%` expanded.
fn job(world: usize, version: &str, file: &str, env: &[(&str, &str)]) -> Vec<Rank> {
    let tag = support::job_tag(world, version, env);
    let dir: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tuning-lines-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let id = dir.join("id");
    // `/proc/self/fd/3`: each rank runs under sh with a file of stale text of its own
    // open as descriptor 3 (`exec 3<>`, which does not truncate).
    let fd3 = file == "/proc/self/fd/3";
    let fd3_file = |r: usize| dir.join(format!("fd3.{r}"));
    let ranks: Vec<_> = (0..world)
        .map(|r| {
            let program = if fd3 {
                std::fs::write(fd3_file(r), "stale text\n".repeat(100)).unwrap();
                let mut sh = Command::new("sh");
                sh.args(["-c", "exec 3<>\"$0\"; exec \"$@\""])
                    .arg(fd3_file(r))
                    .arg(BARE);
                sh
            } else {
                Command::new(BARE)
            };
            let mut cmd = support::bare_rank(program, (r, world), world, &id, version, 1);
            cmd.env("NCCL_DEBUG", "INFO")
                .env("NCCL_DEBUG_FILE", if fd3 { file.into() } else { dir.join(file) })
                .env_remove("NCCL_DEBUG_SUBSYS")
                .env_remove("NCCL_ALGO")
                .env_remove("NCCL_PROTO")
                .envs(env.iter().copied());
            support::Running::new(r, cmd.spawn().unwrap())
        })
        .collect();
    let pids: Vec<u32> = ranks.iter().map(|r| r.pid()).collect();
    let ends = ranks
        .into_iter()
        .zip(pids)
        .enumerate()
        .map(|(rank, (r, pid))| {
            let out = r.finish().0;
            if fd3 {
                let log = std::fs::read_to_string(fd3_file(rank)).ok();
                return Rank { out, pid, log };
            }
            let name = file
                .replace("%h", host())
                .replace("%p", &pid.to_string())
                .replace("%%", "%");
            let log = std::fs::read_to_string(dir.join(name)).ok();
            Rank { out, pid, log }
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    ends
}

/// The host's name up to its first dot, as NCCL prints it.
fn host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        name.trim().split('.').next().unwrap().to_string()
    })
}

/// The text of each `NCCL INFO` line of `log` (after `host:pid:tid [dev] NCCL INFO `),
/// checking that prefix on the way.
fn infos(log: &str, pid: u32) -> Vec<String> {
    log.lines()
        .map(|l| {
            let (prefix, text) = l
                .split_once(" NCCL INFO ")
                .unwrap_or_else(|| panic!("not an INFO line: {l:?}"));
            let parts: Vec<&str> = prefix.split(':').collect();
            assert_eq!(parts.len(), 3, "{l:?}");
            assert_eq!(parts[0], host(), "{l:?}");
            assert_eq!(parts[1], pid.to_string(), "{l:?}");
            let (tid, dev) = parts[2].split_once(' ').unwrap();
            assert!(
                tid.parse::<u32>().is_ok() && dev.starts_with('[') && dev.ends_with(']'),
                "{l:?}"
            );
            text.to_string()
        })
        .collect()
}

/// A table line of one collective: its name and its `latency/bandwidth` pairs.
fn parse_row(line: &str) -> Option<(String, Vec<(f64, f64)>)> {
    let (name, rest) = line.split_once(" |")?;
    let pairs = rest
        .split('|')
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            let (lat, bw) = c.trim().split_once('/')?;
            Some((lat.trim().parse().ok()?, bw.trim().parse().ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((name.trim().to_string(), pairs))
}

/// The `AllReduce` rows of the table among `lines`, one per block of algorithms.
fn all_reduce_rows(lines: &[String]) -> Vec<Vec<(f64, f64)>> {
    lines
        .iter()
        .filter_map(|l| parse_row(l))
        .filter(|(name, _)| name == "AllReduce")
        .map(|(_, pairs)| pairs)
        .collect()
}

#[test]
fn rank_0_writes_the_table_and_each_all_reduces_algorithm_to_the_debug_file() {
    for world in [2usize, 4] {
        for (algo, name) in [("Tree", "TREE"), ("Ring", "RING")] {
            let env = [("NCCL_DEBUG_SUBSYS", "TUNING"), ("NCCL_ALGO", algo)];
            let ranks = job(world, "22809", "log.%p", &env);
            for r in &ranks {
                assert_eq!(r.out.code, Some(0), "{world} {algo}: {}", r.out);
                assert!(
                    !r.out.stdout.contains("NCCL INFO"),
                    "the lines go to the file: {}",
                    r.out
                );
            }
            let log = ranks[0]
                .log
                .as_deref()
                .unwrap_or_else(|| panic!("rank 0 wrote no log.{}: {}", ranks[0].pid, ranks[0].out));
            let lines = infos(log, ranks[0].pid);
            // Three blocks (Tree Ring CollNetDirect | CollNetChain NVLS NVLSTree | PAT).
            let headers: Vec<&String> = lines.iter().filter(|l| l.starts_with("  Algorithm   |")).collect();
            assert_eq!(headers.len(), 3, "{log}");
            assert_eq!(
                headers[0].split_whitespace().collect::<Vec<_>>(),
                ["Algorithm", "|", "Tree", "|", "Ring", "|", "CollNetDirect", "|"]
            );
            assert!(headers[2].contains("PAT"), "{log}");
            assert!(lines.iter().any(|l| l.starts_with(" Max NThreads |")), "{log}");
            let rows = all_reduce_rows(&lines);
            assert_eq!(rows.len(), 3, "{log}");
            assert_eq!(rows[0].len(), 9, "3 algorithms x 3 protocols: {log}");
            // The algorithm forced is the one with bandwidth; CollNet never has any.
            let (tree, ring) = (&rows[0][0..3], &rows[0][3..6]);
            let (kept, gone) = if algo == "Tree" { (tree, ring) } else { (ring, tree) };
            assert!(kept.iter().any(|(_, bw)| *bw > 0.0), "{algo}: {log}");
            assert!(gone.iter().all(|(_, bw)| *bw == 0.0), "{algo}: {log}");
            assert!(rows[0][6..].iter().all(|(_, bw)| *bw == 0.0), "{log}");
            assert!(kept.iter().all(|(lat, _)| *lat > 0.0), "{log}");
            // Each all-reduce (a warm-up and one timed) says the algorithm forced.
            let calls: Vec<&String> = lines.iter().filter(|l| l.contains("Bytes -> Algo")).collect();
            assert_eq!(calls.len(), 2, "{log}");
            for c in calls {
                let want = format!("AllReduce: 8 Bytes -> Algo {name} proto ");
                assert!(c.starts_with(&want), "{c:?} is not {want:?}…");
                assert!(c.ends_with(" channel{Lo..Hi}={0..0}"), "{c:?}");
                let proto = c[want.len()..].split(' ').next().unwrap();
                assert!(["LL", "LL128", "SIMPLE"].contains(&proto), "{c:?}");
            }
            // The other ranks print no table and no choice.
            for r in &ranks[1..] {
                let other = r.log.as_deref().unwrap_or_default();
                assert!(
                    !other.contains("Algorithm") && !other.contains("Bytes -> Algo"),
                    "{other}"
                );
            }
        }
    }
}

#[test]
fn the_table_follows_the_version_played_and_so_does_the_per_call_line() {
    let subsys = ("NCCL_DEBUG_SUBSYS", "TUNING");
    let tree = ("NCCL_ALGO", "Tree");
    // 2.18: six algorithms (two blocks), no per-call line.
    let ranks = job(2, "21803", "log.%p", &[subsys, tree]);
    let lines = infos(ranks[0].log.as_deref().unwrap(), ranks[0].pid);
    assert_eq!(
        lines.iter().filter(|l| l.contains("Algorithm   |")).count(),
        2,
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("PAT") || l.contains("Bytes -> Algo")),
        "{lines:#?}"
    );
    // 2.21: `<bytes> Bytes -> Algo <n> proto <n> time <t>`, the tree being algorithm 0.
    let ranks = job(2, "22105", "log.%p", &[subsys, tree]);
    let lines = infos(ranks[0].log.as_deref().unwrap(), ranks[0].pid);
    let call = lines
        .iter()
        .find(|l| l.contains("Bytes -> Algo"))
        .expect("a per-call line");
    assert!(call.starts_with("8 Bytes -> Algo 0 proto "), "{call:?}");
    let time: f64 = call.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(time > 0.0, "{call:?}");
    // 2.23: the same with the collective's name, and PAT in a third block.
    let ranks = job(2, "22304", "log.%p", &[subsys, ("NCCL_ALGO", "Ring")]);
    let lines = infos(ranks[0].log.as_deref().unwrap(), ranks[0].pid);
    assert_eq!(
        lines.iter().filter(|l| l.contains("Algorithm   |")).count(),
        3,
        "{lines:#?}"
    );
    let call = lines
        .iter()
        .find(|l| l.contains("Bytes -> Algo"))
        .expect("a per-call line");
    assert!(call.starts_with("AllReduce: 8 Bytes -> Algo 1 proto "), "{call:?}");
}

#[test]
fn one_rank_prints_no_table() {
    let ranks = job(1, "22809", "log.%p", &[("NCCL_DEBUG_SUBSYS", "ALL")]);
    assert_eq!(ranks[0].out.code, Some(0), "{}", ranks[0].out);
    let log = ranks[0].log.as_deref().unwrap_or_default();
    assert!(!log.contains("Algorithm") && !log.contains("Bytes -> Algo"), "{log}");
    // The COLL lines of its calls are there: the file is in use.
    assert!(log.contains("NCCL INFO AllReduce: opCount"), "{log}");
}

#[test]
fn without_tuning_in_the_subsystems_nothing_of_it_is_printed() {
    for subsys in [None, Some("INIT,COLL,ENV"), Some("^TUNING")] {
        let mut env = vec![("NCCL_ALGO", "Ring")];
        env.extend(subsys.map(|s| ("NCCL_DEBUG_SUBSYS", s)));
        let ranks = job(2, "22809", "log.%p", &env);
        assert_eq!(ranks[0].out.code, Some(0), "{}", ranks[0].out);
        let log = ranks[0].log.as_deref().unwrap_or_default();
        assert!(
            !log.contains("Algorithm") && !log.contains("Bytes -> Algo"),
            "{subsys:?}: {log}"
        );
        // ENV is let through by each of these: the file holds its line.
        assert!(
            log.contains("NCCL_ALGO set by environment to Ring"),
            "{subsys:?}: {log}"
        );
    }
}

#[test]
fn the_file_name_takes_the_host_and_the_pid_and_stdout_is_the_fallback() {
    let ranks = job(2, "22809", "%h-%p.%%.txt", &[("NCCL_DEBUG_SUBSYS", "TUNING")]);
    for r in &ranks {
        assert_eq!(r.out.code, Some(0), "{}", r.out);
        assert!(
            r.log.is_some(),
            "rank {} wrote no {}-{}.%.txt",
            r.out.rank,
            host(),
            r.pid
        );
    }
    assert!(ranks[0].log.as_deref().unwrap().contains("Algorithm"));
    // A file that cannot be opened: the lines stay on stdout.
    let ranks = job(2, "22809", "no-such-folder/log", &[("NCCL_DEBUG_SUBSYS", "TUNING")]);
    assert_eq!(ranks[0].out.code, Some(0), "{}", ranks[0].out);
    assert!(
        ranks[0].out.stdout.contains("NCCL INFO   Algorithm   |"),
        "{}",
        ranks[0].out
    );
}

#[test]
fn a_descriptor_of_the_process_is_opened_and_truncated_as_a_file() {
    // What the workbook does with a memfd: NCCL_DEBUG_FILE=/proc/self/fd/N, which NCCL
    // opens with fopen(name, "w"), truncating what was there.
    let ranks = job(2, "22809", "/proc/self/fd/3", &[("NCCL_DEBUG_SUBSYS", "TUNING")]);
    for r in &ranks {
        assert_eq!(r.out.code, Some(0), "{}", r.out);
        let log = r.log.as_deref().unwrap();
        assert!(!log.contains("stale"), "rank {}: {log}", r.out.rank);
    }
    let lines = infos(ranks[0].log.as_deref().unwrap(), ranks[0].pid);
    assert_eq!(all_reduce_rows(&lines).len(), 3, "{lines:#?}");
    assert!(ranks[1].log.as_deref().unwrap().is_empty());
}

//! Groups (`Session::group`, NCCL's ncclGroupStart/ncclGroupEnd): many collectives in one
//! group, checked element by element; an all-to-all of grouped sends and receives larger
//! than a link holds, which completes; the same without its group, which fails within
//! --timeout in one line per rank naming the send and the rank it waits for. Real
//! multi-process jobs of `group-probe` (harness-tests/src/group.rs), on the CPU backend
//! (shared memory and TCP) and on simulated GPUs.

use testkit::{LIMIT, Run, calls, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_group-probe");

fn probe(args: &[&str]) -> Run {
    finish(spawn(command(BIN, args)), LIMIT)
}

/// The `Group:` line the run printed (rank 0, text output).
fn group_line(r: &Run) -> &str {
    r.stdout
        .lines()
        .find(|l| l.starts_with("Group: "))
        .unwrap_or_else(|| panic!("no Group: line:\n{r}"))
}

fn checked(r: &Run, ranks: usize) {
    assert_eq!(r.code, Some(0), "{r}");
    let ok = format!("Check: OK, all {ranks} ranks hold the expected values in all ");
    assert!(r.stdout.lines().any(|l| l.starts_with(&ok)), "{r}");
}

#[test]
fn a_group_of_broadcasts_and_all_reduces_is_right_element_by_element_on_the_cpu_backend() {
    // 5 broadcasts and 5 all-reduces of 4 to 8 elements, an all-gather, a reduce-scatter
    // and a reduce, and two in-place all-gathers, reduce-scatters and all-to-alls (whose
    // packed buffers are made of blocks), in one group, twice: packed by kind, every
    // element checked.
    for transport in ["shm", "tcp"] {
        let r = probe(&["--nproc-per-node", "3", "--iters", "2", "--transport", transport]);
        checked(&r, 3);
        assert_eq!(
            group_line(&r),
            "Group: 5 broadcasts (float, root 0) packed into one broadcast of 120 B; 5 all-reduces (float, sum) \
             packed into one all-reduce of 120 B; 1 all-gather (float) of 48 B, run as it is; 1 reduce-scatter \
             (float, sum) of 48 B, run as it is; 1 reduce (float, root 2, min) of 16 B, run as it is; 2 \
             all-gathers (float, in place) packed into one all-gather of 96 B; 2 reduce-scatters (float, sum, in \
             place) packed into one reduce-scatter of 96 B; 2 all-to-alls (float, in place) packed into one \
             all-to-all of 96 B",
            "{r}"
        );
        // Said once, not once per run.
        assert_eq!(r.stdout.matches("Group: ").count(), 1, "{r}");
    }
    // Calls of 64 KiB and more run as they are, the smaller ones of their kind packed; a
    // root other than 0; 4 ranks.
    let r = probe(&[
        "--nproc-per-node",
        "4",
        "--calls",
        "6",
        "--count",
        "16380",
        "--root",
        "3",
    ]);
    checked(&r, 4);
    let line = group_line(&r);
    assert!(
        line.starts_with(
            "Group: 6 broadcasts (float, root 3): 4 under 64.0 KiB packed into one of 256.0 KiB, 2 of 64.0 KiB or \
             more run as they are (128.0 KiB); 6 all-reduces (float, sum): 4 under 64.0 KiB packed"
        ),
        "{r}"
    );
}

#[test]
fn on_simulated_gpus_a_group_is_one_nccl_group_and_every_element_is_right() {
    let r = probe(&["--simulate-gpus", "3", "--iters", "2"]);
    checked(&r, 3);
    assert_eq!(
        group_line(&r),
        "Group: 5 × ncclBroadcast, 5 × ncclAllReduce, 3 × ncclAllGather, 3 × ncclReduceScatter, 1 × ncclReduce, 2 \
         × ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd, launched together by NCCL",
        "{r}"
    );
    // Each call issued into the group as it is made, between one ncclGroupStart and its end.
    let r = probe(&["--simulate-gpus", "2", "--calls", "3", "--show-calls=1"]);
    checked(&r, 2);
    let shown = calls(&r.stdout, 1);
    let name = |c: &String| c.split('(').next().unwrap_or("").to_string();
    let start = shown
        .iter()
        .position(|c| c.starts_with("ncclGroupStart("))
        .unwrap_or_else(|| panic!("no ncclGroupStart:\n{r}"));
    // The calls of the group, an all-to-all's own group of sends and receives nested in it.
    let mut inside = Vec::new();
    let mut depth = 1;
    for call in shown[start + 1..].iter().map(name) {
        match call.as_str() {
            "ncclGroupStart" => {
                depth += 1;
                inside.push("(".to_string());
            }
            "ncclGroupEnd" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
                inside.push(")".to_string());
            }
            c if c.starts_with("nccl") => inside.push(call),
            _ => {}
        }
    }
    assert_eq!(depth, 0, "no ncclGroupEnd:\n{r}");
    assert_eq!(
        inside,
        [
            "ncclBroadcast",
            "ncclBroadcast",
            "ncclBroadcast",
            "ncclAllReduce",
            "ncclAllReduce",
            "ncclAllReduce",
            "ncclAllGather",
            "ncclReduceScatter",
            "ncclReduce",
            "ncclAllGather",
            "ncclReduceScatter",
            "(",
            "ncclSend",
            "ncclRecv",
            "ncclSend",
            "ncclRecv",
            ")",
            "ncclAllGather",
            "ncclReduceScatter",
            "(",
            "ncclSend",
            "ncclRecv",
            "ncclSend",
            "ncclRecv",
            ")"
        ],
        "{r}"
    );
}

#[test]
fn a_grouped_all_to_all_of_blocks_larger_than_a_link_holds_completes() {
    // 3.8 MiB per block: more than a shared-memory channel (2 MiB) or a socket's buffers
    // take while nobody receives; the sends progress on threads while the ranks receive.
    for transport in ["shm", "tcp"] {
        let args = [
            "--nproc-per-node",
            "3",
            "--mode",
            "alltoall",
            "--count",
            "1000000",
            "--transport",
            transport,
        ];
        let r = probe(&args);
        checked(&r, 3);
        assert_eq!(
            group_line(&r),
            "Group: 2 sends and 2 receives progressed together (the sends to 2 ranks on threads of their own \
             while this one receives)",
            "{transport}: {r}"
        );
    }
    // Small blocks: the links hold the sends, which go first, with no thread.
    let r = probe(&["--nproc-per-node", "4", "--mode", "alltoall", "--count", "7"]);
    checked(&r, 4);
    assert!(group_line(&r).contains("the link's buffers hold the sends"), "{r}");
    // On simulated GPUs (whose sends always wait for their receive): one NCCL group.
    let r = probe(&["--simulate-gpus", "3", "--mode", "alltoall", "--count", "300000"]);
    checked(&r, 3);
    assert_eq!(
        group_line(&r),
        "Group: 2 × ncclSend, 2 × ncclRecv between ncclGroupStart and ncclGroupEnd, launched together by NCCL",
        "{r}"
    );
}

#[test]
fn without_its_group_the_all_to_all_fails_within_the_timeout_one_line_per_rank_naming_the_peer() {
    // Every rank sends to every peer in rank order, then receives: rank 0 and rank 1 each
    // wait in a send to the other, rank 2 in its send to rank 0.
    let args = [
        "--nproc-per-node",
        "3",
        "--mode",
        "alltoall",
        "--count",
        "1000000",
        "--no-group",
        "--timeout",
        "3",
    ];
    let r = probe(&args);
    assert_eq!(r.code, Some(1), "{r}");
    let errors: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 3, "one line per rank:\n{r}");
    for (rank, to, theirs) in [(0, 1, 0), (1, 0, 1), (2, 0, 1)] {
        let line = format!(
            "error: rank {rank}: its send of 3.8 MiB to rank {to} is not received: rank {to} is in a send too, to \
             rank {theirs} (a deadlock: past the link's buffer a send returns only once its receiver takes it, as \
             NCCL's does past its eager size; issue the sends and receives together, in one group: \
             session.group()): sending 1000000 elements to (rank {to} "
        );
        assert!(errors.iter().any(|l| l.starts_with(&line)), "no line {line:?}:\n{r}");
    }
    // On simulated GPUs the sends are queued and the GPU waits: each rank names the send it
    // waits for, and the group that would have let it go on.
    let mut args = args.to_vec();
    args.splice(0..2, ["--simulate-gpus", "3"]);
    args[5] = "300000";
    let r = probe(&args);
    assert_eq!(r.code, Some(1), "{r}");
    let errors: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 3, "one line per rank:\n{r}");
    // Every rank's deadline passes at about the same moment. The first to pass it explains
    // the deadlock and exits; a rank whose own deadline is a few milliseconds later may
    // learn first that that rank is gone, and name it instead: true, and never a fourth.
    let deadlock = |rank: usize, to: usize| {
        format!(
            "error: rank {rank}: nothing finished in 3 s (--timeout) waiting for the GPU to finish send to rank \
             {to} (ncclSend)"
        )
    };
    let explained: Vec<usize> = [(0, 1), (1, 0), (2, 0)]
        .into_iter()
        .filter(|(rank, to)| {
            errors.iter().any(|l| {
                l.starts_with(&deadlock(*rank, *to))
                    && l.contains("this is a deadlock; sends and receives that must progress together go in one group")
            })
        })
        .map(|(rank, _)| rank)
        .collect();
    assert!(!explained.is_empty(), "no rank explains the deadlock:\n{r}");
    for (rank, to) in [(0, 1), (1, 0), (2, 0)] {
        if explained.contains(&rank) {
            continue;
        }
        let named = explained.iter().any(|gone| {
            errors.iter().any(|l| {
                l.starts_with(&format!(
                    "error: rank {rank}: rank {gone} failed (its connection closed)"
                )) && l.contains(&format!("waiting for the GPU to finish send to rank {to} (ncclSend)"))
            })
        });
        assert!(
            named,
            "rank {rank} neither explains the deadlock nor names a rank that did:\n{r}"
        );
    }
}

#[test]
fn steps_and_trace_show_what_a_cpu_group_ran() {
    // --steps: the packed collectives' steps under their name, and the messages.
    let r = probe(&["--nproc-per-node", "2", "--calls", "2", "--count", "2", "--steps"]);
    checked(&r, 2);
    for title in [
        "Steps of 2 broadcasts (float, root 0) packed into one on 2 ranks, chain:",
        "Steps of 2 all-reduces (float, sum) packed into one on 2 ranks,",
    ] {
        assert!(r.stdout.lines().any(|l| l.starts_with(title)), "no {title:?}:\n{r}");
    }
    let r = probe(&["--nproc-per-node", "3", "--mode", "alltoall", "--count", "3", "--steps"]);
    checked(&r, 3);
    let lines: Vec<&str> = r.stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("Messages of a group's sends and receives on 3 ranks"))
        .unwrap_or_else(|| panic!("no messages shown:\n{r}"));
    for rank in 0..3 {
        let row = lines[at + 1 + rank];
        assert!(row.starts_with(&format!("    CPU {rank}  ")), "{row}\n{r}");
        for peer in (0..3).filter(|p| *p != rank) {
            assert!(row.contains(&format!("sent 12 B → rank {peer}")), "{row}\n{r}");
            assert!(row.contains(&format!("got 12 B from rank {peer}")), "{row}\n{r}");
        }
    }
    // --trace: the group, and its packed collective inside it, on each rank's track.
    let dir = std::env::temp_dir().join(format!("group-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("run.json");
    let r = probe(&[
        "--nproc-per-node",
        "2",
        "--calls",
        "3",
        "--trace",
        file.to_str().unwrap(),
    ]);
    checked(&r, 2);
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let names: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["pid"] == 1 && e["ph"] == "X")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("group: 3 broadcasts (float, root 0) packed into one broadcast")),
        "{names:?}"
    );
    assert!(
        names.contains(&"3 broadcasts (float, root 0) packed into one"),
        "{names:?}"
    );
    // A grouped all-to-all: one span on each rank's track, each message on its link's
    // track with an arrow to its receive, and on every track the slices nest.
    let r = probe(&[
        "--nproc-per-node",
        "3",
        "--mode",
        "alltoall",
        "--count",
        "600000",
        "--iters",
        "2",
        "--trace",
        file.to_str().unwrap(),
    ]);
    checked(&r, 3);
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let events = trace["traceEvents"].as_array().unwrap();
    let sends = events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "send").count();
    let arrows = events.iter().filter(|e| e["ph"] == "s").count();
    // 3 ranks × 2 peers × 2 runs.
    assert_eq!((sends, arrows), (12, 12), "{trace}");
    let mut tracks: std::collections::BTreeMap<(u64, u64), Vec<(f64, f64)>> = Default::default();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        tracks.entry(key).or_default().push((ts, ts + dur));
    }
    for (track, mut spans) in tracks {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = vec![];
        for (a, b) in spans {
            while open.last().is_some_and(|end| *end <= a) {
                open.pop();
            }
            if let Some(end) = open.last() {
                assert!(b <= *end + 1e-6, "track {track:?}: a slice overlaps another in part");
            }
            open.push(b);
        }
    }
}

/// A group that never sends to rank + 1 (issue 53, item 6): each rank says that the peer
/// it waited for is alive and waits elsewhere (a send missing from its group), not only
/// that nothing moved and the peer is "stuck or gone"; and none takes the first rank to
/// give up and exit for a crash ("rank 0 failed first (its connection closed)"): each
/// rank gave up on its own wait.
#[test]
fn a_send_missing_from_a_group_is_said_of_a_live_peer() {
    let args = [
        "--backend",
        "cpu",
        "--mode",
        "alltoall",
        "--nproc-per-node",
        "3",
        "--skip-send-to-next",
        "--timeout",
        "3",
    ];
    let r = finish(spawn(command(BIN, &args)), LIMIT);
    assert_eq!(r.code, Some(1), "{r}");
    for rank in 0..3 {
        let line = r
            .stderr
            .lines()
            .find(|l| l.starts_with(&format!("error: rank {rank}: ")))
            .unwrap_or_else(|| panic!("{r}"));
        // Rank r waits for rank r - 1, which skipped its send to it.
        let peer = (rank + 2) % 3;
        assert!(
            line.contains(&format!(
                "rank {rank}: rank {peer} is alive (the store hears from it) and waits elsewhere"
            )) && line.contains("missing from its group")
                && !line.contains("failed first"),
            "{line}\n{r}"
        );
    }
}

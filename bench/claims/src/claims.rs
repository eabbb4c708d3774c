//! The claims: what README.md, docs/ and EXERCISES.md state, the commands that measure it, and
//! the direction each comparison must have. When the text changes, its claim changes in
//! the same commit (a quote no longer in the text makes the claim stale).

/// One command of the workbook (a release binary), as the text runs it.
#[derive(Clone, Debug)]
pub struct Cmd {
    /// The binary: `07-nccl-perf`, `sol07-packed-broadcast`.
    pub bin: &'static str,
    /// Its arguments, as the text writes them (`--format json` is added).
    pub args: Vec<String>,
    /// Variables in front of it (`NCCL_ALGO=Ring`).
    pub env: Vec<(&'static str, &'static str)>,
    /// "Nodes" of this host, each its own launcher (`--nnodes`), 1 for a plain run.
    pub nodes: usize,
}

impl Cmd {
    /// The arguments to run: in `--quick`, the fewest timed iterations.
    pub fn args_for(&self, quick: bool) -> Vec<String> {
        let mut out = self.args.clone();
        if quick {
            for i in 1..out.len() {
                match out[i - 1].as_str() {
                    "--iters" | "-n" => out[i] = "1".into(),
                    "-w" => out[i] = "0".into(),
                    _ => {}
                }
            }
        }
        out
    }
}

/// Where a figure is in a command's JSON report.
#[derive(Clone, Debug)]
pub enum Stat {
    /// A JSON pointer into the report: `/time_us`.
    Report(&'static str),
    /// A pointer into the benchmark's row of this size: `/in_place/busbw`.
    Row(u64, &'static str),
    /// The largest value at this pointer over every row.
    Rows(&'static str),
}

/// How a figure is shown.
#[derive(Clone, Copy, Debug)]
pub enum Unit {
    /// Microseconds (shown in ms from 1000).
    Us,
    /// GB/s.
    GBps,
    /// A count (calls that slept).
    Count,
    /// A fraction, shown in percent (how far a row is off a fit).
    Share,
}

impl Unit {
    /// One value.
    pub fn show(self, v: f64) -> String {
        match self {
            Unit::Us if v >= 1000.0 => format!("{:.2} ms", v / 1000.0),
            Unit::Us if v >= 10.0 => format!("{v:.0} µs"),
            Unit::Us => format!("{v:.2} µs"),
            Unit::GBps => format!("{v:.2} GB/s"),
            Unit::Count => format!("{v:.0}"),
            Unit::Share => format!("{:.0}%", v * 100.0),
        }
    }

    /// The median and, with several values, the range: `1.6 ms [1.4-1.9]`.
    pub fn spread(self, v: &[f64]) -> String {
        let m = crate::run::median(v);
        if v.len() < 2 {
            return self.show(m);
        }
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{} [{}-{}]", self.show(m), self.show(lo), self.show(hi))
    }
}

/// One measured figure: a label, the command, and where its figure is.
#[derive(Clone, Debug)]
pub struct Measure {
    pub label: String,
    pub cmd: Cmd,
    pub stat: Stat,
    pub unit: Unit,
}

impl Measure {
    /// The command as a person types it.
    pub fn command_line(&self, quick: bool) -> String {
        let env: String = self.cmd.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        let nodes = match self.cmd.nodes {
            1 => String::new(),
            n => format!(" (on {n} \"nodes\")"),
        };
        format!("{env}{} {}{nodes}", self.cmd.bin, self.cmd.args_for(quick).join(" "))
    }
}

/// The direction a comparison must have, on the medians. A side is the sum of the
/// measures it lists (a reduce-scatter and an all-gather against an all-reduce).
#[derive(Clone, Debug)]
pub enum Check {
    /// Side `a` is less than side `b`, by the factor `by` at least (1: any).
    Less { a: Vec<usize>, b: Vec<usize>, by: f64 },
    /// Sides `a` and `b` are within `factor` of each other.
    Within { a: Vec<usize>, b: Vec<usize>, factor: f64 },
    /// Measure `a` is below `value`.
    Below { a: usize, value: f64 },
}

/// One claim of the text.
#[derive(Clone, Debug)]
pub struct Claim {
    /// Short and stable: `ch7.shm`.
    pub id: &'static str,
    /// Where: `EXERCISES.md, answer 7`.
    pub place: &'static str,
    /// The file that must still hold the quote.
    pub file: &'static str,
    /// The text's own words (its figures): must be found in `file`.
    pub quote: &'static str,
    /// The claim in a few words, for the summary.
    pub says: &'static str,
    pub measures: Vec<Measure>,
    pub checks: Vec<Check>,
    /// Why the direction depends on the machine, when it does: then a direction that
    /// does not hold here is reported, not failed.
    pub depends: Option<&'static str>,
}

/// A command from its binary and its arguments written as in the text.
fn cmd(bin: &'static str, args: &str) -> Cmd {
    Cmd {
        bin,
        args: args.split_whitespace().map(str::to_string).collect(),
        env: vec![],
        nodes: 1,
    }
}

impl Cmd {
    fn env(mut self, k: &'static str, v: &'static str) -> Cmd {
        self.env.push((k, v));
        self
    }
    fn nodes(mut self, n: usize) -> Cmd {
        self.nodes = n;
        self
    }
}

/// The `Time:` figure of a lesson, exercise or solution (µs per call).
fn time(label: impl Into<String>, cmd: Cmd) -> Measure {
    Measure {
        label: label.into(),
        cmd,
        stat: Stat::Report("/time_us"),
        unit: Unit::Us,
    }
}

/// A figure of the benchmark's row of `size` bytes.
fn row(label: impl Into<String>, cmd: Cmd, size: u64, ptr: &'static str) -> Measure {
    let unit = match ptr {
        p if p.ends_with("_us") => Unit::Us,
        p if p.ends_with("slept") => Unit::Count,
        _ => Unit::GBps,
    };
    Measure {
        label: label.into(),
        cmd,
        stat: Stat::Row(size, ptr),
        unit,
    }
}

fn less(a: usize, b: usize) -> Check {
    Check::Less {
        a: vec![a],
        b: vec![b],
        by: 1.0,
    }
}

fn less_by(a: usize, b: usize, by: f64) -> Check {
    Check::Less {
        a: vec![a],
        b: vec![b],
        by,
    }
}

const MB16: &str = "--size 16M";

/// Every claim, in the order of the text.
pub fn all() -> Vec<Claim> {
    let mut all = vec![];
    all.extend(lessons());
    all.extend(chapter4());
    all.extend(chapters5and6());
    all.extend(chapter7());
    all.extend(chapter8());
    all.extend(chapter9());
    all.extend(chapter10());
    all.extend(perf_section());
    all.extend(tuner());
    all.extend(protocols());
    all.extend(chapter12());
    all
}

/// docs/cpu-backend.md's "Which algorithm runs": at the sizes around each threshold, what the tuner
/// picks is no slower than what it passes over (within 10%: the two are close there),
/// in place and out of place together, as `bench/crossover.sh` set the thresholds: one
/// placement alone may go the other way (a 2-rank all-reduce of 1 MiB by single copy is
/// faster out of place and slower in place, where each rank reads lines its peer wrote).
fn tuner() -> Vec<Claim> {
    let point = |op: &str, n: usize, size: &str, algo: &'static str, bytes: u64| {
        let c = cmd(
            "07-nccl-perf",
            &format!("--coll {op} -b {size} -e {size} -n 50 --nproc-per-node {n}"),
        );
        let other = c.clone().env("NCCL_ALGO", algo);
        [("the tuner's", c), (&*format!("NCCL_ALGO={algo}"), other)]
            .into_iter()
            .flat_map(|(who, c)| {
                [
                    ("in place", "/in_place/time_us"),
                    ("out of place", "/out_of_place/time_us"),
                ]
                .map(|(placed, ptr)| row(format!("{op} {size} on {n}, {who}, {placed}"), c.clone(), bytes, ptr))
            })
            .collect::<Vec<_>>()
    };
    let mut measures = vec![];
    // Below the threshold (the tuner's: not the single copy) and above (the single copy).
    measures.extend(point("broadcast", 4, "32K", "single-copy", 32 << 10));
    measures.extend(point("broadcast", 4, "256K", "^single-copy", 256 << 10));
    // Two ranks with a core each copy from 16 KiB: below, the broadcast's chain.
    measures.extend(point("broadcast", 2, "8K", "single-copy", 8 << 10));
    measures.extend(point("all_reduce", 2, "32K", "^single-copy", 32 << 10));
    measures.extend(point("all_reduce", 2, "1M", "^single-copy", 1 << 20));
    measures.extend(point("all_reduce", 4, "256K", "^single-copy", 256 << 10));
    measures.extend(point("all_gather", 4, "256K", "^single-copy", 256 << 10));
    // The reduce copies below 4 MiB on 2 ranks and 1 MiB on more (`single_copy_below`).
    measures.extend(point("reduce", 2, "256K", "^single-copy", 256 << 10));
    measures.extend(point("reduce", 2, "16M", "single-copy", 16 << 20));
    measures.extend(point("reduce", 4, "256K", "^single-copy", 256 << 10));
    measures.extend(point("reduce", 4, "4M", "single-copy", 4 << 20));
    // Each point: the tuner's in place and out of place, then the other's.
    let checks = (0..measures.len() / 4)
        .map(|i| Check::Less {
            a: vec![4 * i, 4 * i + 1],
            b: vec![4 * i + 2, 4 * i + 3],
            by: 0.9,
        })
        .collect();
    vec![Claim {
        id: "tuner",
        place: "docs/cpu-backend.md, Which algorithm runs",
        file: "docs/cpu-backend.md",
        quote: "one host, from 64 KiB, or from 16 KiB on 2 ranks with a core each (`single_copy_from`",
        says: "on each side of a threshold, the tuner's choice is no slower than the other (within 10%), in place and out of place together",
        measures,
        checks,
        depends: Some(
            "the crossovers move with the machine's cores and caches: bench/crossover.sh finds this machine's",
        ),
    }]
}

/// The lessons' outputs (docs/lessons.md; lesson 02's is the README's sample run): each
/// command still runs, and its `Time:` figure.
fn lessons() -> Vec<Claim> {
    let one = |id, bin, args: &str, quote| Claim {
        id,
        place: "docs/lessons.md, the lessons' outputs",
        file: "docs/lessons.md",
        quote,
        says: "the sample output's Time: line",
        measures: vec![time(bin, cmd(bin, args))],
        checks: vec![],
        depends: None,
    };
    vec![
        one(
            "readme.01",
            "01-nccl-broadcast",
            "",
            "Time: 0.2 us per broadcast of 16 B via chain",
        ),
        Claim {
            place: "README.md, A sample run",
            file: "README.md",
            ..one(
                "readme.02",
                "02-nccl-allreduce",
                "--nproc-per-node 3 --init rank",
                "Time: 5.9 us per all-reduce of 16 B via direct",
            )
        },
        one(
            "readme.03",
            "03-nccl-reduce",
            "--nproc-per-node 3",
            "Time: 0.3 us per reduce of 16 B via chain",
        ),
        one(
            "readme.04",
            "04-nccl-allgather",
            "--nproc-per-node 3",
            "Time: 14.0 us per all-gather of 24 B via direct",
        ),
        one(
            "readme.05",
            "05-nccl-reducescatter",
            "--nproc-per-node 3",
            "Time: 8.8 us per reduce-scatter of 24 B via direct",
        ),
        one(
            "readme.06",
            "06-nccl-alltoall",
            "--nproc-per-node 3",
            "Time: 6.4 us per all-to-all of 24 B via direct",
        ),
    ]
}

/// Chapter 4: star, chain, pipeline and the library at 16 MiB on 2, 3 and 4 ranks.
fn chapter4() -> Vec<Claim> {
    // Measures: n = 2 at 0..4, 3 at 4..8, 4 at 8..12; star, chain, pipeline, library.
    let table = |id, transport: &'static str, quote, says, checks, depends| {
        let mut measures = vec![];
        for n in [2, 3, 4] {
            for algo in ["star", "chain", "pipeline"] {
                let args = format!("{MB16} --nproc-per-node {n} --iters 20 --algo {algo} {transport}");
                measures.push(time(format!("{algo}, {n} ranks"), cmd("sol04-p2p-broadcast", &args)));
            }
            let args = format!("{MB16} --nproc-per-node {n} --iters 20 {transport}");
            measures.push(time(format!("library, {n} ranks"), cmd("01-nccl-broadcast", &args)));
        }
        Claim {
            id,
            place: "EXERCISES.md, answer 4",
            file: "EXERCISES.md",
            quote,
            says,
            measures,
            checks,
            depends,
        }
    };
    let within = |a: usize, b: usize| Check::Within {
        a: vec![a],
        b: vec![b],
        factor: 1.3,
    };
    vec![
        table(
            "ch4.shm",
            "",
            "Over shared memory the star grows as n-1 and the library (single copy) beats your pipeline on 3 and 4 ranks",
            "the star grows as n - 1; the library (single copy) beats the pipeline on 3 and 4 ranks",
            vec![less_by(0, 8, 2.0), less(7, 6), less(11, 10)],
            None,
        ),
        table(
            "ch4.tcp",
            "--transport tcp",
            "Over TCP the star grows as n-1 too, and the library runs a chain in pieces, level with your pipeline",
            "the star grows as n - 1; the library (a chain in pieces) is level with the pipeline",
            vec![less_by(0, 8, 2.0), within(7, 6), within(11, 10)],
            Some("3 and 4 ranks share 2 cores: how they take turns decides the chain and the pipeline"),
        ),
        Claim {
            id: "ch4.noise",
            place: "EXERCISES.md, chapter 4, Look for",
            file: "EXERCISES.md",
            quote: "one broadcast timed alone (`--iters 1`) can take up to three times the mean of 20",
            says: "one run is noise: --iters 1 against the mean of 20",
            measures: vec![
                time(
                    "packed, --iters 1",
                    cmd("sol07-packed-broadcast", "--nproc-per-node 4 --method packed --iters 1"),
                ),
                time(
                    "packed, --iters 20",
                    cmd(
                        "sol07-packed-broadcast",
                        "--nproc-per-node 4 --method packed --iters 20",
                    ),
                ),
            ],
            checks: vec![],
            depends: None,
        },
    ]
}

/// Chapter 5's ring against the library's, chapter 6's figures.
fn chapters5and6() -> Vec<Claim> {
    let perf2 = cmd("07-nccl-perf", "--coll all-reduce -b 4 -e 100M -f 4 --nproc-per-node 2");
    let small = |n: usize| format!("--coll all-reduce -b 4 -e 4 -n 1000 --nproc-per-node {n}");
    let bcast = |n: usize| format!("--coll broadcast -b 1M -e 64M -f 4 --nproc-per-node {n}");
    let bcast2 = "--coll broadcast -b 256K -e 4M -f 4 -n 200 --nproc-per-node 2";
    let modes = |op: &str, n: usize, more: &str| format!("--coll {op} -b 4 -e 4 -n 1000 --nproc-per-node {n} {more}");
    vec![
        Claim {
            id: "ch5.2",
            place: "EXERCISES.md, answer 5.2",
            file: "EXERCISES.md",
            quote: "Both beat the solution's ring, the single copy by two to three times",
            says: "the library's all-reduce (single copy, and its own ring) is faster than the student's ring",
            measures: vec![
                time(
                    "library",
                    cmd("02-nccl-allreduce", "--size 16M --nproc-per-node 4 --iters 20"),
                ),
                time(
                    "library, NCCL_ALGO=Ring",
                    cmd("02-nccl-allreduce", "--size 16M --nproc-per-node 4 --iters 20").env("NCCL_ALGO", "Ring"),
                ),
                time(
                    "ring (solution 5)",
                    cmd("sol05-ring-allreduce", "--size 16M --nproc-per-node 4 --iters 20"),
                ),
            ],
            checks: vec![less(0, 2), less(1, 2)],
            depends: None,
        },
        Claim {
            id: "ch6.1",
            place: "EXERCISES.md, answer 6.1",
            file: "EXERCISES.md",
            quote: "on 2 ranks, α is well under a microsecond on a laptop with a core per rank",
            says: "α under a microsecond on 2 ranks; β about a memcpy",
            measures: vec![
                row("α: 4 B, out of place, p50", perf2.clone(), 4, "/out_of_place/median_us"),
                row("4 B, out of place, mean", perf2.clone(), 4, "/out_of_place/time_us"),
                row("1 KiB", perf2.clone(), 1024, "/out_of_place/time_us"),
                row("16 KiB", perf2.clone(), 16384, "/out_of_place/time_us"),
                Measure {
                    label: "β: the best busbw".into(),
                    cmd: perf2.clone(),
                    stat: Stat::Rows("/out_of_place/busbw"),
                    unit: Unit::GBps,
                },
                Measure {
                    label: "memcpy (the header)".into(),
                    cmd: perf2,
                    stat: Stat::Report("/memcpy_gbps"),
                    unit: Unit::GBps,
                },
            ],
            checks: vec![Check::Below { a: 0, value: 1.0 }, less_by(0, 3, 4.0)],
            depends: Some("two ranks on two free cores spin; a busy machine makes them sleep"),
        },
        Claim {
            id: "ch6.modes",
            place: "EXERCISES.md, 6b",
            file: "EXERCISES.md",
            quote: "Two ranks with a core each spin (`slept 0`), four ranks on two cores take turns, and TCP waits in the kernel",
            says: "2 ranks on 2 free cores spin (slept 0, p50 under a µs); 4 ranks share the cores; TCP waits in the kernel",
            measures: vec![
                row(
                    "all-reduce 4 B, 2 ranks, p50",
                    cmd("07-nccl-perf", &modes("all_reduce", 2, "")),
                    4,
                    "/out_of_place/median_us",
                ),
                row(
                    "all-reduce 4 B, 2 ranks, calls slept",
                    cmd("07-nccl-perf", &modes("all_reduce", 2, "")),
                    4,
                    "/out_of_place/slept",
                ),
                row(
                    "all-reduce 4 B, 2 ranks, mean",
                    cmd("07-nccl-perf", &modes("all_reduce", 2, "")),
                    4,
                    "/out_of_place/time_us",
                ),
                row(
                    "broadcast 4 B, 2 ranks, p50",
                    cmd("07-nccl-perf", &modes("broadcast", 2, "")),
                    4,
                    "/out_of_place/median_us",
                ),
                row(
                    "all-reduce 4 B, 4 ranks, p50",
                    cmd("07-nccl-perf", &modes("all_reduce", 4, "")),
                    4,
                    "/out_of_place/median_us",
                ),
                row(
                    "all-reduce 4 B, 4 ranks, mean",
                    cmd("07-nccl-perf", &modes("all_reduce", 4, "")),
                    4,
                    "/out_of_place/time_us",
                ),
                row(
                    "broadcast 4 B, 4 ranks, mean",
                    cmd("07-nccl-perf", &modes("broadcast", 4, "")),
                    4,
                    "/out_of_place/time_us",
                ),
                row(
                    "all-reduce 4 B, 2 ranks over TCP, mean",
                    cmd("07-nccl-perf", &modes("all_reduce", 2, "--transport tcp")),
                    4,
                    "/out_of_place/time_us",
                ),
            ],
            checks: vec![
                Check::Below { a: 0, value: 1.0 },
                Check::Below { a: 1, value: 0.5 },
                less(0, 4),
                less(0, 7),
            ],
            depends: Some("two ranks spin only where each has a core to itself: a busy machine takes them away"),
        },
        Claim {
            id: "ch6.3",
            place: "EXERCISES.md, answer 6.3",
            file: "EXERCISES.md",
            quote: "The direct exchange beats the ring at 4 B, on 2 ranks (by about 1.5×) and on 4 (2 to 3×)",
            says: "the direct exchange beats the ring at 4 B, on 2 and 4 ranks",
            measures: vec![
                row(
                    "direct, 2 ranks",
                    cmd("07-nccl-perf", &small(2)),
                    4,
                    "/out_of_place/time_us",
                ),
                row(
                    "ring, 2 ranks",
                    cmd("07-nccl-perf", &small(2)).env("NCCL_ALGO", "Ring"),
                    4,
                    "/out_of_place/time_us",
                ),
                row(
                    "direct, 4 ranks",
                    cmd("07-nccl-perf", &small(4)),
                    4,
                    "/out_of_place/time_us",
                ),
                row(
                    "ring, 4 ranks",
                    cmd("07-nccl-perf", &small(4)).env("NCCL_ALGO", "Ring"),
                    4,
                    "/out_of_place/time_us",
                ),
            ],
            checks: vec![less(0, 1), less(2, 3)],
            depends: None,
        },
        Claim {
            id: "ch6.4",
            place: "EXERCISES.md, answer 6.4",
            file: "EXERCISES.md",
            quote: "On 3 ranks the single copy beats the slots from 4 MiB, by 2× or more in place",
            says: "the single copy beats the slots on 3 ranks from 4 MiB",
            measures: vec![
                row(
                    "single copy, 3 ranks, 4 MiB",
                    cmd("07-nccl-perf", &bcast(3)),
                    4 << 20,
                    "/in_place/busbw",
                ),
                row(
                    "slots, 3 ranks, 4 MiB",
                    cmd("07-nccl-perf", &bcast(3)).env("NCCL_P2P_DISABLE", "1"),
                    4 << 20,
                    "/in_place/busbw",
                ),
                row(
                    "single copy, 3 ranks, 16 MiB",
                    cmd("07-nccl-perf", &bcast(3)),
                    16 << 20,
                    "/in_place/busbw",
                ),
                row(
                    "slots, 3 ranks, 16 MiB",
                    cmd("07-nccl-perf", &bcast(3)).env("NCCL_P2P_DISABLE", "1"),
                    16 << 20,
                    "/in_place/busbw",
                ),
                row(
                    "single copy, 2 ranks, 1 MiB",
                    cmd("07-nccl-perf", bcast2),
                    1 << 20,
                    "/in_place/busbw",
                ),
                row(
                    "slots, 2 ranks, 1 MiB",
                    cmd("07-nccl-perf", bcast2).env("NCCL_P2P_DISABLE", "1"),
                    1 << 20,
                    "/in_place/busbw",
                ),
            ],
            // busbw: more is faster.
            checks: vec![less(1, 0), less(3, 2)],
            depends: None,
        },
        Claim {
            id: "ch6.cache",
            place: "EXERCISES.md, 6b",
            file: "EXERCISES.md",
            quote: "each size within 25% of its side's line: β in the core's cache below the shared cache's, and from memory below both",
            says: "three sides, a line each within 25%: β in the core's cache below the shared cache's (the other core holds the lines), from memory below both",
            measures: vec![
                fitted("β in the core's cache", "/fits/0/beta_gbps", Unit::GBps),
                fitted("β in the shared cache", "/fits/1/beta_gbps", Unit::GBps),
                fitted("β from memory", "/fits/2/beta_gbps", Unit::GBps),
                fitted(
                    "worst size off the fit, in the core's cache",
                    "/fits/0/worst_error",
                    Unit::Share,
                ),
                fitted(
                    "worst size off the fit, in the shared cache",
                    "/fits/1/worst_error",
                    Unit::Share,
                ),
                fitted(
                    "worst size off the fit, from memory",
                    "/fits/2/worst_error",
                    Unit::Share,
                ),
            ],
            // β: more is faster.
            checks: vec![
                less(0, 1),
                less(2, 1),
                Check::Below { a: 3, value: 0.25 },
                Check::Below { a: 4, value: 0.25 },
                Check::Below { a: 5, value: 0.25 },
            ],
            depends: Some("the cache a VM shares with other guests, and a busy machine, move the knee and the rows"),
        },
    ]
}

/// A figure of `--fit`'s lines under chapter 6's sweep across the caches (`/fits/0/...`:
/// the sizes in a core's own cache, `/fits/1/...`: those in the shared cache,
/// `/fits/2/...`: those from memory).
fn fitted(label: &str, pointer: &'static str, unit: Unit) -> Measure {
    Measure {
        label: label.into(),
        cmd: cmd("07-nccl-perf", CACHE_SWEEP),
        stat: Stat::Report(pointer),
        unit,
    }
}

/// Chapter 6's sweep across the cache: single-copy from 64 KiB, 2 ranks.
const CACHE_SWEEP: &str = "-b 64K -e 128M -f 2 --fit --nproc-per-node 2";

/// Chapter 7: per-tensor broadcasts against one packed broadcast.
fn chapter7() -> Vec<Claim> {
    let table = |id, transport: &'static str, quote| {
        let mut measures = vec![];
        for h in [8, 32, 128, 256] {
            for method in ["each", "packed"] {
                let args = format!("--nproc-per-node 4 --iters 20 --method {method} --hidden {h} {transport}");
                measures.push(time(
                    format!("{method}, --hidden {h}"),
                    cmd("sol07-packed-broadcast", &args),
                ));
            }
        }
        Claim {
            id,
            place: "EXERCISES.md, answer 7",
            file: "EXERCISES.md",
            quote,
            says: "packed wins at --hidden 8; per tensor wins at 256 on the CPU backend",
            measures,
            checks: vec![less(1, 0), less(6, 7)],
            depends: None,
        }
    };
    let mut shm = table(
        "ch7.shm",
        "",
        "each and packed are level at `--hidden 8` over shared memory, and per tensor wins by far at `--hidden 256`",
    );
    // Over shared memory the two are level at --hidden 8: within 2×, either one ahead
    // (runs gave packed 1.3× slower and 2× faster on the same machine).
    shm.says = "packed level with each at --hidden 8 (within 2×, either ahead); per tensor wins at 256";
    shm.checks[0] = Check::Within {
        a: vec![1],
        b: vec![0],
        factor: 2.0,
    };
    let mut tcp = table(
        "ch7.tcp",
        "--transport tcp",
        "packing wins by tens of times over TCP at `--hidden 8`, and per tensor still wins at `--hidden 256`",
    );
    tcp.says = "packed wins by tens of times at --hidden 8; per tensor wins at 256";
    tcp.checks[0] = less_by(1, 0, 10.0);
    vec![
        shm,
        tcp,
        group("ch7.group.shm", "", GROUP_SHM),
        group("ch7.group.tcp", "--transport tcp", GROUP_TCP),
    ]
}

/// EXERCISES.md 7c's directions: each, group and packed at --hidden 8 and 128, in one run.
const GROUP_SHM: &str = "Over shared memory the group is level with packed at `--hidden 8` and with each at `--hidden 128`, where packed loses";
const GROUP_TCP: &str =
    "over TCP, level with packed at `--hidden 8` (tens of times faster than each) and with each at `--hidden 128`";

/// Chapter 7c: the same broadcasts one by one, in one group, and packed (the CPU
/// backend's group packs them itself: it costs what packing costs).
fn group(id: &'static str, transport: &'static str, quote: &'static str) -> Claim {
    let mut measures = vec![];
    for h in [8, 128] {
        for method in ["each", "group", "packed"] {
            let args = format!("--nproc-per-node 4 --iters 20 --method {method} --hidden {h} {transport}");
            measures.push(time(
                format!("{method}, --hidden {h}"),
                cmd("sol07-packed-broadcast", &args),
            ));
        }
    }
    let tcp = !transport.is_empty();
    Claim {
        id,
        place: "EXERCISES.md, 7c",
        file: "EXERCISES.md",
        quote,
        says: match tcp {
            true => "group level with packed at --hidden 8 (tens of times faster than each); with each at 128",
            false => "group level with packed at --hidden 8; with each at 128, where packed loses",
        },
        measures,
        // 0-2: each, group, packed at --hidden 8; 3-5 at --hidden 128.
        checks: {
            let mut checks = vec![
                Check::Within {
                    a: vec![1],
                    b: vec![2],
                    factor: 1.5,
                },
                Check::Within {
                    a: vec![4],
                    b: vec![3],
                    factor: 1.5,
                },
                less(4, 5),
            ];
            if tcp {
                checks.push(less_by(1, 0, 10.0));
            }
            checks
        },
        depends: None,
    }
}

/// Chapter 8: the reduce-scatter + all-gather pair against the all-reduce; the sharded step.
fn chapter8() -> Vec<Claim> {
    let pair = |id, n: usize, size: &'static str, bytes: u64, quote| {
        let c = |op: &str| {
            cmd(
                "07-nccl-perf",
                &format!("--coll {op} -b {size} -e {size} -n 20 --nproc-per-node {n}"),
            )
        };
        Claim {
            id,
            place: "EXERCISES.md, answer 8.1",
            file: "EXERCISES.md",
            quote,
            says: "all-reduce against reduce-scatter + all-gather (in place)",
            measures: vec![
                row("all-reduce", c("all_reduce"), bytes, "/in_place/time_us"),
                row("reduce-scatter", c("reduce_scatter"), bytes, "/in_place/time_us"),
                row("all-gather", c("all_gather"), bytes, "/in_place/time_us"),
            ],
            checks: vec![Check::Within {
                a: vec![0],
                b: vec![1, 2],
                factor: 1.5,
            }],
            depends: Some("when ranks outnumber cores they take turns, which favours one call or two by chance"),
        }
    };
    vec![
        pair(
            "ch8.1.4ranks",
            4,
            "64M",
            64 << 20,
            "on 4 ranks the pair comes out level with the all-reduce, within the noise",
        ),
        {
            // On 2 ranks with a core each, the pair is level with the all-reduce or ahead of
            // it: no slower than 1.2× the all-reduce, whichever way the caches fall.
            let mut two = pair(
                "ch8.1.2ranks",
                2,
                "64M",
                64 << 20,
                "on 2 ranks the pair comes out level or even ahead",
            );
            two.says = "on 2 ranks the pair no slower than the all-reduce (within 20%) (in place)";
            two.checks = vec![Check::Less {
                a: vec![1, 2],
                b: vec![0],
                by: 1.0 / 1.2,
            }];
            two.depends = None;
            two
        },
        Claim {
            id: "ch8.3",
            place: "EXERCISES.md, answer 8.3",
            file: "EXERCISES.md",
            quote: "the sharded step is slower than the all-reduce on the CPU backend, by a factor of 2 to 4",
            says: "the sharded step is slower than the all-reduce on the CPU backend",
            measures: vec![
                time(
                    "02-nccl-allreduce",
                    cmd("02-nccl-allreduce", "--size 16M --nproc-per-node 4 --iters 20"),
                ),
                time(
                    "sharded step (solution 8)",
                    cmd("sol08-sharded-update", "--size 16M --nproc-per-node 4 --iters 20"),
                ),
            ],
            checks: vec![less(0, 1)],
            depends: None,
        },
    ]
}

/// Chapter 9: one node against two "nodes" of one host.
fn chapter9() -> Vec<Claim> {
    let args = "--coll all_reduce -b 1M -e 64M -f 4";
    let one = cmd("07-nccl-perf", &format!("{args} --nproc-per-node 4"));
    let two = cmd("07-nccl-perf", &format!("{args} --nproc-per-node 2")).nodes(2);
    let avg = |label: &str, c: Cmd| Measure {
        label: label.into(),
        cmd: c,
        stat: Stat::Report("/avg_busbw"),
        unit: Unit::GBps,
    };
    vec![Claim {
        id: "ch9",
        place: "EXERCISES.md, 9c",
        file: "EXERCISES.md",
        quote: "busbw falls by a factor of 4 or so across the two \"nodes\"",
        says: "busbw falls by a factor of 4 or so across two \"nodes\" (2× or more)",
        measures: vec![avg("one node", one), avg("two \"nodes\"", two)],
        checks: vec![less_by(1, 0, 2.0)],
        depends: None,
    }]
}

/// docs/perf.md's "Plots": the picture's runs.
fn perf_section() -> Vec<Claim> {
    let c = |n: usize| {
        cmd(
            "07-nccl-perf",
            &format!("-b 4 -e 64M -f 2 -n 200 -w 20 --nproc-per-node {n}"),
        )
    };
    vec![Claim {
        id: "readme.perf",
        place: "docs/perf.md, Plots",
        file: "docs/perf.md",
        quote: "Two ranks on two cores finish a small all-reduce in 0.15-0.35 µs",
        says: "2 ranks under a µs at 4 B, 4 ranks a few µs; busbw peaks in the caches",
        measures: vec![
            row("4 B, 2 ranks", c(2), 4, "/out_of_place/time_us"),
            row("4 B, 4 ranks", c(4), 4, "/out_of_place/time_us"),
            Measure {
                label: "best busbw, 2 ranks".into(),
                cmd: c(2),
                stat: Stat::Rows("/out_of_place/busbw"),
                unit: Unit::GBps,
            },
            row("64 MiB busbw, 2 ranks", c(2), 64 << 20, "/out_of_place/busbw"),
            Measure {
                label: "best busbw, 4 ranks".into(),
                cmd: c(4),
                stat: Stat::Rows("/out_of_place/busbw"),
                unit: Unit::GBps,
            },
            row("64 MiB busbw, 4 ranks", c(4), 64 << 20, "/out_of_place/busbw"),
        ],
        checks: vec![less(0, 1), less(3, 2)],
        depends: Some("two ranks on two free cores spin; four share them"),
    }]
}

/// Chapter 10: ring against tree on emulated nodes over a simulated network (`--link`).
fn chapter10() -> Vec<Claim> {
    const LINK: &str = "--nproc-per-node 1 --link 50us,10Gbps";
    let perf = |nodes: usize, algo: &'static str, args: &str| {
        cmd("07-nccl-perf", &format!("{LINK} --coll all_reduce {args} -n 20 -w 3"))
            .env("NCCL_ALGO", algo)
            .nodes(nodes)
    };
    let us = "/out_of_place/time_us";
    let mut latency = vec![];
    for n in [2, 4, 8, 16] {
        for algo in ["Ring", "Tree"] {
            latency.push(row(
                format!("1 KiB on {n} nodes, {algo}"),
                perf(n, algo, "-b 1K -e 1K"),
                1024,
                us,
            ));
        }
    }
    let sweep = "-b 16K -e 4M -f 4";
    let crossover = vec![
        row("8 nodes, 16 KiB, Ring", perf(8, "Ring", sweep), 16 << 10, us),
        row("8 nodes, 16 KiB, Tree", perf(8, "Tree", sweep), 16 << 10, us),
        row("8 nodes, 4 MiB, Ring", perf(8, "Ring", sweep), 4 << 20, us),
        row("8 nodes, 4 MiB, Tree", perf(8, "Tree", sweep), 4 << 20, us),
        row("4 nodes, 1 MiB, Ring", perf(4, "Ring", sweep), 1 << 20, us),
        row("4 nodes, 1 MiB, Tree", perf(4, "Tree", sweep), 1 << 20, us),
        row("4 nodes, 4 MiB, Ring", perf(4, "Ring", sweep), 4 << 20, us),
        row("4 nodes, 4 MiB, Tree", perf(4, "Tree", sweep), 4 << 20, us),
    ];
    let slow = |algo: &'static str| {
        cmd(
            "07-nccl-perf",
            "--nproc-per-node 4 --link 50us,1Gbps --coll all_reduce -b 16M -e 16M -n 5 -w 1",
        )
        .env("NCCL_ALGO", algo)
        .nodes(2)
    };
    let busbw = "/out_of_place/busbw";
    let own = |bin: &'static str, size: &str, extra: &str| {
        cmd(bin, &format!("{LINK} --size {size} --iters 20 {extra}")).nodes(8)
    };
    vec![
        Claim {
            id: "ch10.latency",
            place: "EXERCISES.md, answer 10.1",
            file: "EXERCISES.md",
            quote: "from 4 nodes the tree leads, by more as the nodes grow",
            says: "at 1 KiB ring and tree within 2× on 2 nodes; from 4 nodes the tree leads, by more as the nodes grow",
            measures: latency,
            checks: vec![
                Check::Within {
                    a: vec![1],
                    b: vec![0],
                    factor: 2.0,
                },
                less(3, 2),
                less_by(5, 4, 1.5),
                less_by(7, 6, 2.0),
            ],
            depends: Some("a message's cost on emulated nodes is mostly processes waking on this machine's cores"),
        },
        Claim {
            id: "ch10.crossover",
            place: "EXERCISES.md, answer 10.2",
            file: "EXERCISES.md",
            quote: "On 8 nodes the tree leads at 16 KiB by 1.5 times or more and the ring at 4 MiB; on 4 nodes the ring leads at 1 and 4 MiB",
            says: "on 8 nodes the tree leads at 16 KiB by 1.5× or more and the ring at 4 MiB; on 4 nodes the ring leads at 1 and 4 MiB",
            measures: crossover,
            checks: vec![less_by(1, 0, 1.5), less(2, 3), less(4, 5), less(6, 7)],
            depends: None,
        },
        Claim {
            id: "ch10.busbw",
            place: "EXERCISES.md, answer A.1 (appendix)",
            file: "EXERCISES.md",
            quote: "Here neither busbw passes the link's 0.125 GB/s: the ring comes close to it, the tree stays below",
            says: "on 2 nodes of 4 over 1 Gbit/s, neither busbw passes the link's 0.125 GB/s here",
            measures: vec![
                row("2x4 ranks, 16 MiB busbw, Ring", slow("Ring"), 16 << 20, busbw),
                row("2x4 ranks, 16 MiB busbw, Tree", slow("Tree"), 16 << 20, busbw),
                row("2x4 ranks, 16 MiB, Ring", slow("Ring"), 16 << 20, us),
                row("2x4 ranks, 16 MiB, Tree", slow("Tree"), 16 << 20, us),
            ],
            checks: vec![Check::Below { a: 0, value: 0.125 }, Check::Below { a: 1, value: 0.125 }],
            depends: None,
        },
        Claim {
            id: "ch10.exercise",
            place: "EXERCISES.md, answer 10.3",
            file: "EXERCISES.md",
            quote: "the tree beats the ring at 16 KiB and at 1 MiB, and 8 pieces slow it down at 16 KiB",
            says: "the solutions on 8 nodes: the tree beats the ring at 16 KiB and 1 MiB; 8 pieces slow it at 16 KiB",
            measures: vec![
                time("ring, 16 KiB", own("sol05-ring-allreduce", "16K", "")),
                time("tree, 16 KiB", own("sol10-tree-allreduce", "16K", "")),
                time(
                    "tree in 8 pieces, 16 KiB",
                    own("sol10-tree-allreduce", "16K", "--pieces 8"),
                ),
                time("ring, 1 MiB", own("sol05-ring-allreduce", "1M", "")),
                time("tree, 1 MiB", own("sol10-tree-allreduce", "1M", "")),
                time(
                    "tree in 8 pieces, 1 MiB",
                    own("sol10-tree-allreduce", "1M", "--pieces 8"),
                ),
            ],
            checks: vec![less_by(1, 0, 2.0), less(1, 2), less(4, 3)],
            depends: Some("a message's cost on emulated nodes is mostly processes waking on this machine's cores"),
        },
    ]
}

/// EXERCISES.md, chapter 11, "Protocols": the same pipelined ring by LL, LL128 and Simple on 2 ranks.
/// LL at most half of Simple's busbw at 2 MiB, LL128 below Simple, and LL no faster than
/// Simple at 8 B (within 15%: the small sizes move by ±50% from run to run).
fn protocols() -> Vec<Claim> {
    let c = |proto: &str| {
        cmd(
            "07-nccl-perf",
            &format!("--nproc-per-node 2 -b 8 -e 4M -f 4 -A ring -P {proto}"),
        )
    };
    vec![Claim {
        id: "proto",
        place: "EXERCISES.md, chapter 11, Look for",
        file: "EXERCISES.md",
        quote: "at 2 MiB LL falls far below half of Simple's busbw and LL128 below Simple; below 1 KiB the three are level",
        says: "LL under half of Simple's busbw at 2 MiB, LL128 under Simple; LL no faster at 8 B",
        measures: vec![
            row("2 MiB busbw by LL", c("ll"), 2 << 20, "/out_of_place/busbw"),
            row("2 MiB busbw by LL128", c("ll128"), 2 << 20, "/out_of_place/busbw"),
            row("2 MiB busbw by Simple", c("simple"), 2 << 20, "/out_of_place/busbw"),
            row("8 B by LL", c("ll"), 8, "/out_of_place/time_us"),
            row("8 B by Simple", c("simple"), 8, "/out_of_place/time_us"),
        ],
        checks: vec![
            less_by(0, 2, 2.0),
            less(1, 2),
            Check::Less {
                a: vec![4],
                b: vec![3],
                by: 0.87,
            },
        ],
        depends: Some("a CPU's protocols cost its cores' work per byte, not a link's width: other CPUs differ"),
    }]
}

/// EXERCISES.md, chapter 12: exercise 12's hierarchical all-reduce against the flat ring,
/// on 2 emulated nodes of 2 ranks over a simulated network (`bench/hierarchy.sh`).
fn chapter12() -> Vec<Claim> {
    let own = |link: &str, size: &str, which: &str| {
        cmd(
            "sol12-hierarchical-allreduce",
            &format!("--nproc-per-node 2 --link {link} --size {size} --iters 10 --time {which}"),
        )
        .env("NCCL_ALGO", "Ring")
        .nodes(2)
    };
    vec![Claim {
        id: "ch12.hierarchy",
        place: "EXERCISES.md, chapter 12b",
        file: "EXERCISES.md",
        quote: "over 1 Gbit/s the hierarchy takes well under the flat ring's time at 1 and 8 MiB; over 10 Gbit/s it leads at 64 KiB",
        says: "over 1 Gbit/s the hierarchy takes well under the flat ring's time at 1 and 8 MiB; over 10 Gbit/s it leads at 64 KiB",
        measures: vec![
            time("1 Gbit/s, 1 MiB, hierarchical", own("50us,1Gbps", "1M", "hierarchical")),
            time("1 Gbit/s, 1 MiB, flat", own("50us,1Gbps", "1M", "flat")),
            time("1 Gbit/s, 8 MiB, hierarchical", own("50us,1Gbps", "8M", "hierarchical")),
            time("1 Gbit/s, 8 MiB, flat", own("50us,1Gbps", "8M", "flat")),
            time(
                "10 Gbit/s, 64 KiB, hierarchical",
                own("50us,10Gbps", "64K", "hierarchical"),
            ),
            time("10 Gbit/s, 64 KiB, flat", own("50us,10Gbps", "64K", "flat")),
        ],
        checks: vec![less_by(0, 1, 1.5), less_by(2, 3, 1.5), less(4, 5)],
        depends: Some("4 ranks on this machine's cores: the copies inside a node take turns"),
    }]
}

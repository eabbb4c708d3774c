//! The workbook's checker, as rustlings has one: `cargo workbook check 5` builds your
//! code for exercise 5, runs it as real multi-process jobs for every world size and count
//! the exercise demands, and says what is wrong, rank by rank and element by element: a
//! wrong value, a deadlock, a message sent and never received (the end of every job
//! compares each rank's sends with its peers' receives), the rank the others waited on
//! named first.
//! `cargo workbook hint 5` gives a hint (a nudge), `hint 5 --more` the solution in words;
//! `cargo workbook check --all` checks them all.

/// `println!`, except that output to a closed pipe (`cargo workbook check 8 | head -5`)
/// ends the checker quietly, with status 0, rather than with a panic.
macro_rules! println {
    () => {
        workbook_runtime::error::print_line("", workbook_runtime::error::OnClosed::Exit)
    };
    ($($arg:tt)*) => {
        workbook_runtime::error::print_line(&format!($($arg)*), workbook_runtime::error::OnClosed::Exit)
    };
}

mod buckets;
mod exercises;
mod failures;
mod files;
mod job;

use clap::{Parser, Subcommand};
use exercises::{Case, Code, Exercise, Source};
use failures::rank_after;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Checks the exercises of EXERCISES.md: builds your code and runs it as multi-process jobs.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
    /// How long a rank may wait for another before the job fails (the programs' --timeout).
    #[arg(long, global = true, value_name = "TIME", default_value = "10s", value_parser = job_timeout)]
    timeout: std::time::Duration,
    /// Write and read the student's files (exercises/src/bin/) under this folder instead of
    /// the workbook's: for the workbook's own tests, which leave a student's work alone.
    /// Builds are still the workbook's.
    #[arg(long, global = true, hide = true, value_name = "DIR")]
    root: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Lists the exercises, and where the code of each one is.
    List,
    /// Builds an exercise and runs it for every case it must pass.
    Check {
        /// The exercise: its chapter in EXERCISES.md.
        number: Option<u32>,
        /// Check every exercise.
        #[arg(long, conflicts_with = "number")]
        all: bool,
        /// Check the reference solution (solutions/) instead of your code (exercises/).
        #[arg(long)]
        solution: bool,
        /// Check the starting file as shipped (workbook/starting/), which you do not edit: the
        /// workbook's own tests do, so that they pass in a workbook whose exercises are solved.
        #[arg(long, hide = true, conflicts_with = "solution")]
        starting: bool,
        /// Check a program of workbook/fixtures/ (a wrong answer of a known kind), by its
        /// binary's name: for the workbook's own tests.
        #[arg(long, hide = true, value_name = "BIN", conflicts_with_all = ["solution", "starting"])]
        fixture: Option<String>,
        /// Show the exercise's hint when a case fails.
        #[arg(long)]
        hint: bool,
        /// Run every case, even after one has failed.
        #[arg(long)]
        keep_going: bool,
        /// The backend the jobs use: `cpu` (runs anywhere), `nccl` (one GPU per rank) or `auto`.
        #[arg(long, default_value = "cpu", value_parser = ["cpu", "nccl", "auto"])]
        backend: String,
        /// Run the jobs on the NCCL backend with N simulated GPUs (host memory, no GPU
        /// needed): the same NCCL calls as on a GPU node. Worlds larger than N are left out.
        #[arg(long, value_name = "N", conflicts_with = "backend", value_parser = clap::value_parser!(u32).range(2..=64))]
        simulate_gpus: Option<u32>,
        /// The largest world size to run (with NCCL: at most your number of GPUs). Exercises 3 to
        /// 8 run at most 5 ranks; exercise 10 up to 17 (the default on the CPU backend; 5 on NCCL).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..=64))]
        max_world: Option<u32>,
    },
    /// Puts an exercise's file back as shipped, to start it again: your version of it is
    /// replaced (git still has it if you committed it).
    Reset {
        /// The exercise: its chapter in EXERCISES.md.
        number: u32,
    },
    /// Shows the hint of an exercise: a nudge (which step, which peer, what to look at).
    Hint {
        /// The exercise: its chapter in EXERCISES.md.
        number: u32,
        /// The solution in words, rather than a nudge: for when the hint was not enough.
        #[arg(long)]
        more: bool,
    },
}

/// The options of one `check`.
struct Options {
    source: Source,
    hint: bool,
    keep_going: bool,
    backend: String,
    /// `--simulate-gpus N`: the jobs run on N simulated GPUs.
    simulate_gpus: Option<u32>,
    max_world: usize,
    timeout: String,
    /// Where the student's files are (`--root`).
    root: PathBuf,
}

impl Options {
    /// The jobs' backend, as the checker's first line names it.
    fn describe(&self) -> String {
        match self.simulate_gpus {
            Some(n) => format!("nccl backend on {n} simulated GPUs (host memory)"),
            None => format!("{} backend", self.backend),
        }
    }

    /// The flags that pick the jobs' backend.
    fn backend_flags(&self) -> Vec<String> {
        match self.simulate_gpus {
            Some(n) => vec!["--simulate-gpus".into(), n.to_string()],
            None => vec!["--backend".into(), self.backend.clone()],
        }
    }
}

fn main() -> ExitCode {
    let cli: Cli = common::parse_args();
    let all = exercises::all();
    // Where the student's files are: this workbook's, or the tests' own folder.
    let root = cli.root.clone().unwrap_or_else(workspace);
    match cli.command {
        Cmd::List => {
            if let Err(code) = files::write_missing(&all, &root) {
                return code;
            }
            // The widest title sets the column, so that every row's code lines up.
            let width = all.iter().map(|ex| ex.title.chars().count()).max().unwrap_or(0);
            for ex in &all {
                let what = match &ex.code {
                    Some(code) => format!("your code: {}", code.file(&Source::Exercise)),
                    None => "runs and questions, no code to check".into(),
                };
                println!("{:>2}. {:<width$}  {what}", ex.number, ex.title);
            }
            ExitCode::SUCCESS
        }
        Cmd::Reset { number } => match find(&all, number) {
            Ok(ex) => files::reset(ex, &root),
            Err(code) => code,
        },
        Cmd::Hint { number, more } => match find(&all, number) {
            Ok(ex) => {
                if more {
                    println!(
                        "The solution of exercise {} ({}), in words:\n{}",
                        ex.number,
                        ex.title,
                        wrap(ex.more, 90)
                    );
                    if ex.code.is_none() {
                        println!("\nThe answers in full are in EXERCISES.md, folded under each question.");
                    }
                } else {
                    println!("Hint for exercise {} ({}):\n{}", ex.number, ex.title, wrap(ex.hint, 90));
                    println!(
                        "\nStill stuck? `cargo workbook hint {} --more` says the solution in words.",
                        ex.number
                    );
                }
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Cmd::Check {
            number,
            all: every,
            solution,
            starting,
            fixture,
            hint,
            keep_going,
            backend,
            simulate_gpus,
            max_world,
        } => {
            let source = match (solution, starting, fixture) {
                (true, _, _) => Source::Solution,
                (_, true, _) => Source::Starting,
                (_, _, Some(bin)) => Source::Fixture(bin),
                _ => Source::Exercise,
            };
            let mut max_world = max_world.unwrap_or(match (backend.as_str(), simulate_gpus) {
                ("cpu", None) => 17,
                _ => 5,
            });
            // NCCL where it cannot run is refused here, once, not as every case failing
            // (which read as the exercise's fault); where it runs, one rank per GPU.
            if backend == "nccl" {
                use workbook_nccl::device::{BackendChoice, choose, probe};
                let found = probe();
                if let Err(e) = choose(BackendChoice::Nccl, &found) {
                    workbook_runtime::error::say_line(&format!("error: {e:#}"));
                    return ExitCode::from(2);
                }
                max_world = max_world.min(found.gpus.max(1) as u32);
            }
            let opts = Options {
                source,
                hint,
                keep_going,
                backend,
                simulate_gpus,
                // One rank per GPU: NCCL refuses two on one.
                max_world: simulate_gpus.map_or(max_world, |n| n.min(max_world)) as usize,
                timeout: format!("{}ms", cli.timeout.as_millis()),
                root,
            };
            let chosen = match (every, number) {
                (true, _) => None,
                (false, Some(number)) => match find(&all, number) {
                    Ok(ex) => Some(ex),
                    Err(code) => return code,
                },
                (false, None) => {
                    workbook_runtime::error::say_line(
                        "error: say which exercise to check (check 5), or --all (see --help)",
                    );
                    return ExitCode::from(2);
                }
            };
            if opts.source == Source::Exercise
                && let Err(code) = files::write_missing(&all, &opts.root)
            {
                return code;
            }
            match chosen {
                None => check_all(&all, &opts),
                Some(ex) if check(ex, &opts) => ExitCode::SUCCESS,
                Some(_) => ExitCode::FAILURE,
            }
        }
    }
}

/// `--timeout`: a duration of a second or more, which the ranks of a job need to start and
/// meet (less, and every case fails as though the code were wrong).
fn job_timeout(text: &str) -> Result<std::time::Duration, String> {
    let t = workbook_runtime::units::parse_duration(text)?;
    match t < std::time::Duration::from_secs(1) {
        true => Err(format!(
            "{text} is shorter than the ranks of a job need to start and meet: give 1s or more"
        )),
        false => Ok(t),
    }
}

fn find(all: &[Exercise], number: u32) -> Result<&Exercise, ExitCode> {
    all.iter().find(|e| e.number == number).ok_or_else(|| {
        workbook_runtime::error::say_line(&format!(
            "error: there is no exercise {number}: the exercises are 1 to {} (see `list`)",
            all.len()
        ));
        ExitCode::from(2)
    })
}

fn check_all(all: &[Exercise], opts: &Options) -> ExitCode {
    let (mut done, mut not_yet) = (Vec::new(), Vec::new());
    for ex in all.iter().filter(|e| e.code.is_some()) {
        if check(ex, opts) {
            done.push(ex.number.to_string());
        } else {
            not_yet.push(ex.number.to_string());
        }
        println!();
    }
    println!(
        "{} of {} exercises pass{}{}",
        done.len(),
        done.len() + not_yet.len(),
        if done.is_empty() {
            String::new()
        } else {
            format!(": {}", done.join(", "))
        },
        if not_yet.is_empty() {
            String::new()
        } else {
            format!("; not yet: {}", not_yet.join(", "))
        },
    );
    if not_yet.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Builds and checks one exercise; says whether every case passed.
fn check(ex: &Exercise, opts: &Options) -> bool {
    let Some(code) = &ex.code else {
        println!(
            "Exercise {} ({}) asks you to run the examples and answer questions: there is no code to \
             check. See EXERCISES.md, chapter {}.",
            ex.number, ex.title, ex.number
        );
        return true;
    };
    let file = code.file(&opts.source);
    let folder = match opts.source {
        Source::Solution => file.trim_end_matches("/src/main.rs").to_string(),
        _ => file.clone(),
    };
    let (package, bin) = code.target(&opts.source);
    let exe = match build(&package, &bin) {
        Ok(exe) => exe,
        Err(why) => {
            println!("Exercise {} ({}): {folder} {why}", ex.number, ex.title);
            return false;
        }
    };
    let cases = (code.cases)(opts.max_world);
    println!(
        "Exercise {} ({}): {folder}, {} runs on the {}",
        ex.number,
        ex.title,
        cases.len(),
        opts.describe()
    );
    let own = code.folder(&opts.source);
    let mut failed = 0;
    for case in &cases {
        match run_case(&exe, case, opts, &own) {
            Ok(()) => println!("  ok      {}", case.label()),
            Err(lines) => {
                failed += 1;
                println!("  FAILED  {}", case.label());
                for line in lines {
                    println!("          {line}");
                }
                println!("          run it yourself: {}", by_hand(code, opts, case));
                if !opts.keep_going {
                    break;
                }
            }
        }
    }
    if failed == 0 {
        println!("Exercise {} passes: every case is right.", ex.number);
        return true;
    }
    if opts.source == Source::Solution {
        println!(
            "The reference solution of exercise {} FAILS: this is a bug in the workbook.",
            ex.number
        );
    } else {
        let todo_left = match std::fs::read_to_string(opts.root.join(&file)) {
            Ok(text) => text.contains("TODO"),
            Err(_) => true,
        };
        match todo_left {
            true => println!("Exercise {} is not done yet: look for TODO in {file}.", ex.number),
            false => println!(
                "Exercise {} is not right yet: no TODO is left in {file}, so compare what it does with the case \
                 above (run it yourself, with --show 16 to see more elements).",
                ex.number
            ),
        }
        if opts.hint {
            println!("Hint: {}", wrap(ex.hint, 90).replace('\n', "\n      "));
            println!(
                "Still stuck? `cargo workbook hint {} --more` says the solution in words.",
                ex.number
            );
        } else {
            println!("Stuck? `cargo workbook hint {}` gives a hint.", ex.number);
        }
    }
    false
}

/// The workspace this checker belongs to.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

/// Builds `package` as this checker was built (release or debug) and finds `bin`; cargo
/// prints its progress and any compiler errors itself.
fn build(package: &str, bin: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "--message-format=json-render-diagnostics",
        "-p",
        package,
        "--bin",
        bin,
    ]);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let out = cmd
        .current_dir(workspace())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not be built: cargo did not start ({e})"))?;
    if !out.status.success() {
        return Err("does not compile: cargo's messages are above".into());
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| format!("was built, but cargo named no binary {bin}"))
}

/// Runs one case as a multi-process job and compares what it printed with what the
/// exercise demands; the error is what a person should read, line by line. `own` is the
/// folder of the code checked, from the workspace's root: a panic there is the student's.
fn run_case(exe: &Path, case: &Case, opts: &Options, own: &str) -> Result<(), Vec<String>> {
    let world = case.world.to_string();
    let backend = opts.backend_flags();
    let mut args = vec![
        "--nproc-per-node",
        &world,
        &backend[0],
        &backend[1],
        "--format",
        "json",
        "--timeout",
        &opts.timeout,
    ];
    args.extend(case.args.iter().map(String::as_str));
    let exe = exe.to_string_lossy();
    let mut cmd = testkit::command(&exe, &args);
    // Each failed rank writes what it was doing as data, which the checker reads.
    cmd.env(failures::ENV, "1");
    let run = match job::run(cmd, testkit::LIMIT) {
        Ok(run) => run,
        Err(why) => return Err(vec![format!("the job did not run: {why}")]),
    };
    let records = failures::records(&run.stderr.text);
    let stderr: String = failures::for_people(&run.stderr.text)
        .map(|l| format!("{l}\n"))
        .collect();
    if !run.in_time {
        return Err(vec![format!(
            "the job had not ended after {:?} and was stopped: a rank waits for something that never comes",
            testkit::LIMIT
        )]);
    }
    let errors = failures::awaited_first(stderr.lines().filter(|l| l.starts_with("error:")), &records);
    let errors: Vec<String> = panics_first(errors, &stderr, own).into_iter().take(6).collect();
    // What the checker could not read whole, or to its end: each fails the case.
    let mut bounds = Vec::new();
    if run.stdout.cut() {
        bounds.push(format!(
            "stdout was cut at {} MiB: the program wrote {} there, where the checker reads one JSON document \
             (--format json)",
            job::OUTPUT_MAX >> 20,
            human_bytes(run.stdout.written)
        ));
    }
    if !run.closed {
        bounds.push(
            "the job's output was still open after its processes were killed: a process it started outside its \
             process group (setsid) holds stdout or stderr, and the checker read no further"
                .into(),
        );
    }
    let Ok(report) = serde_json::from_str::<serde_json::Value>(&run.stdout.text) else {
        let mut lines = unreadable(&run.stdout.text);
        lines.extend(bounds);
        if run.code != Some(0) || lines.is_empty() {
            lines.push(format!("the job failed ({}), saying:", exit_text(run.code)));
            let said = lines.len();
            if errors.is_empty() {
                lines.extend(stderr.lines().take(6).map(|l| cut(l, LINE_MAX)));
            } else {
                lines.extend(errors);
            }
            if lines.len() == said {
                lines.push(
                    "nothing: no error, and no report on stdout (the checker reads one JSON document there)".into(),
                );
            }
        }
        lines.extend(failures::deadlock(&records));
        lines.extend(failures::unreceived(&records));
        lines.extend(stderr_cut(&run));
        return Err(lines);
    };
    let mut lines = compare(&report, case);
    if let Some(also) = &case.also {
        lines.extend(also(&report));
    }
    let check_ok = report["check"]["ok"] == true;
    if !check_ok {
        let own = errors
            .iter()
            .find_map(|l| {
                l.split_once("check FAILED")
                    .map(|(_, rest)| format!("check FAILED{rest}"))
            })
            .unwrap_or_else(|| "the program did not check its result".into());
        lines.push(format!("the program's own check of every element: {own}"));
    } else if run.code != Some(0) {
        lines.push(format!("the job failed ({}), saying:", exit_text(run.code)));
        lines.extend(errors);
        lines.extend(failures::deadlock(&records));
        lines.extend(failures::unreceived(&records));
    }
    lines.extend(bounds);
    if lines.is_empty() {
        return Ok(());
    }
    lines.extend(stderr_cut(&run));
    Err(lines)
}

/// When the job wrote more on stderr than the checker keeps: the line that says the errors
/// shown are from its start only.
fn stderr_cut(run: &job::Job) -> Option<String> {
    run.stderr.cut().then(|| {
        format!(
            "stderr was cut at {} MiB (the program wrote {} there): what is said above is from its start",
            job::OUTPUT_MAX >> 20,
            human_bytes(run.stderr.written)
        )
    })
}

/// "512.0 MiB": a count of bytes as the checker says it.
fn human_bytes(bytes: u64) -> String {
    workbook_runtime::units::human_bytes(usize::try_from(bytes).unwrap_or(usize::MAX))
}

/// The longest line of a program's own output the checker shows, in characters.
const LINE_MAX: usize = 160;

/// `line`, cut to `max` characters, saying how many more there were.
fn cut(line: &str, max: usize) -> String {
    let n = line.chars().count();
    match n > max {
        true => format!(
            "{}… ({} more characters)",
            line.chars().take(max).collect::<String>(),
            n - max
        ),
        false => line.to_string(),
    }
}

/// When stdout holds more than the program's JSON report (a `println!` left in, megabytes
/// of output): the words that say so, with the first line the checker cannot read, cut
/// to [`LINE_MAX`]. Nothing when stdout is empty or only cut short (a rank that failed).
fn unreadable(stdout: &str) -> Vec<String> {
    if stdout.trim().is_empty() {
        return Vec::new();
    }
    let Err(e) = serde_json::from_str::<serde_json::Value>(stdout) else {
        return Vec::new();
    };
    if e.is_eof() {
        return Vec::new(); // a report cut short: the job's own errors say why
    }
    let at = e.line().max(1);
    let Some(line) = stdout.lines().nth(at - 1) else {
        return Vec::new();
    };
    let lines = stdout.lines().count();
    vec![
        format!(
            "the program printed lines the checker cannot read (it reads one JSON document on stdout, --format json); \
             the first, line {at} of {lines}:"
        ),
        format!("  {}", cut(line, LINE_MAX)),
        "print to stderr (eprintln!) what you want to see while you work, or remove the println!".into(),
    ]
}

/// The start of the line common's panic hook prints for a panic in the harness's code in
/// a process that is no rank (a launcher); a rank's adds `rank R: ` after `error: `.
const PANIC_LINE: &str = "error: internal error (a bug in the workbook, please report it)";

/// A panic, as common's panic hook says it: `error: [rank R: ]internal error (a bug in the
/// workbook, please report it) at FILE:LINE: MSG` (in the harness's crates) or `error:
/// [rank R: ]panicked at FILE:LINE: MSG` (anywhere else).
#[derive(Debug, PartialEq)]
struct Panic<'a> {
    rank: Option<usize>,
    at: Option<&'a str>,
    what: &'a str,
}

/// `line` read as a panic, if it is one.
fn panic_of(line: &str) -> Option<Panic<'_>> {
    let said = line.strip_prefix("error: ")?;
    let named = said
        .strip_prefix("rank ")
        .and_then(|r| r.split_once(": "))
        .and_then(|(r, after)| Some((r.parse::<usize>().ok()?, after)));
    let (rank, said) = match named {
        Some((r, after)) => (Some(r), after),
        None => (None, said),
    };
    let after = said.strip_prefix(&PANIC_LINE["error: ".len()..]).or_else(|| {
        said.strip_prefix("panicked")
            .filter(|a| a.starts_with(" at ") || a.starts_with(": "))
    })?;
    // " at FILE:LINE: MESSAGE", or ": MESSAGE" without a location.
    let (at, what) = match after.strip_prefix(" at ").and_then(|a| a.split_once(": ")) {
        Some((at, what)) => (Some(at), what),
        None => (None, after.strip_prefix(": ").unwrap_or(after)),
    };
    Some(Panic { rank, at, what })
}

/// The ranks' error lines with each panic first: a panic in the code checked (its file is
/// in `own`) said as the student's, with the rank that panicked (its own line names it;
/// else, for a single panic, the launcher's line, which names the rank that failed first),
/// its file and line and its message; a panic elsewhere is said as the program said it,
/// with its rank.
fn panics_first(errors: Vec<String>, stderr: &str, own: &str) -> Vec<String> {
    let panics = errors.iter().filter(|l| panic_of(l).is_some()).count();
    // One panic and the rank that failed first: that rank's.
    let failed_first = match panics {
        1 => stderr.lines().find_map(|l| rank_after(l, "launcher: rank ")),
        _ => None,
    };
    let (mut first, mut rest) = (vec![], vec![]);
    for line in errors {
        let Some(panic) = panic_of(&line) else {
            rest.push(line);
            continue;
        };
        let rank = panic.rank.or(failed_first);
        let who = rank.map_or("a rank".to_string(), |r| format!("rank {r}"));
        first.push(match panic.at {
            Some(at) if at.starts_with(own) => format!(
                "error: {who} panicked at {at}: {} (a panic in the code checked, not in the workbook)",
                panic.what
            ),
            _ => match (panic.rank, rank) {
                (None, Some(r)) => line.replacen("error: ", &format!("error: rank {r}: "), 1),
                _ => line,
            },
        });
    }
    first.extend(rest);
    first
}

/// The shown elements of every rank at the case's stage, against what they must be: every
/// rank's row, in rank order, with as many elements as the case checks ([`Case::shown`]),
/// so that a report which lacks some (`"after": []`) fails, whatever the rest says.
fn compare(report: &serde_json::Value, case: &Case) -> Vec<String> {
    let Some(ranks) = report["ranks"].as_array() else {
        return vec!["the report has no ranks".into()];
    };
    let mut lines = Vec::new();
    if ranks.len() != case.world {
        lines.push(format!("{} ranks reported instead of {}", ranks.len(), case.world));
    }
    for (rank, r) in ranks.iter().enumerate() {
        let says = r["rank"].as_u64();
        if says != Some(rank as u64) {
            let whose = says.map_or("names no rank".to_string(), |r| format!("is rank {r}'s"));
            lines.push(format!(
                "the report's row {rank} {whose}, where rank {rank}'s must be: every rank reports once, in order \
                 (was main changed?)"
            ));
            continue;
        }
        let Some(row) = r[case.stage].as_array() else {
            lines.push(format!(
                "rank {rank} shows no '{}' table (was main changed?)",
                case.stage
            ));
            continue;
        };
        if row.len() != case.shown {
            lines.push(format!(
                "rank {rank}: its '{}' row has {} elements instead of the {} the case checks (was main changed?)",
                case.stage,
                row.len(),
                case.shown
            ));
        }
        let wrong: Vec<(usize, f64, f64)> = row
            .iter()
            .enumerate()
            .map(|(i, v)| (i, v.as_f64().unwrap_or(f64::NAN), (case.expect)(rank, i)))
            .filter(|(_, got, want)| !close(*got, *want))
            .collect();
        if let Some((i, got, want)) = wrong.first() {
            let of = if wrong.len() > 1 {
                format!(" ({} of the {} elements shown are wrong)", wrong.len(), row.len())
            } else {
                String::new()
            };
            lines.push(format!(
                "rank {rank}: element {i} is {} instead of {}{of}",
                num(*got),
                num(*want)
            ));
        }
    }
    lines
}

/// The command that runs `case` by hand, to see the tables.
fn by_hand(code: &Code, opts: &Options, case: &Case) -> String {
    let (_, bin) = code.target(&opts.source);
    let release = if cfg!(debug_assertions) { "" } else { " --release" };
    // With the checker's own deadline: a deadlocked exercise run by hand then says so in
    // seconds, not after the programs' default minute.
    let ms: u128 = opts.timeout.trim_end_matches("ms").parse().unwrap_or(10_000);
    let timeout = match ms % 1000 {
        0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    };
    let mut flags = vec![
        format!("--nproc-per-node {}", case.world),
        format!("--timeout {timeout}"),
    ];
    if opts.simulate_gpus.is_some() || opts.backend != "cpu" {
        flags.push(opts.backend_flags().join(" "));
    }
    let own = case.label();
    let own = own.split_once(", ").map_or("", |(_, rest)| rest);
    format!("cargo run{release} --bin {bin} -- {} {own}", flags.join(" "))
}

/// Equal, allowing for rounding in f32 (as the programs' own checks do); NaN never is.
fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-5 * want.abs().max(1.0)
}

fn exit_text(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit status {c}"),
        None => "killed by a signal".into(),
    }
}

/// A number as the tables show it: `42`, `1.5`.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// `text` cut into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = 0;
    for word in text.split_whitespace() {
        if line > 0 && line + 1 + word.len() > width {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += word.len();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_the_students_in_their_folder_and_the_workbooks_elsewhere() {
        let said = |at: &str| {
            let stderr = format!(
                "{PANIC_LINE} at {at}: boom\nerror: rank 0: rank 1 failed first (its connection closed)\n\
                 launcher: rank 1 failed first (exit status 1)\n"
            );
            let errors = stderr
                .lines()
                .filter(|l| l.starts_with("error:"))
                .map(String::from)
                .collect();
            panics_first(errors, &stderr, "exercises/src/bin/ex03-average.rs")
        };
        let theirs = said("exercises/src/bin/ex03-average.rs:30");
        assert_eq!(
            theirs[0],
            "error: rank 1 panicked at exercises/src/bin/ex03-average.rs:30: boom (a panic in the code checked, not in \
             the workbook)"
        );
        assert!(theirs[1].starts_with("error: rank 0: "));
        let ours = said("common/src/session.rs:12");
        assert_eq!(
            ours[0],
            format!("error: rank 1: {} at common/src/session.rs:12: boom", &PANIC_LINE[7..])
        );
        // Two panics: which rank printed which is not known.
        let two = format!("{PANIC_LINE} at exercises/src/bin/ex03-average.rs:30: a\n{PANIC_LINE}: b\n");
        let errors = two.lines().map(String::from).collect();
        let both = panics_first(errors, &two, "exercises/src/bin/ex03-average.rs");
        assert!(both[0].starts_with("error: a rank panicked at exercises/src/bin/ex03-average.rs:30: a"));
        assert_eq!(both[1], format!("{PANIC_LINE}: b"));
    }

    #[test]
    fn a_report_that_lacks_an_element_the_case_checks_fails_it() {
        // 2 ranks, 3 elements each, every one equal to 10 × rank + i.
        let case = Case::new(2, &["--count", "3"], "after", 3, |rank, i| (10 * rank + i) as f64);
        let report = |ranks: serde_json::Value| serde_json::json!({ "ranks": ranks, "check": { "ok": true } });
        let right = serde_json::json!([{ "rank": 0, "after": [0, 1, 2] }, { "rank": 1, "after": [10, 11, 12] }]);
        assert_eq!(compare(&report(right), &case), Vec::<String>::new());
        for (ranks, says) in [
            (
                serde_json::json!([{ "rank": 0, "after": [] }, { "rank": 1, "after": [] }]),
                vec![
                    "rank 0: its 'after' row has 0 elements instead of the 3 the case checks (was main changed?)",
                    "rank 1: its 'after' row has 0 elements instead of the 3 the case checks (was main changed?)",
                ],
            ),
            (
                serde_json::json!([{ "rank": 0, "after": [0, 1] }, { "rank": 1, "after": [10, 11, 12, 13] }]),
                vec![
                    "rank 0: its 'after' row has 2 elements instead of the 3 the case checks (was main changed?)",
                    "rank 1: its 'after' row has 4 elements instead of the 3 the case checks (was main changed?)",
                ],
            ),
            (
                serde_json::json!([{ "rank": 0, "after": [0, 1, 2] }]),
                vec!["1 ranks reported instead of 2"],
            ),
            (
                serde_json::json!([{ "rank": 1, "after": [10, 11, 12] }, { "after": [10, 11, 12] }]),
                vec![
                    "the report's row 0 is rank 1's, where rank 0's must be: every rank reports once, in order (was \
                     main changed?)",
                    "the report's row 1 names no rank, where rank 1's must be: every rank reports once, in order (was \
                     main changed?)",
                ],
            ),
            (
                serde_json::json!([{ "rank": 0, "after": [0, 1, 2] }, { "rank": 1 }]),
                vec!["rank 1 shows no 'after' table (was main changed?)"],
            ),
        ] {
            assert_eq!(compare(&report(ranks.clone()), &case), says, "{ranks}");
        }
        assert_eq!(compare(&serde_json::json!({}), &case), ["the report has no ranks"]);
    }

    #[test]
    fn a_panic_that_names_its_rank_is_read_as_such() {
        // What common's hook prints on a rank: the rank in the line itself.
        let stderr = "error: rank 0: rank 1 failed first (its connection closed)\n\
                      error: rank 2: panicked at exercises/src/bin/ex03-average.rs:30: boom: really\n\
                      error: rank 1: internal error (a bug in the workbook, please report it) at common/src/x.rs:9: oops\n\
                      error: rank 3: panicked at 02-nccl-allreduce/src/main.rs:4: theirs\n\
                      launcher: rank 1 failed first (exit status 101)\n";
        let errors = stderr
            .lines()
            .filter(|l| l.starts_with("error:"))
            .map(String::from)
            .collect();
        let said = panics_first(errors, stderr, "exercises/src/bin/ex03-average.rs");
        assert_eq!(
            said,
            [
                "error: rank 2 panicked at exercises/src/bin/ex03-average.rs:30: boom: really (a panic in the code \
                 checked, not in the workbook)",
                "error: rank 1: internal error (a bug in the workbook, please report it) at common/src/x.rs:9: oops",
                "error: rank 3: panicked at 02-nccl-allreduce/src/main.rs:4: theirs",
                "error: rank 0: rank 1 failed first (its connection closed)",
            ]
        );
        assert_eq!(
            panic_of("error: panicked: x"),
            Some(Panic {
                rank: None,
                at: None,
                what: "x"
            })
        );
        for not in [
            "error: rank 1: rank 0 panicked first",
            "error: rank 1: panickedly",
            "error: check FAILED",
            "error: rank x: panicked at a.rs:1: b",
        ] {
            assert_eq!(panic_of(not), None, "{not}");
        }
    }
}

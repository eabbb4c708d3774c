//! The workbook's harness as a lesson sees it, shared by every example (as nccl-tests'
//! `common.cu` is): the session, buffers, the collectives and their algorithms, tables,
//! checks, timing, `--steps` and `--trace`.
//!
//! An example is a lesson: it parses its [`args`], hands a closure to [`main`], and in
//! it uses the [`Session`] to make buffers, show them, run one collective and check it.
//! Beneath, by layer: `workbook-cpu` and `workbook-nccl` (the backends' communicators),
//! and `workbook-runtime` (launching, the store, errors); CONTRIBUTING.md's "How the code is
//! organised" draws them.

pub mod args;
pub mod backend;
pub mod collective;
pub mod communicator;
pub mod compute;
mod drawing;
pub mod grid;
pub mod meeting;
pub mod output_file;
pub mod report;
pub mod session;
pub mod steps;
pub mod table;
pub mod trace;

use workbook_cpu::transport;
use workbook_nccl::{device, nccl_library, simulate};
use workbook_runtime::{error, launch, launcher, limits, rank, units};

pub use args::{DataArgs, Init, RunArgs};
pub use backend::Buffer;
pub use communicator::Communicator;
pub use session::{Group, SPLIT_NOCOLOR, Session, Split, Stream, Work};
pub use workbook_runtime::element::{DataType, Element, ReduceOp};
/// Vectors made without aborting: a refused allocation is an error of one line.
pub use workbook_runtime::limits::{try_collect, try_vec};

use anyhow::Result;
use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;

/// Parses the command line; a mistake prints one line (`error: ...`) and exits with 2.
pub fn parse_args<A: Parser>() -> A {
    match A::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => e.exit(), // --help and --version
        Err(e) => {
            // clap's message runs until the first blank line; say it on one line.
            let text = e.render().to_string();
            let said: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            error::say_line(&format!("{} (see --help)", said.join(" ")));
            std::process::exit(error::EXIT_USAGE as i32);
        }
    }
}

/// Runs `lesson` as every rank of the job this process belongs to.
///
/// If nothing says which rank this process is, it becomes the launcher and starts the
/// ranks (copies of itself) instead. Errors end as one line on stderr that names the
/// rank, and an exit status: 2 for bad input, 1 for failures at run time.
pub fn main(run: &RunArgs, lesson: impl FnOnce(&mut Session) -> Result<()>) -> ExitCode {
    start(run, |id, run| {
        Session::init(id, run).and_then(|mut s| match lesson(&mut s) {
            Ok(()) => s.finish(),
            // No goodbye: the others see this rank as gone, and fail at once. The
            // communicator learns why first: if NCCL's abort hangs, its last line says so.
            Err(e) => {
                let e = s.explain(e);
                s.communicator().abandon(&e);
                Err(e)
            }
        })
    })
}

/// Runs `lesson` as every rank of the job, with only the launch and the rendezvous done
/// by the harness: for a lesson that makes its own NCCL calls (it needs NCCL: a GPU, or
/// `--simulate-gpus`). Errors end as [`main`]'s do.
pub fn meet(run: &RunArgs, lesson: impl FnOnce(&mut meeting::Meeting) -> Result<()>) -> ExitCode {
    // Before anything loads NCCL or starts a thread: NCCL itself reports the lesson's calls.
    meeting::show_nccl_calls(run);
    let mut run = run.clone();
    if run.backend == args::BackendChoice::Cpu {
        error::say_line("error: --backend cpu: this lesson calls NCCL itself (see --help)");
        return ExitCode::from(error::EXIT_USAGE);
    }
    // This lesson is NCCL or nothing: the launcher's probe then says what is missing.
    run.backend = args::BackendChoice::Nccl;
    start(&run, |id, run| meeting::run(id, run, lesson))
}

/// What [`main`] and [`meet`] share: the libraries, the role, the clean-up.
fn start(run: &RunArgs, rank: impl FnOnce(launch::Identity, &RunArgs) -> Result<()>) -> ExitCode {
    quiet_panics();
    set_color(run);
    launch::raise_open_files_limit();
    let mut run = run.clone();
    // Both may restart this process, once, with the libraries they found on its path.
    let loadable = match run.simulate_gpus {
        Some(gpus) => {
            run.backend = args::BackendChoice::Nccl;
            simulate::start(gpus)
        }
        None if run.backend != args::BackendChoice::Cpu => nccl_library::make_loadable(),
        None => Ok(()),
    };
    if let Err(e) = loadable {
        return fail(None, &e);
    }
    // What jobs killed before this one left of the NCCL backend (the simulator's memory in
    // /dev/shm, library links in /tmp): only the files of processes that are gone. After
    // the restarts above, so that it runs once per process.
    workbook_nccl::leftovers::remove_dead_files();
    let code = run_role(&run, rank);
    // A rank whose launcher died while it ran: nobody else removes what it made.
    if workbook_runtime::signals::orphaned() {
        error::run_clean_ups();
    }
    nccl_library::clean_up();
    simulate::clean_up();
    code
}

fn run_role(run: &RunArgs, rank_part: impl FnOnce(launch::Identity, &RunArgs) -> Result<()>) -> ExitCode {
    let role = match launch::resolve(&run.launch(), &|name| std::env::var(name).ok()) {
        Ok(role) => role,
        Err(e) => return fail(None, &e),
    };
    // `--trace FILE` is checked where it will be written (rank 0's host), before anything starts.
    let (here, who) = match &role {
        launch::Role::Launcher(_) => (run.node_rank == 0, None),
        launch::Role::Rank(id) => (id.rank == 0, Some(id.rank)),
    };
    if let Some(rank) = who {
        let _ = RANK.set(rank);
    }
    if let Err(e) = check_trace(run, here) {
        return fail(who, &e);
    }
    match role {
        launch::Role::Launcher(plan) => match launch_ranks(run, &plan) {
            Ok(code) => ExitCode::from(code),
            Err(e) => fail(None, &e),
        },
        launch::Role::Rank(id) => {
            // A rank on NCCL asks NCCL for its own account of what it chose (before NCCL
            // loads, while this is the process's one thread; a launcher asks for nothing).
            if run.backend != args::BackendChoice::Cpu {
                workbook_nccl::nccl_log::capture();
                workbook_nccl::per_sweep::prepare(&run.nccl_env_per_sweep);
            }
            // Told to stop (its launcher died, Ctrl-C, scancel), the rank removes what it
            // and its simulated GPUs made, and what its peers killed outright left.
            workbook_runtime::signals::clean_up_on_termination();
            error::clean_up_at_exit(workbook_nccl::leftovers::leave);
            let (rank, source) = (id.rank, id.source);
            // Said before the rank runs out of descriptors (a launcher said it already).
            let short = limits::open_files_short(id.world_size, rank == 0).map(|line| {
                anyhow::Error::new(error::SharedError {
                    message: line,
                    usage: true,
                })
            });
            match short.map_or_else(|| rank_part(id, run), Err) {
                Ok(()) => ExitCode::SUCCESS,
                // An error every rank meets alike is said once, by rank 0.
                Err(e) if error::is_shared(&e) && rank != 0 && source.shared_output() => {
                    ExitCode::from(error::exit_code(&e))
                }
                Err(e) => fail(Some(rank), &e),
            }
        }
    }
}

/// `--trace FILE` and `--draw FILE.svg`, if `here` is where they will be written: their
/// folders must be there.
fn check_trace(run: &RunArgs, here: bool) -> Result<()> {
    if let Some(path) = &run.draw {
        if path.extension().is_none_or(|e| e != "svg" && e != "html") {
            return Err(error::usage(format!(
                "--draw {}: name a file ending in .svg (the picture) or .html (a page that steps through it)",
                path.display()
            )));
        }
        if here {
            output_file::check(path, "a picture")
                .map_err(|why| error::usage(format!("--draw {}: {why}", path.display())))?;
        }
    }
    match &run.trace {
        Some(path) if here => trace::check_path(path),
        _ => Ok(()),
    }
}

/// The launcher's part: how many ranks this node runs, then start and watch them.
fn launch_ranks(run: &RunArgs, plan: &launch::Plan) -> Result<u8> {
    // The backend the ranks will pick, as they will pick it (probed once).
    let probe = (run.backend != args::BackendChoice::Cpu).then(device::probe);
    let kind = match &probe {
        None => Ok(device::Kind::Cpu),
        Some(p) => device::choose(run.backend, p).map(|(kind, _)| kind),
    };
    let cpu = matches!(kind, Ok(device::Kind::Cpu));
    let nproc = match (plan.nproc_per_node, kind) {
        // NCCL asked for where it cannot run: said once, here, rather than by every rank.
        (_, Err(e)) => return Err(e),
        (Some(n), _) => n,
        // Like torchrun on a GPU node: one rank per GPU, when NCCL is what will run.
        (None, Ok(device::Kind::Nccl)) => probe.map_or(0, |p| p.gpus),
        (None, Ok(device::Kind::Cpu)) => 2,
    };
    let what = format!("--nproc-per-node {nproc} × --nnodes {} =", plan.nnodes);
    rank::check_world(nproc.saturating_mul(plan.nnodes), &what).map_err(error::usage)?;
    // Its ranks inherit this process's limit of open files, raised to the hard one.
    if let Some(line) = limits::open_files_short(nproc.saturating_mul(plan.nnodes), plan.node_rank == 0) {
        return Err(error::usage(line));
    }
    if cpu {
        fits_in_shared_memory(run, nproc)?;
    }
    // Once the ranks have ended, whatever of theirs is left: the CPU backend's channel files,
    // the simulator's meeting folders.
    let left_by = |pids: &[u32]| {
        transport::shm::remove_files_of(pids);
        workbook_nccl::leftovers::remove_files_of(pids);
    };
    launcher::run(plan, nproc, run.timeout, &[], &left_by)
}

/// Refuses, before starting anything, more CPU-backend ranks on this host than `/dev/shm`
/// can hold the channels of: a pair connects on first use, so this counts the two
/// channels per rank (about 4 MiB each) of rings both ways, what every job of that size
/// takes at least ([`transport::shm::bytes_for`]).
fn fits_in_shared_memory(run: &RunArgs, nproc: usize) -> Result<()> {
    if run.transport == args::TransportChoice::Tcp {
        return Ok(());
    }
    let need = transport::shm::bytes_for(nproc);
    match transport::shm::space() {
        Some((free, total)) if need > free => Err(error::usage(format!(
            "{nproc} ranks on this host would need {} of /dev/shm for their rings' shared-memory channels, and it has {} \
             free (of {}): start fewer ranks per host (--nproc-per-node), or use --transport tcp",
            units::human_bytes(need as usize),
            units::human_bytes(free as usize),
            units::human_bytes(total as usize)
        ))),
        _ => Ok(()),
    }
}

fn fail(rank: Option<usize>, e: &anyhow::Error) -> ExitCode {
    error::say_line(&error::line(rank, e));
    // For programs that asked (the exercises' checker): what the rank was doing, as data.
    if let Some(rank) = rank {
        workbook_runtime::failure::say(rank, BACKEND.get().copied().unwrap_or(""), e);
    }
    ExitCode::from(error::exit_code(e))
}

/// This rank's backend (`cpu`, `nccl`), once chosen: what its failure record names.
pub(crate) static BACKEND: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Colour only on a terminal, never with NO_COLOR set, unless --color says otherwise.
fn set_color(run: &RunArgs) {
    let on = match run.color {
        args::ColorChoice::Always => true,
        args::ColorChoice::Never => false,
        args::ColorChoice::Auto => {
            std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
    };
    colored::control::set_override(on && run.format == args::Format::Text);
}

/// This process's rank, once its role is known (a launcher has none): what a panic names.
static RANK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// A panic in one line, without a backtrace, naming the rank: a bug in the workbook when
/// it happened in the harness's code, else the lesson's or the exercise's own.
fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info.location().map(|l| (l.file(), l.line()));
        error::say_line(&panic_line(RANK.get().copied(), at, &what));
    }));
}

/// What a panic at `at` (file, line) on `rank` says: `error: rank 1: internal error (a bug
/// in the workbook, please report it) at common/src/x.rs:5: MSG` in the harness's crates,
/// `error: rank 1: panicked at exercises/src/bin/ex03-average.rs:5: MSG` elsewhere.
fn panic_line(rank: Option<usize>, at: Option<(&str, u32)>, what: &str) -> String {
    let who = rank.map(|r| format!("rank {r}: ")).unwrap_or_default();
    let place = at.map(|(file, line)| format!(" at {file}:{line}")).unwrap_or_default();
    match at.is_some_and(|(file, _)| in_harness(file)) {
        true => format!("error: {who}internal error (a bug in the workbook, please report it){place}: {what}"),
        false => format!("error: {who}panicked{place}: {what}"),
    }
}

/// Whether `file`, a panic's location as cargo names it (from the workspace's root), is
/// in one of the harness's crates.
fn in_harness(file: &str) -> bool {
    let file = file.strip_prefix("./").unwrap_or(file);
    ["common/", "runtime/", "backend-cpu/", "backend-nccl/", "perf/"]
        .iter()
        .any(|c| file.starts_with(c))
}

/// The running example's name: its binary's file name (read as the OS gives it: a path
/// that is not UTF-8 is named lossily, never a panic).
pub fn example_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_names_its_rank_and_is_the_workbooks_only_in_the_harness() {
        assert_eq!(
            panic_line(Some(1), Some(("common/src/session.rs", 12)), "boom"),
            "error: rank 1: internal error (a bug in the workbook, please report it) at common/src/session.rs:12: boom"
        );
        assert_eq!(
            panic_line(
                Some(3),
                Some(("exercises/src/bin/ex03-average.rs", 30)),
                "index out of bounds"
            ),
            "error: rank 3: panicked at exercises/src/bin/ex03-average.rs:30: index out of bounds"
        );
        for file in [
            "runtime/src/a.rs",
            "backend-cpu/src/a.rs",
            "backend-nccl/src/a.rs",
            "perf/src/a.rs",
        ] {
            assert!(
                panic_line(Some(0), Some((file, 1)), "x").contains("a bug in the workbook"),
                "{file}"
            );
        }
        for file in [
            "02-nccl-allreduce/src/main.rs",
            "workbook/fixtures/wrong/03_panic.rs",
            "common-x/src/a.rs",
        ] {
            assert!(
                panic_line(Some(0), Some((file, 1)), "x").starts_with("error: rank 0: panicked at "),
                "{file}"
            );
        }
        // The launcher, or before the role is known: no rank.
        assert_eq!(
            panic_line(None, Some(("runtime/src/launcher.rs", 7)), "x"),
            "error: internal error (a bug in the workbook, please report it) at runtime/src/launcher.rs:7: x"
        );
        assert_eq!(panic_line(None, None, "x"), "error: panicked: x");
    }
}

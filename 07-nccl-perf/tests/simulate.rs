//! The benchmark on `--simulate-gpus`: the NCCL calls run, and the header says that no
//! time or bandwidth below is a GPU's. Real processes.

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

#[test]
fn the_header_says_the_figures_are_the_hosts() {
    let r = testkit::run(
        BIN,
        &[
            "--simulate-gpus",
            "2",
            "-b",
            "64",
            "-e",
            "1K",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
        ],
    )
    .ok();
    let out = &r.stdout;
    assert!(
        out.lines().any(|l| l
            == "# simulated GPUs: host memory, not a GPU's speed (--simulate-gpus 2): every time and bandwidth below is the host's"),
        "{r}"
    );
    assert!(out.contains("simulated GPU 1 (host memory)"), "{r}");
    // Every size checked, on the simulator's NCCL path.
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u64>().is_ok()))
        .collect();
    assert_eq!(rows.len(), 3, "{r}");
    for row in rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            (cols[8], cols[12]),
            ("0", "0"),
            "#wrong, out of place and in place: {row}\n{r}"
        );
    }
}

#[test]
fn a_plot_of_simulated_gpus_says_so() {
    let dir = std::env::temp_dir().join(format!("nccl-workbook-sim-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("sim.svg");
    let r = testkit::run(
        BIN,
        &[
            "--simulate-gpus",
            "2",
            "-b",
            "64",
            "-e",
            "1K",
            "-f",
            "4",
            "-n",
            "1",
            "-w",
            "0",
            "--plot",
            svg.to_str().unwrap(),
        ],
    )
    .ok();
    let text = std::fs::read_to_string(&svg).unwrap_or_else(|e| panic!("no plot ({e}):\n{r}"));
    assert!(text.contains("nccl backend on simulated GPUs (host memory)"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

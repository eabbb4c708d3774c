//! `-P PROTO,...` (every sweep once per protocol, as `NCCL_PROTO` set to each would run
//! it): every collective by NCCL's LL, LL128 and Simple on the shared-memory transport,
//! every element of odd sizes checked, and each protocol's steps counted as they cross
//! the links (`proto_steps`), so that a protocol named but not run fails. Real
//! multi-process jobs.

use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

fn perf(ranks: usize, args: &[&str]) -> Run {
    let n = ranks.to_string();
    let base = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        &n,
        "-n",
        "2",
        "-w",
        "1",
        "--format",
        "json",
    ];
    let mut cmd = command(BIN, &[&base[..], args].concat());
    cmd.env("NCCL_WORKBOOK_CORES", "8");
    finish(spawn(cmd), LIMIT)
}

/// Checks every sweep of `r`: one per protocol of `protos` for each collective, no wrong
/// element, and each placement run by the protocol asked, whose steps crossed the links.
fn every_sweep_ran_its_protocol(r: &Run, ranks: usize, protos: &[&str], ops: usize) {
    let j = r.json();
    let sweeps = j["sweeps"].as_array().unwrap_or_else(|| panic!("sweeps:\n{r}"));
    assert_eq!(sweeps.len(), protos.len() * ops, "{r}");
    for sweep in sweeps {
        let asked = sweep["nccl_proto"].as_str().expect("nccl_proto");
        let op = sweep["op"].as_str().unwrap();
        assert!(protos.contains(&asked), "{asked}");
        assert_eq!(sweep["wrong"], 0, "{op} by {asked} on {ranks} ranks: {r}");
        for row in sweep["rows"].as_array().unwrap() {
            for place in ["out_of_place", "in_place"] {
                let p = &row[place];
                let at = format!("{op} {} B {place} by {asked} on {ranks} ranks", row["size"]);
                assert_eq!(p["wrong"], 0, "{at}");
                if asked == "simple" {
                    assert_eq!(p["proto"], "simple", "{at}");
                    continue;
                }
                assert_eq!(p["proto"], asked, "{at}: {r}");
                // Every rank sends in every collective here but the root-less end of a
                // rooted one; rank 0 is the root, which always sends.
                let steps = p["proto_steps"].as_u64().unwrap_or(0);
                assert!(steps > 0, "{at}: no {asked} step crossed a link: {r}");
            }
        }
    }
}

#[test]
fn every_collective_by_every_protocol_on_a_few_world_sizes() {
    // 4 to 16,356 bytes by 4,088: 1, 1,023, 2,045, 3,067 and 4,089 floats (rounded to what
    // each collective splits), odd and mid-line for both LL and LL128.
    for ranks in [2usize, 3, 5] {
        let r = perf(
            ranks,
            &[
                "--coll",
                "all",
                "-P",
                "ll,ll128,simple",
                "-b",
                "4",
                "-e",
                "16356",
                "-i",
                "4088",
            ],
        );
        assert_eq!(r.code, Some(0), "{ranks} ranks: {r}");
        every_sweep_ran_its_protocol(&r, ranks, &["ll", "ll128", "simple"], 6);
    }
}

#[test]
fn over_one_mebibyte_by_every_protocol_and_the_tree_by_ll() {
    // 1 MiB + 12 B: several steps of each protocol, two pieces of the pipelined ring.
    let r = perf(
        3,
        &["--coll", "all", "-P", "ll,ll128", "-b", "1048588", "-e", "1048588"],
    );
    assert_eq!(r.code, Some(0), "{r}");
    every_sweep_ran_its_protocol(&r, 3, &["ll", "ll128"], 6);
    // NCCL's tree sends pieces up and down both trees at once: by LL too.
    let r = perf(
        5,
        &["-A", "tree", "-P", "ll,ll128", "-b", "4", "-e", "1048588", "-f", "64"],
    );
    assert_eq!(r.code, Some(0), "{r}");
    every_sweep_ran_its_protocol(&r, 5, &["ll", "ll128"], 1);
}

#[test]
fn the_table_names_the_protocol_and_a_bad_one_is_refused_in_one_line() {
    let mut cmd = command(
        BIN,
        &[
            "--backend",
            "cpu",
            "--nproc-per-node",
            "2",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "1",
            "-P",
            "ll,simple",
        ],
    );
    cmd.env("NCCL_WORKBOOK_CORES", "8");
    let r = finish(spawn(cmd), LIMIT).ok();
    assert!(
        r.stdout
            .contains("# -P ll: every sweep below as NCCL_PROTO=ll would run it"),
        "{r}"
    );
    assert!(r.stdout.contains("algo proto"), "{r}");
    let rows: Vec<&str> = r.stdout.lines().filter(|l| l.trim_start().starts_with("8 ")).collect();
    assert_eq!(rows.len(), 2, "{r}");
    assert!(
        rows[0].ends_with("direct ll") && rows[1].ends_with("direct simple"),
        "{r}"
    );
    for bad in ["Bogus", "ll,nope"] {
        let r = perf(2, &["-P", bad, "-b", "8", "-e", "8"]);
        assert_eq!(r.code, Some(2), "{bad}: {r}");
        assert_eq!(r.stderr.trim().lines().count(), 1, "{bad}: {r}");
        assert!(r.stderr.contains("unknown protocol"), "{bad}: {r}");
    }
    let r = perf(2, &["-P", "ll", "-b", "8", "-e", "8", "--transport", "tcp"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("-P ll: some ranks talk over TCP"), "{r}");
}

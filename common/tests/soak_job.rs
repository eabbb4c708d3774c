//! The soak example (common/examples/soak.rs) as a real 3-rank job: 1,000 verified
//! collectives of random sizes and roots, no wrong element, no leaked descriptor.

use testkit::{LIMIT, finish, spawn};

#[test]
fn a_thousand_verified_collectives_without_a_wrong_element_or_a_leak() {
    // `cargo test` builds the examples beside the test binaries, in <target>/<profile>/
    // examples, except when asked for one test target only: then build it here.
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("examples/soak");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = std::process::Command::new(cargo)
            .args(["build", "-q", "-p", "common", "--example", "soak"])
            .status();
        assert!(built.is_ok_and(|s| s.success()), "building the soak example failed");
    }
    let cmd = testkit::command(
        bin.to_str().unwrap(),
        &["--nproc-per-node", "3", "--rounds", "1000", "--max-count", "20000"],
    );
    let run = finish(spawn(cmd), LIMIT);
    assert_eq!(run.code, Some(0), "{run}");
    assert!(
        run.stdout
            .contains("soak: 1000 verified collectives on 3 ranks, no descriptor leaked"),
        "{run}"
    );
    assert!(!run.stdout.contains("FAILED"), "{run}");
}

//! Building the workbook's other binaries (the examples, the solutions) from a test: only
//! a package's own binaries come with `CARGO_BIN_EXE_*`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary `bin` of this workspace, built by cargo in the test's profile.
pub fn built(bin: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--message-format=json", "--bin", bin]);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let out = cmd.current_dir(workspace).output().expect("running cargo");
    assert!(
        out.status.success(),
        "building {bin} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo built no binary {bin}"))
}

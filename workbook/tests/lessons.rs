//! A lesson is its folder and its batch script: `NN-name/` (two digits, a dash), a crate
//! whose binary keeps the folder's name, and `slurm/NN-name.sbatch`. Nothing else lists
//! the lessons: the workspace takes the folders by a glob (Cargo.toml), and the scripts
//! (slurm/find-bins.sh, .ci/slurm/check.sh, bench/gpu-check.sh) ask `workbook_lessons`
//! in slurm/find-bins.sh. These tests check the pairs, through that same function, so
//! that a lesson without its script, or a script without its lesson, fails here in CI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workbook's folder.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The names in `dir` for which `keep` gives a name, sorted.
fn names(dir: &Path, keep: impl Fn(&Path) -> Option<String>) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a folder entry").path())
        .filter_map(|path| keep(&path))
        .collect()
}

/// A folder named as a lesson: two digits, a dash, more.
fn lesson_like(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() > 3 && b[0].is_ascii_digit() && b[1].is_ascii_digit() && b[2] == b'-'
}

/// What is wrong with the lessons of the workbook at `root`, one line each (none: all
/// well). Asks `workbook_lessons` of `root`/slurm/find-bins.sh, the scripts' one list.
fn mismatches(root: &Path) -> Vec<String> {
    let out = Command::new("bash")
        .args(["-c", "source slurm/find-bins.sh && workbook_lessons"])
        .current_dir(root)
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "workbook_lessons failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let mut wrong: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_string)
        .collect();

    let mut sorted = listed.clone();
    sorted.sort();
    if sorted != listed {
        wrong.push(format!("workbook_lessons lists the lessons out of order: {listed:?}"));
    }
    let lessons: BTreeSet<String> = listed.into_iter().collect();
    let folders = names(root, |p| {
        let name = p.file_name()?.to_str()?;
        (p.is_dir() && lesson_like(name)).then(|| name.to_string())
    });
    for folder in folders.difference(&lessons) {
        wrong.push(format!("{folder}/ is not listed by workbook_lessons"));
    }
    let scripts = names(&root.join("slurm"), |p| {
        (p.extension()? == "sbatch").then(|| p.file_stem()?.to_str().map(str::to_string))?
    });
    for lesson in lessons.difference(&scripts) {
        wrong.push(format!("lesson {lesson} has no batch script slurm/{lesson}.sbatch"));
    }
    for script in scripts.difference(&lessons) {
        wrong.push(format!("slurm/{script}.sbatch has no lesson folder {script}/"));
    }
    // A script copied from another lesson's runs that lesson until both of its names change.
    for lesson in lessons.intersection(&scripts) {
        let path = root.join("slurm").join(format!("{lesson}.sbatch"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for want in [
            format!("#SBATCH --job-name={lesson}"),
            format!("source slurm/run.sh {lesson} \"$@\""),
        ] {
            if !lines.contains(&want.as_str()) {
                wrong.push(format!("slurm/{lesson}.sbatch has no line `{want}`"));
            }
        }
    }
    wrong
}

#[test]
fn every_lesson_has_its_batch_script_and_every_script_its_lesson() {
    let root = workspace();
    let wrong = mismatches(&root);
    assert!(
        wrong.is_empty(),
        "a lesson is its folder NN-name (a crate whose [[bin]] is named NN-name) and its batch \
         script slurm/NN-name.sbatch:\n  {}",
        wrong.join("\n  ")
    );
}

/// A workbook in a temporary folder, removed when dropped: lessons and scripts as given.
struct Tree(PathBuf);

impl Tree {
    fn new(tag: &str) -> Tree {
        let dir = std::env::temp_dir().join(format!("workbook-lessons-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("slurm")).expect("a temporary folder");
        std::fs::copy(workspace().join("slurm/find-bins.sh"), dir.join("slurm/find-bins.sh"))
            .expect("copying find-bins.sh");
        Tree(dir)
    }

    /// A folder `name` whose Cargo.toml names its binary `bin`.
    fn folder(&self, name: &str, bin: &str) {
        std::fs::create_dir_all(self.0.join(name)).unwrap();
        let manifest = format!("[package]\nname = \"x\"\n\n[[bin]]\nname = \"{bin}\"\npath = \"src/main.rs\"\n");
        std::fs::write(self.0.join(name).join("Cargo.toml"), manifest).unwrap();
    }

    /// A batch script for `lesson`, as the workbook's are made.
    fn script(&self, name: &str, lesson: &str) {
        let text = format!("#!/bin/bash\n#SBATCH --job-name={lesson}\nsource slurm/run.sh {lesson} \"$@\"\n");
        std::fs::write(self.0.join("slurm").join(format!("{name}.sbatch")), text).unwrap();
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_lesson_without_its_script_or_a_script_without_its_lesson_is_named() {
    let tree = Tree::new("pairs");
    tree.folder("00-a", "00-a");
    tree.script("00-a", "00-a");
    assert_eq!(mismatches(&tree.0), Vec::<String>::new());

    tree.folder("01-b", "01-b"); // no script
    tree.script("02-c", "02-c"); // no folder
    tree.folder("03-d", "other"); // its binary is not named as the folder
    tree.folder("04-e", "04-e");
    tree.script("04-e", "00-a"); // copied from 00-a, not renamed
    let wrong = mismatches(&tree.0);
    for want in [
        "lesson 01-b has no batch script slurm/01-b.sbatch",
        "slurm/02-c.sbatch has no lesson folder 02-c/",
        "03-d/ is not listed by workbook_lessons",
        "slurm/04-e.sbatch has no line `#SBATCH --job-name=04-e`",
        "slurm/04-e.sbatch has no line `source slurm/run.sh 04-e \"$@\"`",
    ] {
        assert!(wrong.iter().any(|w| w == want), "no `{want}` in {wrong:#?}");
    }
    assert!(
        wrong.iter().any(|w| w.contains("03-d/ is not a lesson")),
        "no warning from workbook_lessons on 03-d/: {wrong:#?}"
    );
    assert_eq!(wrong.len(), 6, "{wrong:#?}");
}

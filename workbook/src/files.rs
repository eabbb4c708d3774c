//! The student's files: each exercise's starting file written into exercises/src/bin/ the
//! first time the checker looks (`write_missing`), and put back as shipped on
//! `cargo workbook reset N` (`reset`), from the copies the checker keeps in its binary.

use crate::exercises::{self, Exercise, Source};
use std::path::Path;
use std::process::ExitCode;

/// Writes each exercise's starting file where the student's code goes (exercises/src/bin/
/// under `root`) if it is not there yet, and says so: the first `cargo workbook` sets the
/// workbook up, and a file deleted by mistake comes back. Never overwrites (that is `reset`).
pub fn write_missing(all: &[Exercise], root: &Path) -> Result<(), ExitCode> {
    let mut wrote = 0;
    for code in all.iter().filter_map(|ex| ex.code.as_ref()) {
        let path = root.join(code.file(&Source::Exercise));
        let Some(text) = exercises::starting(code.dir) else {
            continue;
        };
        if path.exists() {
            continue;
        }
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text));
        if let Err(e) = written {
            workbook_runtime::error::say_line(&format!("error: writing {}: {e}", path.display()));
            return Err(ExitCode::FAILURE);
        }
        wrote += 1;
    }
    if wrote > 0 {
        println!(
            "Wrote {wrote} exercise{} into exercises/src/bin/, as shipped: yours to edit (git ignores them; \
             `cargo workbook reset N` puts one back).\n",
            if wrote == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

/// `cargo workbook reset N`: the exercise's file under `root` as shipped again.
pub fn reset(ex: &Exercise, root: &Path) -> ExitCode {
    let say = workbook_runtime::error::say_line;
    let Some((code, text)) = ex.code.as_ref().and_then(|c| Some((c, exercises::starting(c.dir)?))) else {
        say(&format!(
            "error: exercise {} has no code to reset: its chapter asks for runs and answers",
            ex.number
        ));
        return ExitCode::from(2);
    };
    let file = code.file(&Source::Exercise);
    let path = root.join(&file);
    if std::fs::read_to_string(&path).is_ok_and(|now| now == text) {
        println!("{file} is as shipped already: nothing to reset");
        return ExitCode::SUCCESS;
    }
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, text));
    match written {
        Ok(()) => {
            println!(
                "{file} is as shipped again: exercise {} starts over (`cargo workbook check {}` fails until you solve it)",
                ex.number, ex.number
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(&format!("error: writing {}: {e}", path.display()));
            ExitCode::FAILURE
        }
    }
}

//! Your code for the workbook's exercises, one binary each in `src/bin/`
//! (`exNN-name.rs`, chapter NN of EXERCISES.md).
//!
//! `cargo workbook` writes an exercise's starting file there the first time it is run
//! (`cargo workbook list` is enough), from the copy the checker keeps in its binary; the
//! pristine files are `workbook/starting/`, and exist only there. git ignores `src/bin/`:
//! what you write is yours. `cargo workbook reset N` puts exercise N back as shipped.

//! `NCCL_ALGO` and `NCCL_PROTO` changed between the benchmark's sweeps (its `-A` and
//! `-P` on NCCL). NCCL reads both when a communicator starts (`ncclTopoTuneModel`, at
//! every init and split, through `getenv`, from 2.18 to 2.30), and only then: so a sweep
//! under another value runs on a communicator started after the value changed
//! ([`crate::nccl::Nccl::split`] of the one before).
//!
//! Changing the environment while other threads may read it (NCCL's own, the CUDA
//! driver's) is sound, with glibc, only for a variable that is there already: `setenv`
//! then replaces one pointer of the array, under its lock, and frees neither the old
//! string nor the array, so a `getenv` at the same time finds the old value or the new
//! one. Adding a variable may move the array. So [`prepare`] adds the variables a run
//! will change while the process has one thread (before NCCL loads), and [`set`] changes
//! only those. Elsewhere than glibc, nothing is prepared, and the benchmark says so.

use std::sync::Mutex;

/// The variables [`prepare`] made ready, each with the value the user had given it.
static PREPARED: Mutex<Vec<(&'static str, Option<String>)>> = Mutex::new(Vec::new());

/// Makes each of `vars` (name, the value of the first sweep) present in the environment,
/// with that value where the user gave none, so that [`set`] may change it later. Call it
/// before NCCL loads, in a rank's process; it does nothing unless the process has one
/// thread, since adding a variable is sound only then, nor off glibc.
pub fn prepare(vars: &[(&'static str, String)]) {
    if vars.is_empty() || !cfg!(target_env = "gnu") || crate::nccl_log::threads() != Some(1) {
        return;
    }
    let mut prepared = lock();
    for (name, first) in vars {
        let user = std::env::var(name).ok();
        if user.is_none() {
            // SAFETY: the process has one thread (counted above, and nothing here starts
            // one), so nothing reads or writes the environment at the same time.
            unsafe { std::env::set_var(name, first) };
        }
        prepared.push((name, user));
    }
}

/// Whether `name` can take `value` later ([`set`]): it was made ready by [`prepare`].
/// Else why not, in one line.
pub fn can_set(name: &str, value: &str) -> Result<(), String> {
    match prepared(name) {
        true => Ok(()),
        false => Err(format!(
            "{name} cannot change in a running process here (it is changed only where the C library is glibc, and \
             set before NCCL starts): run the benchmark once per value ({name}={value} 07-nccl-perf ...)"
        )),
    }
}

/// Gives `name`, which [`prepare`] made ready, the value `value` for the communicators
/// that start from now on. `Err` (one line) for a variable that was not prepared.
pub fn set(name: &str, value: &str) -> Result<(), String> {
    can_set(name, value)?;
    if std::env::var(name).ok().as_deref() == Some(value) {
        return Ok(());
    }
    // SAFETY: `name` is in the environment since `prepare`, when the process had one
    // thread, and stays there (nothing here removes a variable): glibc's `setenv` replaces
    // one pointer of the array under its lock and frees neither the old string nor the
    // array, so a `getenv` in another thread reads the old value or the new one, both
    // valid (see the module's doc). Rust's own readers take the lock `set_var` takes.
    unsafe { std::env::set_var(name, value) };
    Ok(())
}

/// The user's value of `name`: as it was before [`prepare`] gave it the first sweep's
/// value, else as the environment has it. What the CPU backend's tuner and the reports of
/// the user's environment read.
pub fn user_var(name: &str) -> Option<String> {
    match lock().iter().find(|(n, _)| *n == name) {
        Some((_, user)) => user.clone(),
        None => std::env::var(name).ok(),
    }
}

/// Whether `name` is one [`prepare`] made ready (its value now is the sweep's, not the
/// user's).
pub fn prepared(name: &str) -> bool {
    lock().iter().any(|(n, _)| *n == name)
}

fn lock() -> std::sync::MutexGuard<'static, Vec<(&'static str, Option<String>)>> {
    PREPARED.lock().unwrap_or_else(|p| p.into_inner())
}

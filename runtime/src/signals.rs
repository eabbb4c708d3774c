//! A rank told to stop (SIGTERM: its launcher died, or the job was cancelled; SIGINT:
//! Ctrl-C; SIGHUP: its terminal closed) removes what it made before it goes, as a rank
//! that fails does: the clean-ups registered with [`crate::error::clean_up_at_exit`] (its
//! channel files in `/dev/shm`, its simulated GPUs' folders, and what its peers killed
//! with SIGKILL could not remove). The signals are taken by a thread of their own
//! (`sigwait`), where any code may run, rather than by a handler, where almost none may.

/// Takes SIGTERM, SIGINT and SIGHUP on a thread of their own from now on: each ends the
/// process as it would have (killed by that signal), after the clean-ups. Call it
/// while the process has one thread: the threads started later inherit the blocked signals
/// (a process it starts does not: std resets the mask of a child).
pub fn clean_up_on_termination() {
    // A rank this program's launcher started: its launcher's death is news (a rank started
    // otherwise may outlive the shell that started it, and finish normally).
    if std::env::var_os(crate::launch::ENV_LAUNCHED).is_some() {
        // SAFETY: getppid has no arguments and cannot fail.
        let _ = PARENT.set(unsafe { libc::getppid() });
    }
    // SAFETY: sigemptyset and sigaddset fill a set this function owns; pthread_sigmask
    // changes this thread's mask only, from a valid set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        set
    };
    let waiter = std::thread::Builder::new().name("signals".into()).spawn(move || {
        loop {
            let mut signal = 0;
            // SAFETY: `set` is a valid set; sigwait writes the signal taken into `signal`.
            if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
                crate::error::hush();
                crate::error::run_clean_ups();
                // Then the signal's own end, so that whoever waits (the launcher, the
                // shell, Slurm) reads "killed by SIGTERM", as before.
                // SAFETY: restores the default action of a signal this thread took and
                // raises it at this thread, where it is unblocked: the process ends.
                unsafe {
                    libc::signal(signal, libc::SIG_DFL);
                    let mut one: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut one);
                    libc::sigaddset(&mut one, signal);
                    libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
                    libc::raise(signal);
                    libc::_exit(128 + signal);
                }
            }
        }
    });
    if waiter.is_err() {
        // No thread to take them: the signals keep their default, as before.
        // SAFETY: as above, unblocking the same set.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    }
}

/// This process's parent when [`clean_up_on_termination`] ran, in a rank this program's
/// launcher started: its launcher.
static PARENT: std::sync::OnceLock<libc::pid_t> = std::sync::OnceLock::new();

/// Whether the launcher that started this rank is gone (the rank now has another parent):
/// then nobody removes its files after it, and it does so itself as it ends
/// ([`crate::error::run_clean_ups`]), as it would on a signal.
pub fn orphaned() -> bool {
    // SAFETY: getppid has no arguments and cannot fail.
    PARENT.get().is_some_and(|p| *p != unsafe { libc::getppid() })
}

//! A job's secret: what lets a process join the job's store, beside its identity.
//!
//! A job's identity can be worked out by anyone on the machine (`manual@ADDR:PORT`,
//! `launch@ADDR:PORT`, `slurm-JOB.STEP`), so the store also asks for a secret, where the
//! job has one: this program's launcher makes one for the ranks it starts on one node (128
//! random bits) and hands it to them in [`ENV_SECRET`], which only their user and root
//! may read (`/proc/PID/environ`). Ranks started by hand, by Slurm, by torchrun or by the
//! launchers of several nodes have no one to hand them a secret: they take the one the
//! user puts in [`ENV_SECRET`] on every rank, and without it join as before, on their
//! identity alone (docs/failures.md says what each start can promise).

use anyhow::{Result, anyhow};

/// The variable that carries a job's secret to its ranks: set by this program's launcher
/// for the ranks of one node, by the user for every other start.
pub const ENV_SECRET: &str = "NCCL_WORKBOOK_SECRET";
/// The longest secret taken: it travels in every join, whose size the store bounds.
pub const MAX_LEN: usize = 256;

/// A job's secret. Never shown (its `Debug` says only that there is one), and compared
/// in a time that does not depend on where two secrets first differ.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// A new secret: 128 bits from the kernel's random pool (`getrandom(2)`, the pool of
    /// `/dev/urandom`), in hex.
    pub fn fresh() -> Result<Secret> {
        Ok(Secret(hex(&random_bytes::<16>()?)))
    }

    /// The secret in `text`, as a user gives it: 1 to [`MAX_LEN`] bytes, none of them a
    /// control character (it travels as text, and is never shown).
    pub fn given(text: &str) -> std::result::Result<Secret, String> {
        if text.is_empty() || text.len() > MAX_LEN || text.chars().any(char::is_control) {
            return Err(format!(
                "{ENV_SECRET} is set but is not a secret this program takes: 1 to {MAX_LEN} printable characters \
                 (it has {} bytes; `openssl rand -hex 16` makes one), or unset it",
                text.len()
            ));
        }
        Ok(Secret(text.to_string()))
    }

    /// The secret as it travels in a join (or a greeting of a peer link).
    pub fn text(&self) -> &str {
        &self.0
    }

    /// Whether `other` (as it came in a join or a greeting) is this secret, compared in a
    /// time that does not depend on where they differ.
    pub fn matches(&self, other: &str) -> bool {
        same(self.0.as_bytes(), other.as_bytes())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.matches(&other.0)
    }
}

/// Whether `a` and `b` are the same bytes, in a time that depends on their lengths only
/// (a store that answered a wrong guess faster the sooner it differs would tell a stranger,
/// byte by byte, how much of it was right).
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `N` bytes from the kernel's random pool (`getrandom(2)`): secrets and the store's
/// tokens ([`crate::rendezvous`]).
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut buf = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`, which is
        // writable and lives across the call; getrandom writes at most that many bytes.
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), N - filled, 0) };
        match n {
            n if n > 0 => filled += n as usize,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => {
                return Err(anyhow!(
                    "reading {N} random bytes from the kernel (getrandom): {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
    }
    Ok(buf)
}

/// `bytes` in lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_secret_is_128_random_bits_never_shown() {
        let (a, b) = (Secret::fresh().unwrap(), Secret::fresh().unwrap());
        assert_eq!(a.text().len(), 32);
        assert!(a.text().bytes().all(|c| c.is_ascii_hexdigit()), "{}", a.text());
        assert_ne!(a, b);
        assert!(a.matches(a.text()) && !a.matches(b.text()) && !a.matches(""));
        assert_eq!(format!("{a:?}"), "Secret(..)");
    }

    #[test]
    fn a_given_secret_is_printable_and_bounded() {
        assert!(Secret::given("hunter2").unwrap().matches("hunter2"));
        for bad in [String::new(), "a\nb".into(), "x".repeat(MAX_LEN + 1)] {
            let e = Secret::given(&bad).unwrap_err();
            assert!(e.starts_with("NCCL_WORKBOOK_SECRET is set but is not a secret"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}

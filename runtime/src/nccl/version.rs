//! NCCL's version, as `ncclGetVersion` gives it (a code: 2.18.3 is 21803) and as people
//! write it (`2.18.3`, or `2.18.3+cuda12.2` as a wheel names it).

use std::fmt;

/// A version of NCCL: major, minor, patch (ordered as versions are).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// 2.
    pub major: u32,
    /// 18, in 2.18.3.
    pub minor: u32,
    /// 3, in 2.18.3.
    pub patch: u32,
}

impl Version {
    /// The version `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version { major, minor, patch }
    }

    /// The version `ncclGetVersion`'s code stands for: 21803 is 2.18.3 (and before 2.9
    /// codes were written in thousands: 2903 is 2.9.3).
    pub fn from_code(code: i32) -> Version {
        let code = code.max(0) as u32;
        match code >= 10000 {
            true => Version::new(code / 10000, (code / 100) % 100, code % 100),
            false => Version::new(code / 1000, (code / 100) % 10, code % 100),
        }
    }

    /// Its code as `ncclGetVersion` gives it today (`NCCL_VERSION_CODE`): 2.28.3 is 22803.
    pub fn code(self) -> u32 {
        self.major * 10000 + self.minor * 100 + self.patch
    }

    /// `2.28.3`, `2.18.3+cuda12.2`, `2.21` (patch 0): `None` if it does not start with a
    /// major and a minor number.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split(['.', '+', '-']).map(|p| p.parse::<u32>().ok());
        let (major, minor) = (parts.next()??, parts.next()??);
        Some(Version::new(major, minor, parts.next().flatten().unwrap_or(0)))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::Version;

    #[test]
    fn codes_and_text_round_trip_as_nccl_writes_them() {
        assert_eq!(Version::from_code(21803), Version::new(2, 18, 3));
        assert_eq!(Version::from_code(2903), Version::new(2, 9, 3));
        assert_eq!(Version::new(2, 28, 3).code(), 22803);
        assert_eq!(Version::parse("2.18.3+cuda12.2"), Some(Version::new(2, 18, 3)));
        assert_eq!(Version::parse("2.21"), Some(Version::new(2, 21, 0)));
        assert_eq!(Version::parse("cpu"), None);
        assert_eq!(Version::new(2, 26, 2).to_string(), "2.26.2");
        assert!(Version::new(2, 9, 3) < Version::new(2, 18, 0));
    }
}

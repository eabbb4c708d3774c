//! The config a communicator is made with (`ncclConfig_t`: NCCL's initializer, blocking
//! or not, and only the bytes of the layout cudarc declares), and the variables that
//! would override it in NCCL, refused before any communicator is made.

use cudarc::nccl::sys;
use std::ffi::c_int;

/// How many bytes of `ncclConfig_t` NCCL is given: the fields of the layout declared
/// (version 2.17's, as cudarc's bindings declare it), through `splitShare`: 44 bytes,
/// not `size_of` (48, with 4 bytes of padding at the end). NCCL copies `size` bytes over
/// its own defaults, and NCCL 2.26 reads bytes 44..48 as `trafficClass` (the InfiniBand
/// traffic class of every connection) with no version guard: padding handed over would
/// become a setting.
pub(super) const CONFIG_SIZE: usize = std::mem::offset_of!(sys::ncclConfig_t, splitShare) + size_of::<c_int>();

/// The variables that override a communicator's config in NCCL (`envConfigOverride` in
/// `init.cc`, 2.18.1 to 2.30.7, for every init and split), and why the workbook cannot
/// run under them: it chooses per communicator, and these would choose for all.
const CONFIG_OVERRIDES: [(&str, &str); 2] = [
    (
        "NCCL_COMM_BLOCKING",
        "NCCL would give every communicator of the workbook this blocking mode, over the config it sets: the \
         workbook's own is non-blocking, so that every wait is polled under --timeout (a blocking init or call waits \
         for ever for a peer that is gone), and the timed loops' is blocking, as nccl-tests times (non-blocking, NCCL \
         2.23 and later start a thread for every call)",
    ),
    (
        "NCCL_COMM_SPLIT_SHARE_RESOURCES",
        "NCCL would make the communicators the workbook splits (the timed loops', the benchmark's per sweep, lesson \
         09's) share their parent's resources, which it leaves separate (shared, a child's abort or error reaches its \
         parent: NVIDIA/nccl issue 2430)",
    ),
];

/// `NCCL_COMM_BLOCKING` and `NCCL_COMM_SPLIT_SHARE_RESOURCES` (read with `var`, as
/// [`crate::nccl_env::param`] reads them: the environment, then NCCL's files) set to a
/// value NCCL would apply: one line saying so and what to do. NCCL reads them as
/// `NCCL_PARAM` does: an empty value is unset; `NCCL_COMM_BLOCKING` applies when it is 0
/// or 1, `NCCL_COMM_SPLIT_SHARE_RESOURCES` whatever its value. They are refused rather
/// than unset behind the user's back: whoever set them meant them for something.
pub fn check_config_env(var: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    for (name, why) in CONFIG_OVERRIDES {
        let Some(value) = var(name).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        let applies = match name {
            // 0 and 1 apply; NCCL ignores any other value (and one that overflows).
            "NCCL_COMM_BLOCKING" => matches!(crate::nccl_env::strtoll(&value), Some(0 | 1)),
            _ => true,
        };
        if applies {
            return Err(format!(
                "{name}={value} is set: {why}; run without it (env -u {name} ..., or out of NCCL_CONF_FILE, \
                 ~/.nccl.conf or /etc/nccl.conf, where NCCL also reads it)"
            ));
        }
    }
    Ok(())
}

/// NCCL's configuration for a communicator: `NCCL_CONFIG_INITIALIZER` of the 2.17 layout
/// (what cudarc's bindings declare; NCCL reads the fields of that version and defaults
/// the rest) with `blocking` set. Zeroed first, and only [`CONFIG_SIZE`] bytes given.
pub(super) fn config(blocking: bool) -> sys::ncclConfig_t {
    const UNDEF: c_int = i32::MIN; // NCCL_CONFIG_UNDEF_INT: "NCCL decides"
    // SAFETY: ncclConfig_t is plain data (integers and a pointer): all zeros is a value.
    let mut c: sys::ncclConfig_t = unsafe { std::mem::zeroed() };
    c.size = CONFIG_SIZE;
    c.magic = 0xcafe_beef;
    c.version = 21700;
    c.blocking = c_int::from(blocking);
    c.cgaClusterSize = UNDEF;
    c.minCTAs = UNDEF;
    c.maxCTAs = UNDEF;
    c.netName = std::ptr::null();
    c.splitShare = UNDEF;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_that_override_the_config_are_refused_where_nccl_applies_them() {
        let check = |name: &'static str, value: &'static str| {
            check_config_env(&move |n| (n == name).then(|| value.to_string()))
        };
        for v in ["1", "0", " 1", "1x", "+1", "01"] {
            let said = check("NCCL_COMM_BLOCKING", v).unwrap_err();
            assert!(said.starts_with(&format!("NCCL_COMM_BLOCKING={v} is set: ")), "{said}");
        }
        // strtoll: no digits is 0, "0x1" is 1, "010" is 8.
        for v in ["yes", "0x1", "-0"] {
            assert!(check("NCCL_COMM_BLOCKING", v).is_err(), "{v}");
        }
        // NCCL ignores a blocking value other than 0 and 1, and an empty one.
        for v in ["", "2", "-1", "010", "99999999999999999999"] {
            assert_eq!(check("NCCL_COMM_BLOCKING", v), Ok(()), "{v}");
        }
        assert!(check("NCCL_COMM_SPLIT_SHARE_RESOURCES", "0").is_err());
        assert_eq!(check("NCCL_COMM_SPLIT_SHARE_RESOURCES", ""), Ok(()));
    }

    #[test]
    fn the_config_is_nccls_initializer_made_non_blocking_and_gives_its_fields_only() {
        let c = config(false);
        assert_eq!((c.magic, c.blocking, c.version), (0xcafe_beef, 0, 21700));
        // The 2.17 layout's fields end with splitShare at 40..44; the 4 bytes after are
        // padding that NCCL 2.26 would read as trafficClass.
        assert_eq!((c.size, size_of::<sys::ncclConfig_t>()), (44, 48));
    }
}

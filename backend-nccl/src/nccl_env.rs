//! NCCL's variables as NCCL reads them, for the checks the workbook makes before NCCL
//! starts: where a value comes from (the environment, then NCCL's configuration files:
//! [`setting`]), and how an integer is read ([`strtoll`], as `ncclLoadParam` does).

/// A variable as NCCL reads it (`ncclGetEnv`, `src/misc/param.cc`, 2.18 to 2.30): the
/// environment's, else the first line `NAME=value` of `NCCL_CONF_FILE` (else
/// `~/.nccl.conf`), then of `/etc/nccl.conf`, which NCCL sets without overwriting.
pub fn setting(
    name: &str,
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    read: &dyn Fn(&std::path::Path) -> Option<Vec<u8>>,
) -> Option<String> {
    if let Some(v) = env(name) {
        return Some(v.to_string_lossy().into_owned());
    }
    let user = match env("NCCL_CONF_FILE").filter(|f| !f.is_empty()) {
        Some(file) => Some(std::path::PathBuf::from(file)),
        None => env("HOME").map(|h| std::path::Path::new(&h).join(".nccl.conf")),
    };
    let files = user.into_iter().chain([std::path::PathBuf::from("/etc/nccl.conf")]);
    files.filter_map(|f| read(&f)).find_map(|text| {
        String::from_utf8_lossy(&text).lines().find_map(|line| {
            let line = line.strip_suffix('\r').unwrap_or(line);
            let (key, value) = line.split_once('=')?;
            (!line.starts_with('#') && key == name).then(|| value.to_string())
        })
    })
}

/// A variable as NCCL reads it in this process: [`setting`] of this process's environment
/// and files.
pub fn param(name: &str) -> Option<String> {
    let env = |name: &str| std::env::var_os(name);
    let read = |file: &std::path::Path| std::fs::read(file).ok();
    setting(name, &env, &read)
}

/// A parameter's value as NCCL's `ncclLoadParam` reads it: `None` (the default) when empty
/// or out of range, else `strtoll(value, NULL, 0)`: leading spaces, a sign, then hex after
/// `0x`, octal after `0`, else decimal, up to the first other character ("yes" is 0).
pub fn strtoll(value: &str) -> Option<i64> {
    if value.is_empty() {
        return None;
    }
    let t = value.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let hex = t.len() > 2 && (t.starts_with("0x") || t.starts_with("0X")) && t.as_bytes()[2].is_ascii_hexdigit();
    let (radix, digits) = if hex {
        (16, &t[2..])
    } else if t.starts_with('0') {
        (8, t)
    } else {
        (10, t)
    };
    let mut v: i128 = 0;
    for d in digits.chars().map_while(|c| c.to_digit(radix)) {
        v = v * i128::from(radix) + i128::from(d);
        if v > 1 << 63 {
            return None;
        }
    }
    i64::try_from(if negative { -v } else { v }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_is_read_as_nccl_reads_it_from_the_environment_or_its_files() {
        let name = "NCCL_MULTI_RANK_GPU_ENABLE";
        let setting = |env: &[(&str, &str)], files: &[(&str, &str)]| {
            let env = |n: &str| env.iter().find(|(k, _)| *k == n).map(|(_, v)| v.into());
            let read = |f: &std::path::Path| {
                files
                    .iter()
                    .find(|(k, _)| std::path::Path::new(k) == f)
                    .map(|(_, v)| v.as_bytes().to_vec())
            };
            setting(name, &env, &read)
        };
        let etc = (
            "/etc/nccl.conf",
            "# NCCL_MULTI_RANK_GPU_ENABLE=2\nNCCL_MULTI_RANK_GPU_ENABLE=1\r\n",
        );
        assert_eq!(setting(&[], &[]), None);
        assert_eq!(setting(&[], &[etc]).as_deref(), Some("1"));
        assert_eq!(setting(&[(name, "0")], &[etc]).as_deref(), Some("0"));
        let home = (
            "/h/.nccl.conf",
            "NCCL_MULTI_RANK_GPU_ENABLE=3\nNCCL_MULTI_RANK_GPU_ENABLE=4",
        );
        assert_eq!(setting(&[("HOME", "/h")], &[etc, home]).as_deref(), Some("3"));
        let named = ("/c", "NCCL_MULTI_RANK_GPU_ENABLE=5");
        let both = [("HOME", "/h"), ("NCCL_CONF_FILE", "/c")];
        assert_eq!(setting(&both, &[etc, home, named]).as_deref(), Some("5"));
        for (text, value) in [
            ("1", Some(1)),
            (" +7", Some(7)),
            ("-1", Some(-1)),
            ("0x10", Some(16)),
            ("010", Some(8)),
            ("1x", Some(1)),
            ("yes", Some(0)),
            ("", None),
            ("9223372036854775808", None),
        ] {
            assert_eq!(strtoll(text), value, "{text:?}");
        }
    }
}

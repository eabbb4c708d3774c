//! The test hook, read in one place: `NCCL_WORKBOOK_FAULT=NAME[:RANK[:VALUE]]` makes one
//! fault happen where real processes cannot be made to fail on cue (a corrupted element,
//! a rank held during setup, a full `/dev/shm`). Tests set it; nothing else does.

/// The hook's value when it names fault `name` and, if given, `rank`: the fields after
/// the rank (empty when there are none). `None` when this fault is not asked for here.
pub fn asked(name: &str, rank: Option<usize>) -> Option<Vec<String>> {
    let spec = std::env::var("NCCL_WORKBOOK_FAULT").ok()?;
    let mut parts = spec.split(':');
    if parts.next() != Some(name) {
        return None;
    }
    if let Some(rank) = rank
        && parts.next()?.parse::<usize>().ok()? != rank
    {
        return None;
    }
    Some(parts.map(str::to_string).collect())
}

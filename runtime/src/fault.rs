//! The test hook, read in one place: `NCCL_WORKBOOK_FAULT=NAME[:RANK[:VALUE]]` makes one
//! fault happen where real processes cannot be made to fail on cue (a corrupted element,
//! a rank held during setup, a full `/dev/shm`, a rank late to its first collective,
//! buffers outside the shared arenas, buffers made without the memory check before start:
//! `no-memory-check`, a rank killed in a split: `die-in-split`). Tests set it, and `bench/compare-mpi.sh` for its CPU-time
//! measurement; nothing else does.

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

/// `NCCL_WORKBOOK_FAULT=late:RANK:MS`: rank RANK starts its first collective MS
/// milliseconds late, so that the others wait for it inside the collective (how long a
/// waiting rank spins, and that it then sleeps, can be measured: `bench/compare-mpi.sh`
/// and the tests read the job's CPU time).
pub fn late(rank: usize) {
    // Read once: this runs before every collective, and reading the environment costs
    // more than a small collective.
    static MS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static ONCE: std::sync::Once = std::sync::Once::new();
    let ms = MS.get_or_init(|| asked("late", Some(rank)).and_then(|v| v.first()?.parse().ok()));
    if let Some(ms) = *ms {
        ONCE.call_once(|| std::thread::sleep(std::time::Duration::from_millis(ms)));
    }
}

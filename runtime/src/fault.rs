//! The test hook, read in one place: `NCCL_WORKBOOK_FAULT=NAME[:RANK[:VALUE]]` makes one
//! fault happen where real processes cannot be made to fail on cue (a corrupted element,
//! a rank held during setup, a full `/dev/shm`, a rank late to its first collective,
//! buffers outside the shared arenas, buffers made without the memory check before start:
//! `no-memory-check`, a rank killed in a split: `die-in-split`, or as it issues its second
//! collective on a stream: `die-on-stream`). Tests set it, and `bench/compare-mpi.sh` for its CPU-time
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
#[inline]
pub fn late(rank: usize) {
    // Once: this runs before every collective, and reading the environment costs more
    // than a small collective; after the first call, one load and one test.
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !DONE.load(std::sync::atomic::Ordering::Relaxed) {
        late_once(rank, &DONE);
    }
}

#[cold]
fn late_once(rank: usize, done: &std::sync::atomic::AtomicBool) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(ms) = asked("late", Some(rank)).and_then(|v| v.first()?.parse().ok()) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    });
    done.store(true, std::sync::atomic::Ordering::Relaxed);
}

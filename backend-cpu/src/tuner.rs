//! Which algorithm runs: the one place the CPU backend chooses, as NCCL's tuner does
//! (`src/graph/tuning.cc` and `enqueue.cc`'s `topoGetAlgoInfo`): by the collective, its
//! size, the number of ranks, how they are connected, and whether they outnumber the
//! cores. Every collective's `cpu` function asks [`choose`] and runs what it answers;
//! every input is the same on every rank, so every rank runs the same algorithm.
//!
//! What it chose is named where a student looks: a lesson's `Time:` line, the
//! benchmark's `algo` column (and field), the trace's `algorithm`, and with
//! `NCCL_DEBUG=INFO` one line per choice, worded as NCCL's `TUNING` line:
//! `AllReduce: 1024 Bytes -> Algo direct proto simple`.
//!
//! `NCCL_ALGO` is read as NCCL reads it ([`Allowed::parse`]); NCCL's `Ring` means the
//! CPU backend's ring-shaped algorithms, and two names of its own (`direct`,
//! `single-copy`) pick the others. docs/cpu-backend.md's "Which algorithm runs" maps the names onto
//! NCCL's.
//!
//! The protocol ([`Protocol`]: NCCL's LL, LL128 or Simple, `workbook_cpu`'s
//! `transport::protocol`) is chosen with the algorithm ([`choose_with`]), from
//! `NCCL_PROTO` read with the same grammar ([`Protocols::parse`]) and the size
//! ([`protocol_for`]). Only shared memory has the three; where a pair of ranks talks over
//! TCP every message goes by Simple, and `NCCL_PROTO` without Simple is refused.

mod env;

use crate::SMALL;
use crate::collective::Row;
pub use crate::transport::protocol::Protocol;
use env::Family;
pub use env::{Allowed, Protocols};
use workbook_runtime::Func;

/// One way of running a collective on the CPU backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Every rank sends its buffer straight to every rank that needs it: one message
    /// time, for small messages (NCCL's LL protocol and tree make the same trade).
    Direct,
    /// The ring, step by step (NCCL's Ring, one chunk per step).
    Ring,
    /// The ring, piece by piece round the whole ring (NCCL's Ring, as NCCL runs it).
    RingPipelined,
    /// A chain from (or to) the root round the ring, piece by piece: NCCL's Ring for
    /// broadcast and reduce.
    Chain,
    /// Every rank reads the others' buffers where they lie, on one host: NCCL's P2P
    /// transport with P2P read (`NCCL_P2P_DISABLE=1` turns it off, as it does NCCL's).
    SingleCopy,
    /// All-to-all: at step s each rank sends to rank + s and receives from rank - s.
    Pairwise,
    /// All-reduce up and down NCCL's double binary tree (NCCL's Tree): on many nodes,
    /// past a direct message and up to [`TREE_UP_TO_PER_NODE`] times the nodes (see
    /// [`choose`]), or when `NCCL_ALGO`
    /// asks for it.
    Tree,
}

impl Algorithm {
    /// Every algorithm, in the order of their numbers (`algorithm as u8`).
    pub const ALL: [Algorithm; 7] = [
        Algorithm::Direct,
        Algorithm::Ring,
        Algorithm::RingPipelined,
        Algorithm::Chain,
        Algorithm::SingleCopy,
        Algorithm::Pairwise,
        Algorithm::Tree,
    ];

    /// The short name: `direct`, `ring`, `ring-pipelined`, `chain`, `single-copy`,
    /// `pairwise`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Direct => "direct",
            Algorithm::Ring => "ring",
            Algorithm::RingPipelined => "ring-pipelined",
            Algorithm::Chain => "chain",
            Algorithm::SingleCopy => "single-copy",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Tree => "tree",
        }
    }

    /// The family `NCCL_ALGO` names it by: NCCL's `Ring` for every ring-shaped one.
    fn family(self) -> Family {
        match self {
            Algorithm::Direct => Family::Direct,
            Algorithm::SingleCopy => Family::SingleCopy,
            Algorithm::Tree => Family::Tree,
            _ => Family::Ring,
        }
    }

    /// Whether it is shaped as NCCL's `Ring` (the ring, step by step or pipelined, the
    /// chain, the pairwise exchange): what `NCCL_ALGO=Ring` names, and what always can run.
    pub fn is_ring_shaped(self) -> bool {
        self.family() == Family::Ring
    }
}

/// What the tuner knows of the job: the same on every rank.
#[derive(Clone, Copy, Debug)]
pub struct Facts {
    /// The number of ranks.
    pub ranks: usize,
    /// Every link of the ring (rank i to i + 1) shares memory and buffers several
    /// pieces: the ring may run piece by piece.
    pub ring_in_memory: bool,
    /// Every rank is on one host and maps every other rank's buffers (no TCP, and
    /// `NCCL_P2P_DISABLE` unset): the single copy can run.
    pub reads_peers: bool,
    /// Some host runs more ranks than it has cores (ranks take turns on a core).
    pub oversubscribed: bool,
    /// `--steps` (or `--draw`) is recording: it shows the ring, so the ring runs where
    /// `NCCL_ALGO` allows it.
    pub steps: bool,
    /// How many machines (NCCL's nodes) the ranks run on.
    pub nodes: usize,
    /// Every pair of ranks shares memory: the links have NCCL's three protocols (over
    /// TCP, Simple alone).
    pub protocols: bool,
}

/// Which algorithm runs `func` on `bytes` (its larger buffer, as nccl-tests sizes it),
/// among those `allowed` (`NCCL_ALGO`). The algorithms that can run here (the transport,
/// `--steps`, a direct message's size) and `NCCL_ALGO` allows are the candidates; of
/// them, a small message goes [`Algorithm::Direct`], one from [`single_copy_from`] (and,
/// for a reduce, below [`single_copy_below`]) [`Algorithm::SingleCopy`], the rest round
/// the ring. When `NCCL_ALGO` leaves a single candidate it runs at every size, and when
/// it leaves none the ring runs (it always can).
/// An all-reduce on [`TREE_FROM_NODES`] nodes or more goes up and down the
/// [`Algorithm::Tree`] from past a direct message to [`TREE_UP_TO_PER_NODE`] times the
/// nodes: its 2·log₂(nodes) message times across the network against the ring's
/// 2(n − 1), a gap that grows with the nodes, as the size it is worth does. Elsewhere it runs only
/// when `NCCL_ALGO` leaves it and not the ring (on one host every rank is one node's chain).
///
/// `bench/ring-vs-tree.sh` measures where the tree pays on emulated nodes; the figures
/// that set these thresholds are in docs/perf-history.md ("Where the tuner's thresholds
/// came from"): the tree led on 8 nodes up to 256 KiB, on 16 still at 1 MiB, on 4 only
/// where the direct exchange runs. Hence 8 nodes, and 64 KiB a node.
pub fn choose(func: Func, bytes: usize, facts: &Facts, allowed: &Allowed) -> Algorithm {
    use Algorithm::*;
    let n = facts.ranks;
    let rows = crate::collective::algorithms(func);
    let can = |r: &&Row| (r.can)(facts, bytes);
    // The collective's ring-shaped algorithm that can run here (its table lists the
    // pipelined ring before the ring, which always can).
    let ring = rows
        .iter()
        .filter(can)
        .find(|r| r.algorithm.is_ring_shaped())
        .map_or(Ring, |r| r.algorithm);
    if n < 2 {
        return ring;
    }
    let ok = |r: &&Row| {
        can(r) && allowed.allows(func, r.algorithm.family()) && (!r.algorithm.is_ring_shaped() || r.algorithm == ring)
    };
    // In an array, not a Vec: this runs on every call, and a 4-byte call costs less than
    // an allocation.
    let (mut held, mut len) = ([ring; 4], 0);
    for r in rows.iter().filter(ok).take(4) {
        held[len] = r.algorithm;
        len += 1;
    }
    let candidates = &held[..len];
    match candidates[..] {
        [] => ring,
        [only] => only,
        // --steps and --draw show the ring the lessons teach, unless NCCL_ALGO leaves it out.
        _ if candidates.contains(&ring) && facts.steps => ring,
        _ if candidates.contains(&Direct) && bytes <= SMALL => Direct,
        _ if candidates.contains(&SingleCopy)
            && (single_copy_from(func, n, facts.oversubscribed)..single_copy_below(func, n)).contains(&bytes) =>
        {
            SingleCopy
        }
        // (--steps shows the ring the lessons teach, unless NCCL_ALGO asks for the tree.)
        _ if candidates.contains(&Tree)
            && !facts.steps
            && facts.nodes >= TREE_FROM_NODES
            && bytes <= TREE_UP_TO_PER_NODE * facts.nodes =>
        {
            Tree
        }
        _ if candidates.contains(&ring) => ring,
        // The ring excluded: past a direct message, the tree where it may run, else the copy.
        _ if candidates.contains(&Tree) => Tree,
        _ => SingleCopy,
    }
}

/// From this many nodes an all-reduce may go up and down the tree ([`choose`]).
pub const TREE_FROM_NODES: usize = 8;
/// Up to this size (its buffer) times the nodes an all-reduce on many nodes goes by the
/// tree ([`choose`]): 512 KiB on 8 nodes, 1 MiB on 16.
pub const TREE_UP_TO_PER_NODE: usize = 64 << 10;

/// From this size a collective reads the other ranks' buffers (single copy) rather than
/// take messages through the shared slots, on `ranks` ranks, on a host with as many cores
/// as ranks or more, or fewer (`oversubscribed`).
///
/// The single copy takes one copy per byte where a slot takes two, and no rank waits for
/// another's pieces; but it starts and ends with a handshake (where the buffers are, and
/// "done reading", from every rank to every rank, or to the broadcast's root): a few
/// message times, and where ranks share cores each may be a sleep and a wake-up (tens of
/// µs). So it pays from a size: 64 KiB, where the single copy won in most rows of the
/// crossover runs (docs/perf-history.md, "Where the tuner's thresholds came from"). On 2
/// ranks with a core each the handshake is one message each way, and the slots lose well
/// before: there the single copy takes over where the direct exchange stops ([`SMALL`],
/// 16 KiB, also the smallest buffer the arena holds), and a broadcast, which has no
/// direct exchange on 2 ranks, goes by its chain below. `bench/crossover.sh` reruns the
/// crossover on the machine at hand.
pub fn single_copy_from(_func: Func, ranks: usize, oversubscribed: bool) -> usize {
    if ranks == 2 && !oversubscribed { SMALL } else { 64 << 10 }
}

/// Below this size a collective may read the other ranks' buffers ([`single_copy_from`]
/// being where it starts): no limit but for the reduce, whose root reads and reduces
/// every buffer alone, where the chain shares the reducing among the ranks.
///
/// The reduce by single copy against its chain, measured in alternating runs
/// (docs/perf-history.md, "Where the tuner's thresholds came from"), was level at 4 MiB
/// on 2 ranks and behind from 16 MiB, and behind from 1 MiB on more; the chain, whose
/// every piece crosses between two cores lap after lap, also took many times its usual
/// time in some runs, where the single copy's root writes only its own buffer.
///
/// Hence the reduce by single copy below 4 MiB on 2 ranks (the root reads one other
/// buffer: level with the chain at 4 MiB, behind from 16 MiB) and below 1 MiB on more.
pub fn single_copy_below(func: Func, ranks: usize) -> usize {
    match func {
        Func::Reduce if ranks == 2 => 4 << 20,
        Func::Reduce => 1 << 20,
        _ => usize::MAX,
    }
}

/// Which algorithm and which protocol run `coll` on `bytes`, among those `allowed`
/// (`NCCL_ALGO`) and `protos` (`NCCL_PROTO`): as NCCL's tuner picks the pair. The single
/// copy reads the other ranks' buffers where they lie, outside the links' protocols: it
/// counts as Simple, and is no candidate when `NCCL_PROTO` leaves Simple out (as NCCL's
/// Simple-only algorithms, PAT and NVLS, are not under `NCCL_PROTO=LL`). The protocol is
/// then [`protocol_for`]'s.
pub fn choose_with(
    func: Func,
    bytes: usize,
    facts: &Facts,
    allowed: &Allowed,
    protos: &Protocols,
) -> (Algorithm, Protocol) {
    if protos.every || !facts.protocols {
        // NCCL_PROTO unset (or TCP): the algorithm as before, no copy of `allowed`.
        let algo = choose(func, bytes, facts, allowed);
        return (algo, protocol_for(func, bytes, algo, facts, protos));
    }
    let mut allowed = allowed.clone();
    if facts.protocols && !protos.allows(func, Protocol::Simple) {
        allowed.forbid(func, Family::SingleCopy);
    }
    let algo = choose(func, bytes, facts, &allowed);
    (algo, protocol_for(func, bytes, algo, facts, protos))
}

/// The protocol `algo` runs `func` on `bytes` with: Simple where the links have no other
/// (TCP) and for the single copy; else, of those `protos` allows, LL below [`LL_BELOW`]
/// (on this project's machine, never: see there), then Simple, LL128 when Simple is left
/// out, LL when both are.
pub fn protocol_for(func: Func, bytes: usize, algo: Algorithm, facts: &Facts, protos: &Protocols) -> Protocol {
    if !facts.protocols || algo == Algorithm::SingleCopy {
        return Protocol::Simple;
    }
    if protos.every {
        return match LL_BELOW.is_some_and(|below| bytes < below) {
            true => Protocol::Ll,
            false => Protocol::Simple,
        };
    }
    let ok = |p: Protocol| protos.allows(func, p);
    match () {
        _ if ok(Protocol::Ll) && LL_BELOW.is_some_and(|below| bytes < below) => Protocol::Ll,
        _ if ok(Protocol::Simple) => Protocol::Simple,
        _ if ok(Protocol::Ll128) => Protocol::Ll128,
        _ if ok(Protocol::Ll) => Protocol::Ll,
        _ => Protocol::Simple,
    }
}

/// Below this size (the collective's larger buffer) the tuner sends by LL when
/// `NCCL_PROTO` leaves the choice to it ([`protocol_for`]): `None`, never, on this machine.
///
/// LL pays on a GPU because a GPU's flag after data needs a fence across the system bus
/// (`__threadfence_system`, microseconds), which LL's flag in every 8-byte store saves. On
/// x86 a Release store is a plain store (the CPU keeps stores in order): Simple's flag
/// costs nothing more than LL's, and its messages of up to 32 bytes already travel inside
/// their flag's cache line. What LL adds is work per 4 bytes on both sides and twice the
/// lines. Measured on a 2-core x86 VM (docs/perf-history.md, "Where the tuner's
/// thresholds came from"), LL was never faster than Simple beyond the noise, and LL128 was
/// level with it below 1 KiB and slower past a few KiB: so the tuner keeps Simple, and LL
/// and LL128 run when `NCCL_PROTO` asks.
pub const LL_BELOW: Option<usize> = None;

/// The `NCCL_DEBUG=INFO` line of a choice, worded as NCCL's (`enqueue.cc`): the
/// algorithm and the protocol that ran.
pub fn debug_line(func: Func, bytes: usize, algo: Algorithm, proto: Protocol) -> String {
    format!(
        "cpu INFO {}: {bytes} Bytes -> Algo {} proto {}",
        func.nccl_func(),
        algo.name(),
        proto.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Algorithm::*;

    const ONE_HOST: Facts = Facts {
        ranks: 4,
        ring_in_memory: true,
        reads_peers: true,
        oversubscribed: false,
        steps: false,
        nodes: 1,
        protocols: true,
    };

    fn with(text: &str) -> Allowed {
        Allowed::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn small_messages_go_direct_large_ones_by_single_copy_the_rest_round_the_ring() {
        let all = Allowed::default();
        assert_eq!(choose(Func::AllReduce, 4, &ONE_HOST, &all), Direct);
        assert_eq!(choose(Func::AllReduce, SMALL + 4, &ONE_HOST, &all), RingPipelined);
        assert_eq!(choose(Func::AllReduce, 16 << 20, &ONE_HOST, &all), SingleCopy);
        assert_eq!(choose(Func::AllGather, 32 << 10, &ONE_HOST, &all), Ring);
        assert_eq!(choose(Func::AllGather, 64 << 10, &ONE_HOST, &all), SingleCopy);
        assert_eq!(choose(Func::Broadcast, 4, &ONE_HOST, &all), Direct);
        assert_eq!(choose(Func::Broadcast, 1 << 20, &ONE_HOST, &all), SingleCopy);
        assert_eq!(choose(Func::Reduce, 256 << 10, &ONE_HOST, &all), SingleCopy);
        assert_eq!(choose(Func::Reduce, 16 << 20, &ONE_HOST, &all), Chain);
        assert_eq!(choose(Func::AllToAll, 4, &ONE_HOST, &all), Direct);
        assert_eq!(choose(Func::AllToAll, 32 << 10, &ONE_HOST, &all), Pairwise);
        assert_eq!(choose(Func::AllGather, 4, &ONE_HOST, &all), Direct);
        assert_eq!(choose(Func::ReduceScatter, 12, &ONE_HOST, &all), Direct);
        assert_eq!(choose(Func::ReduceScatter, SMALL + 12, &ONE_HOST, &all), Ring);
        // NCCL_ALGO=Ring keeps the ring-shaped ones at every size.
        let ring = Allowed::parse("ring").unwrap();
        assert_eq!(choose(Func::ReduceScatter, 12, &ONE_HOST, &ring), Ring);
        assert_eq!(choose(Func::AllToAll, 4, &ONE_HOST, &ring), Pairwise);
        assert_eq!(choose(Func::AllGather, 4, &ONE_HOST, &ring), Ring);
        // Over TCP: no single copy, no pipelined ring; --steps: the ring.
        let tcp = Facts {
            ring_in_memory: false,
            reads_peers: false,
            ..ONE_HOST
        };
        assert_eq!(choose(Func::AllReduce, 16 << 20, &tcp, &all), Ring);
        assert_eq!(choose(Func::AllToAll, 16 << 20, &tcp, &all), Pairwise);
        let steps = Facts {
            steps: true,
            ..ONE_HOST
        };
        assert_eq!(choose(Func::AllReduce, 4, &steps, &all), RingPipelined);
        assert_eq!(choose(Func::AllGather, 4, &steps, &all), Ring);
        assert_eq!(choose(Func::AllToAll, 4, &steps, &all), Pairwise);
        assert_eq!(choose(Func::AllReduce, 4, &Facts { ranks: 2, ..steps }, &all), Ring);
        // Broadcast on two ranks: the chain is direct already.
        assert_eq!(choose(Func::Broadcast, 4, &Facts { ranks: 2, ..ONE_HOST }, &all), Chain);
    }

    #[test]
    fn the_all_reduce_with_cores_enough_and_the_broadcast_on_ranks_sharing_them_copy_later() {
        let all = Allowed::default();
        let shared = Facts {
            oversubscribed: true,
            ..ONE_HOST
        };
        // Chapter 7's packed broadcast: 121 KiB on 4 ranks.
        assert_eq!(choose(Func::Broadcast, 121 << 10, &shared, &all), SingleCopy);
        assert_eq!(choose(Func::Broadcast, 32 << 10, &shared, &all), Chain);
        assert_eq!(choose(Func::Broadcast, 1 << 20, &ONE_HOST, &all), SingleCopy);
        assert_eq!(choose(Func::AllGather, 64 << 10, &shared, &all), SingleCopy);
        assert_eq!(choose(Func::Broadcast, 16 << 20, &shared, &all), SingleCopy);
        assert_eq!(choose(Func::AllReduce, 1 << 20, &shared, &all), SingleCopy);
        assert_eq!(choose(Func::AllReduce, 1 << 20, &ONE_HOST, &all), SingleCopy);
        assert_eq!(choose(Func::AllReduce, 32 << 10, &ONE_HOST, &all), RingPipelined);
    }

    #[test]
    fn two_ranks_with_a_core_each_copy_from_16_kib_and_sharing_one_from_64() {
        let all = Allowed::default();
        let two = Facts { ranks: 2, ..ONE_HOST };
        let two_shared = Facts {
            oversubscribed: true,
            ..two
        };
        // Direct first, up to 16 KiB, where it can run; the broadcast's chain below 16 KiB.
        assert_eq!(choose(Func::AllReduce, 16 << 10, &two, &all), Direct);
        assert_eq!(choose(Func::Broadcast, 8 << 10, &two, &all), Chain);
        assert_eq!(choose(Func::Broadcast, 16 << 10, &two, &all), SingleCopy);
        for func in [
            Func::AllReduce,
            Func::AllGather,
            Func::ReduceScatter,
            Func::AllToAll,
            Func::Broadcast,
        ] {
            assert_eq!(choose(func, 32 << 10, &two, &all), SingleCopy, "{}", func.name());
            assert_ne!(choose(func, 32 << 10, &two_shared, &all), SingleCopy, "{}", func.name());
            assert_eq!(choose(func, 64 << 10, &two_shared, &all), SingleCopy, "{}", func.name());
        }
        // The reduce's root reads every buffer alone: the chain again from 4 MiB on 2
        // ranks, from 1 MiB on more.
        assert_eq!(choose(Func::Reduce, 8 << 10, &two, &all), Chain);
        assert_eq!(choose(Func::Reduce, 32 << 10, &two, &all), SingleCopy);
        assert_eq!(choose(Func::Reduce, 2 << 20, &two, &all), SingleCopy);
        assert_eq!(choose(Func::Reduce, 4 << 20, &two, &all), Chain);
        assert_eq!(choose(Func::Reduce, 512 << 10, &ONE_HOST, &all), SingleCopy);
        assert_eq!(choose(Func::Reduce, 1 << 20, &ONE_HOST, &all), Chain);
        // Wider worlds with cores enough keep 64 KiB.
        assert_eq!(choose(Func::AllGather, 32 << 10, &ONE_HOST, &all), Ring);
    }

    #[test]
    fn nccl_algo_narrows_the_choice_and_a_lone_candidate_runs_at_every_size() {
        let ring = with("ring");
        assert_eq!(choose(Func::AllReduce, 4, &ONE_HOST, &ring), RingPipelined);
        assert_eq!(choose(Func::AllToAll, 16 << 20, &ONE_HOST, &ring), Pairwise);
        let copy = with("single-copy");
        assert_eq!(choose(Func::AllReduce, 16 << 10, &ONE_HOST, &copy), SingleCopy);
        assert_eq!(choose(Func::AllReduce, 4, &ONE_HOST, &copy), SingleCopy);
        // Direct cannot carry a large message: nothing allowed can run, the ring does.
        assert_eq!(
            choose(Func::AllReduce, 1 << 20, &ONE_HOST, &with("direct")),
            RingPipelined
        );
        // Asked for, the reduce's single copy runs at every size too.
        assert_eq!(choose(Func::Reduce, 4, &ONE_HOST, &copy), SingleCopy);
        assert_eq!(choose(Func::Reduce, 16 << 20, &ONE_HOST, &copy), SingleCopy);
        let no_ring = with("^ring");
        assert_eq!(choose(Func::AllReduce, 4, &ONE_HOST, &no_ring), Direct);
        assert_eq!(choose(Func::AllReduce, 64 << 10, &ONE_HOST, &no_ring), SingleCopy);
        // Past a direct message and short of the copy, without the ring: the tree.
        assert_eq!(choose(Func::AllReduce, 32 << 10, &ONE_HOST, &no_ring), Tree);
        // The tree runs when asked for, at every size and under --steps; never unasked;
        // and only all-reduce has one (the others fall back to their ring).
        let tree = with("tree");
        let steps = Facts {
            steps: true,
            ..ONE_HOST
        };
        for bytes in [4, 16 << 10, 1 << 20, 256 << 20] {
            assert_eq!(choose(Func::AllReduce, bytes, &ONE_HOST, &tree), Tree);
            assert_eq!(choose(Func::AllReduce, bytes, &steps, &tree), Tree);
            assert_ne!(choose(Func::AllReduce, bytes, &ONE_HOST, &Allowed::default()), Tree);
        }
        assert_eq!(choose(Func::Broadcast, 1 << 20, &ONE_HOST, &tree), Chain);
    }

    #[test]
    fn on_eight_nodes_or_more_a_medium_all_reduce_goes_by_the_tree() {
        let all = Allowed::default();
        let nodes = |nodes: usize| Facts {
            ranks: nodes,
            ring_in_memory: false,
            reads_peers: false,
            nodes,
            ..ONE_HOST
        };
        assert_eq!(choose(Func::AllReduce, 16 << 10, &nodes(8), &all), Direct);
        assert_eq!(choose(Func::AllReduce, (16 << 10) + 4, &nodes(8), &all), Tree);
        assert_eq!(choose(Func::AllReduce, 512 << 10, &nodes(8), &all), Tree);
        assert_eq!(choose(Func::AllReduce, (512 << 10) + 4, &nodes(8), &all), Ring);
        assert_eq!(choose(Func::AllReduce, 1 << 20, &nodes(16), &all), Tree);
        assert_eq!(choose(Func::AllReduce, (1 << 20) + 4, &nodes(16), &all), Ring);
        assert_eq!(choose(Func::AllReduce, 256 << 10, &nodes(7), &all), Ring);
        // Only the all-reduce has a tree; NCCL_ALGO=Ring keeps the ring; --steps too, unasked.
        assert_eq!(choose(Func::AllGather, 256 << 10, &nodes(8), &all), Ring);
        assert_eq!(choose(Func::AllReduce, 256 << 10, &nodes(8), &with("ring")), Ring);
        let steps = Facts {
            steps: true,
            ..nodes(8)
        };
        assert_eq!(choose(Func::AllReduce, 256 << 10, &steps, &all), Ring);
    }

    #[test]
    fn the_protocol_is_chosen_with_the_algorithm_and_tcp_and_the_single_copy_are_simple() {
        let all = Allowed::default();
        let any = Protocols::default();
        let only = |t: &str| Protocols::parse(t).unwrap();
        // Left to the tuner: LL below LL_BELOW (on this machine, never), Simple from it.
        for bytes in [0, 4, 4096, 32 << 10] {
            let want = match LL_BELOW.is_some_and(|below| bytes < below) {
                true => Protocol::Ll,
                false => Protocol::Simple,
            };
            assert_eq!(
                choose_with(Func::AllReduce, bytes, &ONE_HOST, &all, &any).1,
                want,
                "{bytes}"
            );
        }
        assert_eq!(
            choose_with(Func::AllReduce, 1 << 20, &ONE_HOST, &all, &any),
            (SingleCopy, Protocol::Simple)
        );
        // NCCL_PROTO=LL leaves out the single copy, which is Simple: the ring runs by LL.
        assert_eq!(
            choose_with(Func::AllReduce, 1 << 20, &ONE_HOST, &all, &only("LL")),
            (RingPipelined, Protocol::Ll)
        );
        assert_eq!(
            choose_with(Func::AllReduce, 4, &ONE_HOST, &all, &only("LL128")),
            (Direct, Protocol::Ll128)
        );
        assert_eq!(
            choose_with(Func::AllReduce, 4, &ONE_HOST, &all, &only("^LL")).1,
            Protocol::Simple
        );
        // NCCL_ALGO=single-copy with NCCL_PROTO=Simple: the copy.
        let copy = with("single-copy");
        assert_eq!(
            choose_with(Func::AllReduce, 4, &ONE_HOST, &copy, &only("simple")).0,
            SingleCopy
        );
        // Over TCP (some pair without shared memory): Simple, whatever is allowed.
        let tcp = Facts {
            protocols: false,
            ring_in_memory: false,
            reads_peers: false,
            ..ONE_HOST
        };
        assert_eq!(
            choose_with(Func::AllReduce, 4, &tcp, &all, &only("LL")).1,
            Protocol::Simple
        );
    }

    #[test]
    fn the_debug_line_is_worded_as_nccls_tuning_line() {
        assert_eq!(
            debug_line(Func::AllReduce, 1024, Direct, Protocol::Simple),
            "cpu INFO AllReduce: 1024 Bytes -> Algo direct proto simple"
        );
        assert_eq!(
            debug_line(Func::AllReduce, 8, Direct, Protocol::Ll),
            "cpu INFO AllReduce: 8 Bytes -> Algo direct proto ll"
        );
        assert_eq!(Func::AllToAll.nccl_func(), "AllToAll");
    }
}

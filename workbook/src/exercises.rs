//! What each exercise is, how it is checked, and its hint: the workbook's `info.toml`,
//! kept in code so that each check can say what it expects element by element.

/// One exercise of EXERCISES.md.
pub struct Exercise {
    /// Its chapter in EXERCISES.md.
    pub number: u32,
    /// Its title.
    pub title: &'static str,
    /// Where the student's code is, and its package and binary; `None` when the chapter
    /// asks for runs and answers, not code.
    pub code: Option<Code>,
    /// A nudge, shown by `workbook hint N` and `check --hint`: which step, which peer,
    /// what to look at; not the answer.
    pub hint: &'static str,
    /// The solution in words, shown only when asked for again: `workbook hint N --more`;
    /// for a chapter without code, its questions' answers in short.
    pub more: &'static str,
}

/// An exercise's code: the student's file in exercises/src/bin/, its solution under
/// solutions/, its starting file as shipped in workbook/starting/.
pub struct Code {
    /// Its name: the folder under solutions/, the file in workbook/starting/.
    pub dir: &'static str,
    /// What the checker runs, given the largest world size allowed.
    pub cases: fn(usize) -> Vec<Case>,
}

/// Which copy of an exercise's code a check builds.
#[derive(Clone, PartialEq, Eq)]
pub enum Source {
    /// The student's: exercises/src/bin/, written from the starting file the first time.
    Exercise,
    /// The reference solution: solutions/.
    Solution,
    /// The starting file as shipped, kept where the student does not edit it
    /// (workbook/starting/): what the workbook's own tests check, so that a solved
    /// workbook stays green.
    Starting,
    /// A program of workbook/fixtures/ by its binary's name: a wrong answer of a known kind,
    /// for the workbook's own tests.
    Fixture(String),
}

impl Code {
    /// The exercise's name in its binaries: `ring-allreduce` for `05_ring_allreduce`.
    fn name(&self) -> String {
        self.dir.split_once('_').map_or(self.dir, |(_, n)| n).replace('_', "-")
    }

    /// The exercise's chapter, from its name: 5 for `05_ring_allreduce`.
    fn number(&self) -> u32 {
        self.dir.split_once('_').and_then(|(n, _)| n.parse().ok()).unwrap_or(0)
    }

    /// The package and binary of the student's code, of the solution or of the pristine
    /// starting file.
    pub fn target(&self, source: &Source) -> (String, String) {
        let (number, name) = (self.number(), self.name());
        match source {
            Source::Exercise => ("exercises".into(), format!("ex{number:02}-{name}")),
            Source::Solution => (format!("solution-{number:02}-{name}"), format!("sol{number:02}-{name}")),
            Source::Starting => ("workbook-fixtures".into(), format!("start{number:02}-{name}")),
            Source::Fixture(bin) => ("workbook-fixtures".into(), bin.clone()),
        }
    }

    /// Where the code checked is, from the workspace's root: its file, or its folder
    /// ending in `/`. A panic whose file starts so is the student's (or the fixture's), not
    /// the workbook's.
    pub fn folder(&self, source: &Source) -> String {
        match source {
            Source::Exercise | Source::Starting => self.file(source),
            Source::Solution => format!("solutions/{}/", self.dir),
            Source::Fixture(_) => "workbook/fixtures/".into(),
        }
    }

    /// The file the student edits (or its solution, or its pristine copy), from the
    /// workspace's root.
    pub fn file(&self, source: &Source) -> String {
        match source {
            Source::Exercise => format!("exercises/src/bin/{}.rs", self.target(source).1),
            Source::Solution => format!("solutions/{}/src/main.rs", self.dir),
            Source::Starting => format!("workbook/starting/{}.rs", self.dir),
            Source::Fixture(bin) => format!("workbook/fixtures (the program {bin})"),
        }
    }
}

/// The starting file of the exercise in `dir` as shipped, kept in this binary (as
/// rustlings keeps its exercises): what `cargo workbook` writes into exercises/src/bin/
/// the first time, and what `reset` puts back. The one copy, workbook/starting/, which
/// the workbook's own tests check (`check --starting`).
pub fn starting(dir: &str) -> Option<&'static str> {
    Some(match dir {
        "03_average" => include_str!("../starting/03_average.rs"),
        "04_p2p_broadcast" => include_str!("../starting/04_p2p_broadcast.rs"),
        "05_ring_allreduce" => include_str!("../starting/05_ring_allreduce.rs"),
        "07_packed_broadcast" => include_str!("../starting/07_packed_broadcast.rs"),
        "08_sharded_update" => include_str!("../starting/08_sharded_update.rs"),
        "10_tree_allreduce" => include_str!("../starting/10_tree_allreduce.rs"),
        "12_hierarchical_allreduce" => include_str!("../starting/12_hierarchical_allreduce.rs"),
        "13_grouped_alltoall" => include_str!("../starting/13_grouped_alltoall.rs"),
        "14_ddp_buckets" => include_str!("../starting/14_ddp_buckets.rs"),
        _ => return None,
    })
}

/// A check of a job's JSON report beyond its shown elements: what is wrong, a line each.
pub type ReportCheck = dyn Fn(&serde_json::Value) -> Vec<String>;

/// One run of an exercise: a world size, the flags, and what the shown elements must be.
pub struct Case {
    /// Ranks started.
    pub world: usize,
    /// The exercise's own flags (the checker adds the launch and output flags).
    pub args: Vec<String>,
    /// The stage of the JSON report whose shown elements are checked ("after").
    pub stage: &'static str,
    /// How many elements every rank shows at that stage (`--show`, or the tables' 8): a
    /// report that lacks some (or has others) fails, whatever the ones it has.
    pub shown: usize,
    /// The value element `i` of `rank` must have at that stage.
    pub expect: Box<dyn Fn(usize, usize) -> f64>,
    /// What else the JSON report must say, as lines of what is wrong (exercise 14: how
    /// the buckets were issued and waited).
    pub also: Option<Box<ReportCheck>>,
}

impl Case {
    pub(crate) fn new(
        world: usize,
        args: &[&str],
        stage: &'static str,
        shown: usize,
        expect: impl Fn(usize, usize) -> f64 + 'static,
    ) -> Case {
        Case {
            world,
            args: args.iter().map(|a| a.to_string()).collect(),
            stage,
            shown,
            expect: Box::new(expect),
            also: None,
        }
    }

    /// The case, with `check` reading the rest of the report.
    pub(crate) fn also(mut self, check: impl Fn(&serde_json::Value) -> Vec<String> + 'static) -> Case {
        self.also = Some(Box::new(check));
        self
    }

    /// "world 3, --count 13 --root 2": what tells the runs apart (not --iters or --show).
    pub fn label(&self) -> String {
        let mut shown = Vec::new();
        let mut args = self.args.iter();
        while let Some(a) = args.next() {
            if a == "--iters" || a == "--show" {
                args.next();
            } else {
                shown.push(a.as_str());
            }
        }
        format!("world {}, {}", self.world, shown.join(" "))
    }
}

/// The exercises, in the order of EXERCISES.md.
pub fn all() -> Vec<Exercise> {
    vec![
        Exercise {
            number: 1,
            title: "ranks and devices",
            code: None,
            hint: "Run `cargo run --release --bin 00-nccl-hello-world -- --nproc-per-node 5` and read the \
                   device column: device = rank % device_count, where device_count is the number of GPUs \
                   of the node (on the CPU backend, the number of ranks of the node).",
            more: "Each rank takes the GPU of its local rank (`LOCAL_RANK` from torchrun, `SLURM_LOCALID` from \
                   Slurm), which counts the ranks of its node from 0; rank % device_count gives the same \
                   only when every node holds device_count consecutive ranks. With 5 ranks on 4 GPUs, \
                   ranks 0 and 4 would share GPU 0: the workbook refuses before calling NCCL, as NCCL \
                   refuses a duplicate GPU (its rings and trees join devices, and two kernels on one GPU \
                   would wait for each other). The other ranks get rank 0's unique id through the store \
                   every rank joins at start (the rendezvous): NCCL cannot do that part, since the id is \
                   what tells it which ranks belong together.",
        },
        Exercise {
            number: 2,
            title: "broadcast",
            code: None,
            hint: "Run 01-nccl-broadcast with --root 2 --value 7 --nproc-per-node 4 and compare the root's \
                   row before and after: a broadcast only writes into the other ranks' buffers.",
            more: "The root only sends, so its buffer is unchanged; what a non-root held before is \
                   overwritten, so it does not matter. busbw = algbw for a broadcast because every rank \
                   but the root receives the whole buffer once: each link of a ring carries it once, and \
                   nccl-tests' factor is 1.",
        },
        Exercise {
            number: 3,
            title: "from sum to average",
            code: Some(Code {
                dir: "03_average",
                cases: average_cases,
            }),
            hint: "After all_reduce every element holds the sum over the ranks: one more step makes it \
                   the average. Which number divides it, and which Session call tells you that number? \
                   Then: the buffer lives where the backend computes; which Session calls bring it to host \
                   memory as a Vec, and make a buffer again from a Vec?",
            more: "After all_reduce every element is the sum over the n ranks; the average is that \
                   sum divided by n = session.world_size(). Read the buffer with session.to_host(buf)?, \
                   map every element x to x / n as f32, and put the result back with \
                   *buf = session.from_host(values)?.",
        },
        Exercise {
            number: 4,
            title: "broadcast from point-to-point",
            code: Some(Code {
                dir: "04_p2p_broadcast",
                cases: p2p_broadcast_cases,
            }),
            hint: "Every send needs a matching recv on the peer, with as many elements: for each rank, \
                   write down what it sends to whom and what it receives from whom, and check that the two \
                   lists pair up. Star: which rank talks to every other? Chain: look at `pos`; which rank \
                   has nobody before it, and which has nobody after it (its `next` is the root, which \
                   receives nothing)? Pipeline: the chain's steps, for one piece at a time. Try --root 2 \
                   by hand: every rank's place in the chain moves.",
            more: "Every send needs a matching recv on the peer, with as many elements. Star: the root \
                   loops over the other ranks, each of which calls recv(buf, root) once. Chain: `pos` is \
                   a rank's place after the root; every rank with pos > 0 receives from `prev`, and every \
                   rank with pos < n - 1 then sends to `next`. Pipeline: the same two ifs, inside the loop \
                   over pieces, with recv_part/send_part on piece(k). Check the ranks that are not root 0: \
                   --root 2 moves the start of the chain.",
        },
        Exercise {
            number: 5,
            title: "ring all-reduce from point-to-point",
            code: Some(Code {
                dir: "05_ring_allreduce",
                cases: ring_cases,
            }),
            hint: "Draw 3 ranks and 3 chunks on paper first. In the reduce-scatter, at every step each \
                   rank sends one chunk to its right and adds the chunk arriving from its left into its \
                   own copy: which chunk does rank r send at step 0, and which at step 1? After n - 1 \
                   steps, which chunk holds the full sum on rank r? The all-gather then passes the \
                   finished chunks round the same ring. If only the largest case fails, after the \
                   timeout, look at the order of each rank's send and receive (send_recv).",
            more: "Reduce-scatter, step t (from 0): send chunk c(rank + n - t) and add in chunk \
                   c(rank + n - t - 1) from the left, with send_recv_add; after n - 1 steps rank r holds \
                   the full sum of chunk r + 1. All-gather, step t: send the finished chunk \
                   c(rank + 1 + n - t) and receive chunk c(rank + n - t) with send_recv. Draw 3 ranks \
                   and 3 chunks on paper first. If only the largest case fails, after the timeout, your \
                   ranks all send before they receive: each waits for a neighbour that is itself \
                   sending; send_recv does both at once.",
        },
        Exercise {
            number: 6,
            title: "latency and bandwidth",
            code: None,
            hint: "algbw = size / time (bytes per second, in GB/s of 1e9 B); busbw = algbw × 2(n-1)/n for \
                   all-reduce, × 1 for broadcast. The turn from latency-bound to bandwidth-bound is where \
                   the time starts to grow in proportion to the size.",
            more: "α is the time of the smallest rows, flat while the size grows (latency-bound), and β the \
                   algbw of the largest, where the time grows with the size (bandwidth-bound); the turn is \
                   near the size α·β, where both terms are equal (`--fit` finds them). algbw = size in \
                   bytes / (time in µs × 1000) GB/s; busbw = algbw × 2(n-1)/n for an all-reduce, × 1 for a \
                   broadcast. A 4-byte all-reduce costs one message time with the direct exchange and \
                   2(n - 1) in a row with the ring. The single copy copies each byte once, from the \
                   peer's memory, where the slots copy it twice per hop: on 3 ranks and 2 cores that is 2 \
                   copies against 4, while on 2 ranks the slots' two copies already run at once, one per \
                   core.",
        },
        Exercise {
            number: 7,
            title: "many small messages or one large one",
            code: Some(Code {
                dir: "07_packed_broadcast",
                cases: packed_cases,
            }),
            hint: "Each: one broadcast per tensor, in a loop. Packed: three steps (one buffer holding \
                   every tensor, in order; one broadcast; the buffer cut back into the tensors, in the \
                   same order). Which Session calls move a buffer to host memory and back, and where does \
                   each tensor start in the packed one?",
            more: "Each: a loop with one s.broadcast(tensor, root)? per tensor. Packed: collect every \
                   tensor's s.to_host(tensor)? into one Vec, in order; s.from_host(that)?; one \
                   s.broadcast; then s.to_host(&packed)? and give each tensor its slice back, in the same \
                   order, with *tensor = s.from_host(slice.to_vec())? (a tensor's length is tensor.len()).",
        },
        Exercise {
            number: 8,
            title: "a sharded update (ZeRO)",
            code: Some(Code {
                dir: "08_sharded_update",
                cases: sharded_cases,
            }),
            hint: "Three steps, one collective or one loop each. Step 1: which collective leaves each \
                   rank with the average of its own block of the gradients only (and how large is that \
                   block)? Step 2: which parameters does rank r own, and where do they start? Step 3: which \
                   collective puts every rank's block back into every rank's params? If only your own \
                   shard is right, a step is missing; if every rank holds the same wrong values, look at \
                   a shard's offset.",
            more: "Rank r owns the parameters rank × shard .. (rank + 1) × shard. Step 1: let mut g = \
                   s.from_host(vec![0.0; shard])?; then s.reduce_scatter_into(grads, &mut g, ReduceOp::Avg)? \
                   gives g the average of block `rank` of every rank's gradients. Step 2: take that block of \
                   s.to_host(params)?, subtract lr × g element by element, and make a buffer of it with \
                   s.from_host. Step 3: s.all_gather_into(&that, params)? puts rank i's shard at block i of \
                   every rank's params. If only your own shard is right, the all-gather is missing; if \
                   every rank holds the same wrong values, a shard's offset is wrong.",
        },
        Exercise {
            number: 9,
            title: "on a cluster",
            code: None,
            hint: "Submit slurm/02-nccl-allreduce.sbatch with NCCL_DEBUG=INFO exported, on one node, then \
                   on two (--nodes=2); in the .out file, the lines with 'via' name the transport NCCL \
                   chose for each pair of ranks.",
            more: "Inside a node NCCL takes P2P (NVLink or PCIe) between GPUs that reach each other, else \
                   SHM through host memory; between nodes NET (NET/IB, or NET/Socket over TCP). A ring \
                   runs at its slowest link's pace, so across two nodes busbw falls to what the network \
                   gives per GPU. A job that hangs at start with NCCL trying docker0 or lo needs \
                   NCCL_SOCKET_IFNAME set to the interface the nodes share (and NCCL_IB_HCA for \
                   InfiniBand).",
        },
        Exercise {
            number: 10,
            title: "tree all-reduce from point-to-point",
            code: Some(Code {
                dir: "10_tree_allreduce",
                cases: tree_cases,
            }),
            hint: "Draw the tree of 5 ranks first (rank r's children are 2r + 1 and 2r + 2). Going up, a \
                   rank can pass its piece on only once every child's piece is in it: which calls, in \
                   which order, and which rank has no one to send to? Going down, a rank must have the \
                   finished piece before it passes it on. Check world 1 and 2 by hand: a rank may have \
                   no parent, no children, or one child.",
            more: "Up, for each piece k: for each child, s.recv_add_part(buf, piece(k), child)?; then, if \
                   there is a parent, s.send_part(buf, piece(k), parent)?. Down, for each piece k: if \
                   there is a parent, s.recv_part(buf, piece(k), parent)?; then for each child \
                   s.send_part(buf, piece(k), child)?. The root has no parent and a leaf no children: \
                   `if let Some(parent) = parent` and a loop over `&children` cover both.",
        },
        Exercise {
            number: 11,
            title: "protocols",
            code: None,
            hint: "Run 07-nccl-perf on 2 ranks from 8 B to 4 MiB with -P ll,ll128,simple -A ring and compare \
                   each size's time and busbw across the three sweeps: the last column says which protocol ran.",
            more: "On the CPU backend LL wins no size and falls far below half of Simple's bandwidth, LL128 \
                   to about half: an x86 store needs no fence before its flag, so Simple's flag costs what \
                   LL's does, and LL only adds work per byte (packing, twice the cache lines, a copy). On a \
                   GPU, LL wins small messages because it skips the system-wide fence Simple needs before \
                   its flag; its price is half the link's bandwidth (LL128's, 8/128 of it). \
                   NCCL_PROTO=Simple takes LL and LL128 out of NCCL's choice: it works around LL128 on \
                   hardware that does not keep 128-byte stores whole, and costs latency on small calls.",
        },
        Exercise {
            number: 12,
            title: "hierarchical all-reduce from split communicators",
            code: Some(Code {
                dir: "12_hierarchical_allreduce",
                cases: hierarchical_cases,
            }),
            hint: "Draw 6 ranks as 2 nodes of 3 first: which ranks share a node, and which share a local \
                   rank? Each split needs a color (who is together) and a key (the order inside). Then \
                   follow one rank's shard: after the reduce-scatter inside its node it holds the node's \
                   sum of 1/3 of the buffer; which communicator sums that shard over the nodes, and \
                   which gives every shard back to every rank?",
            more: "Step 1: the node's communicator takes the node as its color and the local rank as its \
                   key, and `across` the other way round: node = s.split(node as i32, local as i32)? and \
                   across = s.split(local as i32, node as i32)?. Step 2: reduce-scatter `buf` into `shard` \
                   inside the node, s.on(&mut h.node, |s| s.reduce_scatter_into(buf, shard, \
                   ReduceOp::Sum))?; step 3: all-reduce that shard across the nodes, s.on(&mut h.across, \
                   |s| s.all_reduce(shard, ReduceOp::Sum))?; step 4: all-gather every rank's shard back \
                   into `buf` inside the node, s.on(&mut h.node, |s| s.all_gather_into(shard, buf)).",
        },
        Exercise {
            number: 13,
            title: "an all-to-all in one group",
            code: Some(Code {
                dir: "13_grouped_alltoall",
                cases: grouped_alltoall_cases,
            }),
            hint: "A group is opened by the session and ended by its own end(): everything issued on it in \
                   between progresses together. Which blocks go where: block j of `send` to rank j, block i \
                   of `recv` from rank i, every rank but yourself. If the compiler says a block of `recv` is \
                   borrowed twice, look at how you walk over it: the group keeps every buffer until its end.",
            more: "Open one group, issue in it a send of block j of `send` to every other rank j and a \
                   receive of block i of `recv` from every other rank i, then end it. In code: let rank = \
                   s.rank(); let mut g = s.group()?; then for (peer, block) in \
                   send.iter().enumerate() with peer != rank, g.send(block, peer)?; for (peer, block) in \
                   recv.iter_mut().enumerate() with peer != rank, g.recv(block, peer)?; and last g.end(). \
                   Without the group (--no-group) the large case deadlocks: every rank's first send waits \
                   for a peer that is itself sending.",
        },
        Exercise {
            number: 14,
            title: "DDP's buckets, behind the backward",
            code: Some(Code {
                dir: "14_ddp_buckets",
                cases: crate::buckets::cases,
            }),
            hint: "Two loops. In the first, after each layer's compute, append its gradient to the bucket; when \
                   the bucket is full (bucket.len() * 4 >= bucket_bytes) or the layer is the last, turn it into a \
                   buffer (stream.from_host), issue its all-reduce and keep the Work; std::mem::take empties the \
                   bucket as it hands it over. Do not wait inside that loop. The second loop waits for the works \
                   in order and reads each buffer back.",
            more: "for (k, grad) in grads.into_iter().enumerate() { stream.compute(compute)?; bucket.extend(grad); if \
                   bucket.len() * 4 >= bucket_bytes || k + 1 == layers { let buf = \
                   stream.from_host(std::mem::take(&mut bucket))?; works.push(stream.all_reduce(buf, op)?); } } \
                   then for work in works { let buf = stream.wait(work)?; averaged.extend(stream.to_host(&buf)?); \
                   }. The check reads when each bucket was issued and waited: issued before the next layer \
                   computes, waited after the last.",
        },
    ]
}

/// Every element is the sum over n ranks of r + 1 + 10 × (i mod 1000): one node, nodes of
/// one rank, and grids in between, with counts of one shard per rank and of many.
fn hierarchical_cases(max: usize) -> Vec<Case> {
    let sums = |n: usize| move |_: usize, i: usize| (n * (n + 1) / 2 + 10 * n * (i % 1000)) as f64;
    let mut cases = Vec::new();
    for (n, p) in [(1, 1), (2, 1), (2, 2), (4, 2), (6, 3), (6, 2), (8, 4)] {
        if n > max.max(2) {
            continue;
        }
        let per_node = p.to_string();
        for count in [p, 12, 120_000] {
            let c = count.to_string();
            let args = ["--per-node", &per_node, "--count", &c, "--iters", "1", "--show", "16"];
            cases.push(Case::new(n, &args, "after", shown(count), sums(n)));
        }
    }
    cases
}

/// The elements each rank shows of a buffer of `count` with `--show 16`, as the cases ask.
fn shown(count: usize) -> usize {
    count.min(16)
}

/// What the CPU backend's shared-memory channel from one rank to another holds: a send
/// of more waits for its receiver.
const SHM_CHANNEL: usize = workbook_cpu::transport::shm::SLOT_BYTES * workbook_cpu::transport::shm::SLOTS;

/// Exercise 4's large case: 16 MiB, more than [`SHM_CHANNEL`] (checked below).
const LARGER_THAN_A_CHANNEL: &str = "--size 16M";
const _: () = assert!(16 << 20 > SHM_CHANNEL);

fn worlds(max: usize) -> impl Iterator<Item = usize> {
    2..=max.clamp(2, 5)
}

/// Every rank's average of r + 1 over n ranks is (n + 1) / 2.
fn average_cases(max: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for n in worlds(max) {
        for count in [1, 7, 1000] {
            let mean = (n + 1) as f64 / 2.0;
            let c = count.to_string();
            let args = ["--init", "rank", "--count", &c, "--iters", "1", "--show", "16"];
            cases.push(Case::new(n, &args, "average", shown(count), move |_, _| mean));
        }
    }
    cases
}

/// Every rank ends with the root's 42, 43, 44, ...: roots other than 0, counts of one
/// element, of a few, and of many pieces, and a buffer larger than the shared-memory
/// channel between two ranks ([`SHM_CHANNEL`]): there a send returns only once its peer
/// receives, so that a send nobody receives (a chain whose last rank sends on, to the
/// root) blocks and fails the case, as it would on NCCL, rather than wait in the channel.
fn p2p_broadcast_cases(max: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for algo in ["star", "chain", "pipeline"] {
        // Each size with the elements it has: 16 MiB of f32 are 4 Mi of them.
        for (n, root, size, count) in [
            (2, 1, "--count 7", 7),
            (3, 0, "--count 100003", 100003),
            (4, 3, "--count 1", 1),
            (5, 2, "--count 13", 13),
            (5, 4, "--count 100003", 100003),
            (3, 1, LARGER_THAN_A_CHANNEL, (16 << 20) / 4),
        ] {
            if n > max.max(2) {
                continue;
            }
            let root = root.to_string();
            let (flag, value) = size.split_once(' ').expect("a flag and its value");
            let args = [
                "--algo", algo, "--root", &root, flag, value, "--iters", "1", "--show", "16",
            ];
            cases.push(Case::new(n, &args, "after", shown(count), |_, i| 42.0 + i as f64));
        }
    }
    cases
}

/// Element i of rank r starts as r + 1 + 10 (i mod 1000): the sum over n ranks is
/// n(n+1)/2 + 10 n (i mod 1000). World sizes 2 to 5, counts that none of them divides
/// (and fewer elements than ranks), then one large enough that the sockets' buffers
/// cannot hold a step's chunk: a ring whose ranks all send first deadlocks there.
fn ring_cases(max: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    let sums = |n: usize| move |_: usize, i: usize| (n * (n + 1) / 2 + 10 * n * (i % 1000)) as f64;
    for n in worlds(max) {
        for count in [1, 7, 13, 100003] {
            let c = count.to_string();
            let args = ["--count", &c, "--iters", "1", "--show", "16"];
            cases.push(Case::new(n, &args, "after", shown(count), sums(n)));
        }
    }
    let n = 3.min(max.max(2));
    let args = ["--count", "8000000", "--iters", "1", "--show", "16"];
    cases.push(Case::new(n, &args, "after", shown(8_000_000), sums(n)));
    cases
}

/// Exercise 10: the sums of exercise 5 (element i of rank r starts as r + 1 + 10 (i mod
/// 1000)), on odd and even worlds, a full tree (3 ranks), a root with one child (2), an
/// inner rank with one child (8), five levels (17), and a world of one rank, which has
/// nothing to send (its starting file passes that one case, as it must). Counts below the world
/// size, one that no piece count divides, and 16 pieces, some of them empty.
fn tree_cases(max: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    let sums = |n: usize| move |_: usize, i: usize| (n * (n + 1) / 2 + 10 * n * (i % 1000)) as f64;
    // One rank: no parent, no children, nothing sent.
    let args = ["--count", "7", "--iters", "1", "--show", "16"];
    cases.push(Case::new(1, &args, "after", shown(7), sums(1)));
    for n in [2, 3, 5, 8, 17] {
        if n > max.max(2) {
            continue;
        }
        for (args, count) in [
            (&["--count", "1"][..], 1),
            (&["--count", "7"], 7),
            (&["--count", "100003"], 100003),
            (&["--count", "13", "--pieces", "16"], 13),
        ] {
            let mut args = args.to_vec();
            args.extend(["--iters", "1", "--show", "16"]);
            cases.push(Case::new(n, &args, "after", shown(count), sums(n)));
        }
    }
    cases
}

/// Parameter i starts as i + 1 and rank r's gradient as (r + 1)(i + 1), so after one step
/// of SGD with the average gradient, (n + 1)/2 × (i + 1), parameter i is
/// (i + 1)(1 - lr (n + 1)/2) on every rank; the padding up to n equal shards stays 0.
/// Fewer parameters than ranks, counts that no world size divides, many shards of many
/// elements, and another learning rate. The parameters shown are the padded buffer's.
fn sharded_cases(max: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    let step = |n: usize, count: usize, lr: f64| {
        move |_: usize, i: usize| {
            if i < count {
                (i + 1) as f64 * (1.0 - lr * (n + 1) as f64 / 2.0)
            } else {
                0.0
            }
        }
    };
    for n in worlds(max) {
        for count in [1, 7, 100003] {
            let c = count.to_string();
            let args = ["--count", &c, "--iters", "1", "--show", "16"];
            cases.push(Case::new(
                n,
                &args,
                "after",
                shown(padded(n, count)),
                step(n, count, 0.25),
            ));
        }
    }
    let n = 3.min(max.max(2));
    let args = ["--count", "13", "--lr", "0.125", "--iters", "1", "--show", "16"];
    cases.push(Case::new(n, &args, "after", shown(padded(n, 13)), step(n, 13, 0.125)));
    cases
}

/// `count` parameters padded up to `n` equal shards.
fn padded(n: usize, count: usize) -> usize {
    n * count.div_ceil(n)
}

/// Exercise 12's large case: 1,000,000 elements (3.8 MiB) per block, more than the
/// shared-memory channel between two ranks holds ([`SHM_CHANNEL`]): without a group, a send
/// of it waits for its receiver, which is sending too.
const BLOCK_LARGER_THAN_A_CHANNEL: usize = 1_000_000;
const _: () = assert!(BLOCK_LARGER_THAN_A_CHANNEL * 4 > SHM_CHANNEL);

/// Exercise 12: block i of rank r's receive buffer holds 10 i + r (sent by rank i, for
/// rank r), on 2 to 5 ranks, blocks of one element, of a few, of many, and a block larger
/// than a link holds (where sends made one by one deadlock). The tables show `--show 16`
/// elements of each of the n blocks: element k of the shown row lies in block
/// k / min(16, count).
fn grouped_alltoall_cases(max: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    let block_of = |count: usize| move |rank: usize, k: usize| (10 * (k / shown(count)) + rank) as f64;
    for n in worlds(max) {
        for count in [1, 7, 100003] {
            let c = count.to_string();
            let args = ["--count", &c, "--iters", "1", "--show", "16"];
            cases.push(Case::new(n, &args, "after", n * shown(count), block_of(count)));
        }
    }
    let n = 3.min(max.max(2));
    let c = BLOCK_LARGER_THAN_A_CHANNEL.to_string();
    let args = ["--count", &c, "--iters", "1", "--show", "16"];
    let count = BLOCK_LARGER_THAN_A_CHANNEL;
    cases.push(Case::new(n, &args, "after", n * shown(count), block_of(count)));
    cases
}

/// Element 0 of tensor k is k + 1 on every rank, for both methods: tiny models whose
/// tensors are smaller than the world, and the default one. The tables show element 0 of
/// the first 8 tensors (of 4 + 12 a layer).
fn packed_cases(max: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for method in ["each", "packed"] {
        for (n, root, layers, hidden) in [(2, 1, 2, 8), (3, 0, 24, 8), (4, 3, 1, 3), (5, 2, 0, 1)] {
            if n > max.max(2) {
                continue;
            }
            let (root, l, h) = (root.to_string(), layers.to_string(), hidden.to_string());
            let args = [
                "--method", method, "--root", &root, "--layers", &l, "--hidden", &h, "--iters", "1",
            ];
            let tensors = 4 + 12 * layers;
            cases.push(Case::new(n, &args, "after", tensors.min(8), |_, k| (k + 1) as f64));
        }
    }
    cases
}

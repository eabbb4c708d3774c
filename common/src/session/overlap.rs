//! Overlap: collectives that run while the rank computes, as `torch.distributed`'s
//! `async_op=True` and ProcessGroupNCCL's stream of its own do.
//!
//! [`Session::overlap`] opens a [`Stream`]; a collective issued on it returns at once with a
//! [`Work`], which holds the buffer until [`Stream::wait`] gives it back with the result in
//! it: the compiler refuses a read before the wait (the buffer has moved), as DDP's
//! gradient buckets may not be read before their all-reduce is waited. The collectives of
//! one stream run one after the other, in the order they were issued, as NCCL's kernels do
//! on one CUDA stream.
//!
//! - CPU backend: the stream is a thread of the rank's own (the counterpart of NCCL's
//!   kernel on its stream), which runs the algorithm the tuner picks, with the same
//!   deadlines: a rank that dies while this one waits is named within `--timeout`.
//! - NCCL: as ProcessGroupNCCL does, the collectives go to a communication stream of
//!   their own, each ordered after the computation issued before it by an event, and the
//!   wait polls the event recorded after it, under the watchdog
//!   ([`workbook_nccl::nccl::Nccl::issue_after_compute`]); the layers compute on the GPU, on the
//!   rank's stream ([`Stream::compute`]).

use super::Session;
use crate::backend::{Buffer, Storage};
use crate::collective::{ALL_GATHER, ALL_REDUCE, Collective, REDUCE_SCATTER};
use crate::communicator::{Communicator, cpu_collective};
use crate::compute::Compute;
use anyhow::{Context, Result, anyhow};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use workbook_cpu::Cpu;
use workbook_cpu::host_memory::HostMem;
use workbook_runtime::element::{Element, ReduceOp};

/// One collective for the stream's thread: runs it on the rank's CPU communicator, unless
/// an earlier one failed (the `Option` holds why: NCCL's communicator is broken after an
/// error too, and the later calls fail).
type Job = Box<dyn FnOnce(&mut Cpu, &mut Option<String>) + Send>;

/// What the stream's thread sends back: the buffer with its result, and when the
/// collective started and ended.
type Done<T> = Result<(HostMem<T>, Instant, Instant)>;

/// A rank's communication stream, open for the length of [`Session::overlap`]: the
/// collectives issued on it run in order while the rank goes on computing.
pub struct Stream<'s> {
    queue: Queue<'s>,
    /// "rank 2": who is speaking, in errors.
    who: String,
    rank: usize,
    world: usize,
    /// When the stream opened: the times of [`Stream::log`] count from it.
    opened: Instant,
    /// Collectives issued, and how many were waited.
    issued: usize,
    waited: usize,
    log: Vec<Span>,
    /// `--link` and `--timeout` where the rank has a simulated link: a collective the wire
    /// cannot carry in time is refused as it is issued ([`super::fits_wire`]).
    wire: Option<(workbook_cpu::transport::simulated::Network, Duration)>,
}

/// Where a stream's collectives run.
enum Queue<'s> {
    /// CPU backend: the stream's thread, through its queue.
    Thread(mpsc::Sender<Job>),
    /// NCCL: the communicator's communication stream.
    Nccl(&'s mut Communicator),
}

/// A collective issued on a [`Stream`] and not yet waited: it holds the buffer.
#[must_use = "a collective on a stream is finished only once waited: stream.wait(work)"]
pub struct Work<T: Element> {
    what: &'static str,
    /// Its number on the stream, from 1.
    seq: usize,
    issued: Instant,
    bytes: usize,
    pending: Pending<T>,
}

enum Pending<T: Element> {
    /// On the stream's thread: the answer comes through here.
    Thread(mpsc::Receiver<Done<T>>),
    /// Queued on NCCL's communication stream, with the event after it.
    Nccl(Buffer<T>, workbook_nccl::nccl::Issued),
}

/// One collective of a stream, once waited: what it was, when it was issued, when it ran
/// (on the CPU backend), when the wait returned, in seconds since the stream opened.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Span {
    /// "all-reduce".
    pub what: &'static str,
    /// Its number on the stream, from 1.
    pub seq: usize,
    /// Bytes of its buffer.
    pub bytes: usize,
    /// When it was issued.
    pub issued: f64,
    /// When it started and ended on the stream's thread (the CPU backend; NCCL's kernel
    /// times are the GPU's, `None` here).
    pub ran: Option<(f64, f64)>,
    /// When [`Stream::wait`] returned it.
    pub waited: f64,
}

impl Span {
    /// Its buffer's size as people read it: "4.0 MiB".
    pub fn size(&self) -> String {
        workbook_runtime::units::human_bytes(self.bytes)
    }
}

/// A stream, in the JSON report: its collectives (in the order waited) and the layers
/// computed while it was open ([`crate::compute::Compute::layer`]), in seconds since it
/// opened: what tells whether communication ran behind computation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamReport {
    /// Its collectives.
    pub collectives: Vec<Span>,
    /// Each layer computed: when it started and ended (on NCCL: when its kernel was queued).
    pub computing: Vec<(f64, f64)>,
}

impl Session {
    /// Runs `body` with a communication stream of this rank's own ([`Stream`]): the
    /// collectives issued on it run while `body` goes on computing, and each is finished
    /// when [`Stream::wait`] returns its buffer. Every collective issued must be waited
    /// before `body` returns (an error says how many were not). Every rank of the
    /// communicator issues the same collectives in the same order, as with
    /// [`Session::all_reduce`].
    pub fn overlap<R>(&mut self, body: impl FnOnce(&mut Stream<'_>) -> Result<R>) -> Result<R> {
        let who = self.who();
        let place = (self.comm.rank(), self.comm.world());
        if let Communicator::Cpu(cpu) = &mut self.comm {
            let cpu: &mut Cpu = cpu;
            let limit = cpu.wire_limit();
            std::thread::scope(|scope| {
                let (jobs, queue) = mpsc::channel::<Job>();
                let thread = std::thread::Builder::new()
                    .name(format!("{who} stream"))
                    .spawn_scoped(scope, move || {
                        let mut failed = None;
                        for job in queue {
                            job(cpu, &mut failed);
                        }
                    })
                    .with_context(|| format!("{who}: starting the stream's thread"))?;
                let mut stream = Stream::new(Queue::Thread(jobs), who.clone(), place, limit);
                let out = body(&mut stream);
                let (unwaited, report) = stream.close();
                self.report.streams.push(report);
                // The queue is closed: the thread ends after the collectives issued, each
                // within the deadline.
                thread
                    .join()
                    .map_err(|_| anyhow!("{who}: the stream's thread panicked"))?;
                // The body's own error first: a wait that failed leaves the rest unwaited.
                out.and_then(|r| unwaited.map(|()| r))
            })
        } else {
            nccl(&self.comm).open_comm_stream()?;
            let mut stream = Stream::new(Queue::Nccl(&mut self.comm), who, place, None);
            let out = body(&mut stream);
            let (unwaited, report) = stream.close();
            self.report.streams.push(report);
            // After a failure the communicator is aborted: nothing left to wait for.
            let closed = match &out {
                Ok(_) => nccl(&self.comm).close_comm_stream(),
                Err(_) => {
                    nccl(&self.comm).forget_comm_stream();
                    Ok(())
                }
            };
            out.and_then(|r| unwaited.and(closed).map(|()| r))
        }
    }
}

impl<'s> Stream<'s> {
    fn new(
        queue: Queue<'s>,
        who: String,
        (rank, world): (usize, usize),
        wire: Option<(workbook_cpu::transport::simulated::Network, Duration)>,
    ) -> Stream<'s> {
        Stream {
            wire,
            queue,
            who,
            rank,
            world,
            opened: Instant::now(),
            issued: 0,
            waited: 0,
            log: Vec::new(),
        }
    }

    /// All-reduce on the stream (`ncclAllReduce`, `dist.all_reduce(t, async_op=True)`):
    /// returns at once; [`Stream::wait`] gives `buf` back holding the `op` of every rank's.
    pub fn all_reduce<T: Element>(&mut self, buf: Buffer<T>, op: ReduceOp) -> Result<Work<T>> {
        self.issue(&ALL_REDUCE, buf, op)
    }

    /// All-gather in place on the stream (FSDP's prefetch of the next layer's
    /// parameters): `buf` holds n blocks, this rank's at block `rank`; once waited, block
    /// i holds rank i's.
    pub fn all_gather<T: Element>(&mut self, buf: Buffer<T>) -> Result<Work<T>> {
        self.issue(&ALL_GATHER, buf, ReduceOp::Sum)
    }

    /// Reduce-scatter in place on the stream (FSDP's gradients): `buf` holds n blocks;
    /// once waited, block `rank` holds the `op` of every rank's block `rank`.
    pub fn reduce_scatter<T: Element>(&mut self, buf: Buffer<T>, op: ReduceOp) -> Result<Work<T>> {
        self.issue(&REDUCE_SCATTER, buf, op)
    }

    /// Waits until `work` is done and gives its buffer back, with the result in it; an
    /// error names the rank and the collective (a peer that died: within `--timeout`).
    pub fn wait<T: Element>(&mut self, work: Work<T>) -> Result<Buffer<T>> {
        self.waited += 1;
        let what = format!("{}: {} #{} on the stream", self.who, work.what, work.seq);
        let (buf, ran) = match work.pending {
            Pending::Thread(answer) => {
                let (mem, start, end) = answer
                    .recv()
                    .map_err(|_| anyhow!("{what}: the stream's thread ended before it"))??;
                let since = |t: Instant| t.duration_since(self.opened).as_secs_f64();
                let buf = Buffer {
                    storage: Storage::Host(mem),
                };
                (buf, Some((since(start), since(end))))
            }
            Pending::Nccl(buf, issued) => {
                let Queue::Nccl(comm) = &self.queue else {
                    unreachable!("NCCL's work comes from NCCL's stream")
                };
                nccl(comm).wait_issued(issued).with_context(|| what.clone())?;
                (buf, None)
            }
        };
        let now = Instant::now();
        self.log.push(Span {
            what: work.what,
            seq: work.seq,
            bytes: work.bytes,
            issued: work.issued.duration_since(self.opened).as_secs_f64(),
            ran,
            waited: now.duration_since(self.opened).as_secs_f64(),
        });
        Ok(buf)
    }

    /// A buffer holding `data`, where this backend computes (the session's
    /// [`Session::from_host`], which is busy while the stream is open).
    pub fn from_host<T: Element>(&mut self, data: Vec<T>) -> Result<Buffer<T>> {
        match &self.queue {
            Queue::Thread(_) => Ok(Buffer {
                storage: Storage::Host(HostMem::new(data)),
            }),
            Queue::Nccl(comm) => comm.upload(data),
        }
    }

    /// A buffer's elements, read back (the session's [`Session::to_host`]).
    pub fn to_host<T: Element>(&self, buf: &Buffer<T>) -> Result<Vec<T>> {
        match &self.queue {
            Queue::Thread(_) => {
                workbook_runtime::limits::try_copy(crate::backend::host(buf), "a copy of a buffer to read")
            }
            Queue::Nccl(comm) => comm.download(buf, buf.len()),
        }
    }

    /// Computes one layer where this backend computes, and says for how long: on the CPU
    /// backend, on this core, now; on NCCL, a kernel on the GPU, queued after the work
    /// issued so far (the call returns at once, as a launch does: the time is the kernel's).
    pub fn compute(&mut self, compute: &Compute) -> Result<Duration> {
        match &self.queue {
            Queue::Thread(_) => Ok(compute.layer()),
            Queue::Nccl(comm) => {
                nccl(comm).compute(compute.time).with_context(|| self.who.clone())?;
                crate::compute::launched();
                Ok(compute.time)
            }
        }
    }

    /// Waits until what this rank computed has finished (NCCL: its kernels; the CPU
    /// backend computes as it goes): a step ends there.
    pub fn finish(&mut self) -> Result<()> {
        match &self.queue {
            Queue::Thread(_) => Ok(()),
            Queue::Nccl(comm) => comm.synchronize().with_context(|| self.who.clone()),
        }
    }

    /// The rank's number on the stream's communicator, and the number of ranks.
    pub fn rank_and_world(&self) -> (usize, usize) {
        (self.rank, self.world)
    }

    /// The collectives waited so far, in the order they were waited.
    pub fn log(&self) -> &[Span] {
        &self.log
    }

    /// The layers computed since the stream opened: each one's start and end, in seconds
    /// since then (on NCCL, when its kernel was queued).
    pub fn computed(&self) -> Vec<(f64, f64)> {
        let since = |t: Instant| t.duration_since(self.opened).as_secs_f64();
        crate::compute::computed_after(self.opened)
            .into_iter()
            .map(|(start, end)| (since(start), since(end)))
            .collect()
    }

    /// How long since the stream opened.
    pub fn elapsed(&self) -> Duration {
        self.opened.elapsed()
    }

    /// Checks the buffer, numbers the call and hands it to the stream.
    fn issue<T: Element>(&mut self, coll: &'static Collective, buf: Buffer<T>, op: ReduceOp) -> Result<Work<T>> {
        let count = coll
            .count_of(None, buf.len(), self.world)
            .map_err(|why| workbook_runtime::error::usage(format!("{}: {why}", self.who)))?;
        super::fits_wire(self.wire, buf.len() * size_of::<T>())?;
        self.issued += 1;
        // The test hook `NCCL_WORKBOOK_FAULT=die-on-stream:RANK`: that rank is killed as it
        // issues its second collective, while the others' first ones are in flight.
        if self.issued == 2 && workbook_runtime::fault::asked("die-on-stream", Some(self.rank)).is_some() {
            // SAFETY: raise has no memory effects; the process ends at once.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        let (seq, what, bytes) = (self.issued, coll.title(), buf.len() * size_of::<T>());
        let issued = Instant::now();
        let pending = match &mut self.queue {
            Queue::Thread(jobs) => {
                let Storage::Host(mut mem) = buf.storage else {
                    unreachable!("the CPU backend's buffers live in host memory")
                };
                let (answer, answered) = mpsc::sync_channel::<Done<T>>(1);
                let who = self.who.clone();
                let job: Job = Box::new(move |cpu, failed| {
                    let _span =
                        workbook_runtime::record::collective(&format!("{what} #{seq} (on the stream)"), bytes as u64);
                    let start = Instant::now();
                    let out = match failed.as_ref() {
                        Some(why) => Err(anyhow!(
                            "{who}: {what} #{seq} on the stream did not run: an earlier one failed ({why})"
                        )),
                        None => cpu_collective(cpu, coll.title(), coll, None, &mut mem, count, 0, op)
                            .with_context(|| format!("{who}: {what} #{seq} on the stream")),
                    };
                    if let Err(e) = &out {
                        failed.get_or_insert_with(|| format!("{e:#}"));
                    }
                    // The waiter may be gone (its body failed first): nobody to tell.
                    let _ = answer.send(out.map(|()| (mem, start, Instant::now())));
                });
                jobs.send(job)
                    .map_err(|_| anyhow!("{}: the stream's thread has ended", self.who))?;
                Pending::Thread(answered)
            }
            Queue::Nccl(comm) => {
                let mut buf = buf;
                let on = || format!("{}: {what} #{seq} on the stream", self.who);
                nccl(comm).issue_after_compute().with_context(on)?;
                comm.collective(coll.title(), coll, None, &mut buf, count, 0, op)
                    .with_context(on)?;
                let issued = nccl(comm).issued(&format!("{what} #{seq}")).with_context(on)?;
                Pending::Nccl(buf, issued)
            }
        };
        Ok(Work {
            what,
            seq,
            issued,
            bytes,
            pending,
        })
    }

    /// Closes the stream: an error if a collective issued was never waited, and what the
    /// JSON report says of it.
    fn close(self) -> (Result<()>, StreamReport) {
        let since = |t: Instant| t.duration_since(self.opened).as_secs_f64();
        let report = StreamReport {
            collectives: self.log,
            computing: crate::compute::computed_since(self.opened)
                .into_iter()
                .map(|(start, end)| (since(start), since(end)))
                .collect(),
        };
        let unwaited = match self.issued - self.waited {
            0 => Ok(()),
            n => Err(anyhow!(
                "{}: {n} of the {} collectives issued on the stream were never waited (stream.wait(work))",
                self.who,
                self.issued
            )),
        };
        (unwaited, report)
    }
}

/// The NCCL backend of a communicator that is one (the stream's NCCL side).
fn nccl(comm: &Communicator) -> &workbook_nccl::nccl::Nccl {
    match comm {
        Communicator::Nccl(n) => n,
        Communicator::Cpu(_) => unreachable!("the NCCL stream is opened on NCCL's communicator only"),
    }
}

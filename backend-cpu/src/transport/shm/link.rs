//! The link itself: how a message crosses a channel by each of NCCL's three protocols
//! (Simple's pieces in slots and metadata lines; LL's and LL128's flagged lines, step by
//! step) and the [`Link`] the communicator calls. Waiting for the other side is
//! [`super::wait`]'s; making the channels on first use is [`super::files`]'.

use super::ShmLink;
use super::cpu::{copy_around_cache, prefetch, prefetch_for_write};
use super::layout::{INLINE, PIECES, SLOT_BYTES, SLOTS, SMALL_PIECE, region};
use super::wait::futex_wake;
use crate::transport::protocol::{Protocol, StepHeader, ll, ll128};
use crate::transport::{Link, len_mismatch, op_mismatch, sent};
use std::io;
use std::sync::atomic::Ordering::*;

/// How many pieces ahead the receiver asks for the next metadata lines ([`prefetch`]):
/// with small messages back to back, the transfer of one line from the sender's core
/// (about 60-100 ns here) was half a 4 B broadcast's time; asked for 8 pieces early, it
/// overlaps the pieces before it (2 ranks, 4 B, 0.17 -> 0.12 us per broadcast).
const PREFETCH: u32 = 8;
/// How many pieces ahead the sender asks for a metadata line for writing
/// ([`prefetch_for_write`]). The line's last piece, [`PIECES`] pieces earlier, was read
/// by the receiver, whose core keeps a copy, and a store to the line waits until that
/// copy is gone; x86 commits stores in order, so every store after it waits too. Where a
/// cache line's round trip between the two cores takes about 500 ns (the VM's vCPUs
/// placed far apart), the sender stalled on every piece: a 4 B broadcast on 2 ranks took
/// 0.16 us, and 0.07 with the line asked for 2 pieces early (0.063 -> 0.059 where the
/// round trip is 70-200 ns). One piece ahead is the line the receiver polls while it
/// waits: taking it from under the receiver was slower there (0.09-0.21 us); 4 and more
/// were slower where the round trip is short.
pub(super) const PREFETCH_W: u32 = 2;

/// Simple: a message goes in pieces, each in a slot, a small buffer or its metadata line.
impl ShmLink {
    /// Waits for the next piece of a message `len` bytes long whose first `offset`
    /// bytes have arrived, and returns where it lies (its slot, or its metadata line)
    /// and its length.
    fn next_piece(&self, tag: u8, len: usize, offset: usize) -> io::Result<(*const u8, usize)> {
        let inbox = self.inbox()?;
        let h = inbox.header();
        let tail = self.read.load(Relaxed);
        let m = inbox.meta(tail);
        // SAFETY: `seq` is an atomic in the mapping, written by the sender alone.
        let seq = unsafe { &(*m).seq };
        let next = tail.wrapping_add(1);
        self.wait(
            inbox,
            &h.head,
            &h.receiver_sleeping,
            || seq.load(Acquire) == next,
            io::ErrorKind::UnexpectedEof,
        )?;
        // A sender running ahead has written the next lines already: asking for one
        // [`PREFETCH`] pieces ahead now overlaps its transfer from the sender's core with
        // this piece's work, where a load when it is due would wait the whole transfer.
        prefetch(inbox.meta(tail.wrapping_add(PREFETCH)).cast());
        // SAFETY: the sender wrote this slot's metadata before `seq` (Release), which we
        // have seen (Acquire); it will not touch the slot until `tail` moves.
        let (op, n, inline, message_len, at) = unsafe {
            (
                (*m).op,
                (*m).len as usize,
                (*m).inline != 0,
                (*m).message_len,
                (*m).offset,
            )
        };
        if op != tag as u32 {
            return Err(op_mismatch(self.peer, op as u8, tag));
        }
        if message_len != len as u64 {
            return Err(len_mismatch(self.peer, message_len, len));
        }
        if at != offset as u64 || n > SLOT_BYTES || inline != (n <= INLINE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the shared-memory channel is corrupt",
            ));
        }
        Ok((inbox.place(tail, n), n))
    }

    /// Waits until piece number `head` (the next) of `len` bytes can go: fewer than
    /// [`PIECES`] pieces are unread, and for a piece that needs a large slot, fewer than
    /// [`SLOTS`]. Returns that number.
    fn free_slot(&self, len: usize) -> io::Result<u32> {
        if len > SMALL_PIECE {
            self.reserve(Protocol::Simple)?;
        }
        let h = self.out()?.header();
        let head = h.head.load(Relaxed);
        let room = if len <= SMALL_PIECE { PIECES } else { SLOTS } as u32;
        // The receiver's `tail` as last read: while it shows room, this side need not
        // fetch the receiver's line again.
        if head.wrapping_sub(self.tail_seen.load(Relaxed)) < room {
            return Ok(head);
        }
        self.wait(
            self.out()?,
            &h.tail,
            &h.sender_sleeping,
            || {
                let tail = h.tail.load(Acquire);
                self.tail_seen.store(tail, Relaxed);
                head.wrapping_sub(tail) < room
            },
            io::ErrorKind::BrokenPipe,
        )?;
        Ok(head)
    }

    /// Publishes piece number `head`, filled: `len` bytes at `offset` of a
    /// `message_len`-byte message.
    fn publish(&self, head: u32, tag: u8, len: usize, message_len: usize, offset: usize) {
        let out = self.out.get().expect("a channel made by free_slot");
        let h = out.header();
        let m = out.meta(head);
        // SAFETY: the slot is ours until the receiver has seen `seq` and moved `tail`.
        unsafe {
            (*m).op = tag as u32;
            (*m).len = len as u32;
            (*m).inline = (len <= INLINE) as u32;
            (*m).message_len = message_len as u64;
            (*m).offset = offset as u64;
            (*m).seq.store(head.wrapping_add(1), Release); // the piece is in
        }
        // The line of the piece [`PREFETCH_W`] ahead, once the receiver is done with it
        // (as far as this side knows): asking for it while the receiver still reads its
        // piece there would take it from the receiver.
        let ahead = head.wrapping_add(PREFETCH_W);
        if self.prefetch_w && ahead.wrapping_sub(self.tail_seen.load(Relaxed)) < PIECES as u32 {
            prefetch_for_write(out.meta(ahead).cast());
        }
        // For a receiver asleep on `head`; SeqCst, so that either this side sees
        // `receiver_sleeping` or the receiver sees the piece before it sleeps.
        h.head.fetch_add(1, SeqCst);
        if h.receiver_sleeping.load(SeqCst) != 0 {
            futex_wake(&h.head);
        }
    }

    /// Hands the slot back to the sender.
    fn release(&self) {
        let h = self.inbox.get().expect("a channel opened by next_piece").header();
        self.read.store(self.read.load(Relaxed).wrapping_add(1), Relaxed);
        h.tail.fetch_add(1, SeqCst);
        if h.sender_sleeping.load(SeqCst) != 0 {
            futex_wake(&h.tail);
        }
    }
}

/// LL and LL128: a message goes in steps, each written line by line into the protocol's
/// ring of steps and read line by line as each line's flag arrives.
impl ShmLink {
    /// The protocol a message tagged `tag` goes by: the collective's, Simple for
    /// point-to-point messages (which no tuner chose a protocol for).
    fn protocol_for(&self, tag: u8) -> Protocol {
        match tag {
            crate::SEND_RECV_TAG => Protocol::Simple,
            _ => Protocol::from_index(self.proto.load(Relaxed)),
        }
    }

    /// Data bytes per step of `p` (LL or LL128).
    fn step_data(p: Protocol) -> usize {
        match p {
            Protocol::Ll => ll::STEP_DATA,
            _ => ll128::STEP_DATA,
        }
    }

    /// Waits until the next step of `p` may be written (fewer than the ring's steps are
    /// unread) and returns its number.
    fn free_step(&self, p: Protocol) -> io::Result<u32> {
        self.reserve(p)?;
        let f = &self.out()?.header().fifos[p as usize];
        let steps = match p {
            Protocol::Ll => ll::STEPS,
            _ => ll128::STEPS,
        } as u32;
        let head = f.head.load(Relaxed);
        let seen = &self.fifo_tail_seen[p as usize];
        // The receiver's `tail` as last read: while it shows room, its line stays unread.
        if head.wrapping_sub(seen.load(Relaxed)) < steps {
            return Ok(head);
        }
        self.wait(
            self.out()?,
            &f.tail,
            &f.sender_sleeping,
            || {
                let tail = f.tail.load(Acquire);
                seen.store(tail, Relaxed);
                head.wrapping_sub(tail) < steps
            },
            io::ErrorKind::BrokenPipe,
        )?;
        Ok(head)
    }

    /// Sends `data` by `p` (LL or LL128), step by step.
    fn send_steps(&self, p: Protocol, tag: u8, data: &[u8]) -> io::Result<()> {
        let mut offset = 0;
        loop {
            let n = Self::step_data(p).min(data.len() - offset);
            let step = self.free_step(p)?;
            let h = StepHeader {
                tag,
                len: n,
                message_len: data.len() as u64,
            };
            let flag = step.wrapping_add(1);
            let piece = &data[offset..offset + n];
            match p {
                Protocol::Ll => ll::write(self.out()?.ll_step(step), flag, h, piece),
                // SAFETY: `free_step` said the receiver has handed this step back.
                _ => unsafe { ll128::write(self.out()?.ll128_step(step), flag as u64, h, piece) },
            }
            // The lines carry their own news; `head` is for a receiver asleep on it.
            let f = &self.out()?.header().fifos[p as usize];
            f.head.fetch_add(1, SeqCst);
            if f.receiver_sleeping.load(SeqCst) != 0 {
                futex_wake(&f.head);
            }
            sent::count(p);
            offset += n;
            if offset >= data.len() {
                return Ok(());
            }
        }
    }

    /// Receives the step of `p` that holds bytes `offset..offset + dst.len()` of a
    /// message of `len` bytes into `dst`, checking its header first.
    fn recv_step(&self, p: Protocol, tag: u8, len: usize, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        let f = &self.inbox()?.header().fifos[p as usize];
        if !self.seen_reserved[p as usize].load(Relaxed) {
            // The ring's pages exist once the sender reserved them: polling its lines
            // before would make them here (or, on a full /dev/shm, raise SIGBUS).
            let flag = &self.inbox()?.header().reserved[p as usize];
            self.wait(
                self.inbox()?,
                &f.head,
                &f.receiver_sleeping,
                || flag.load(Acquire) != 0,
                io::ErrorKind::UnexpectedEof,
            )?;
            self.inbox()?.populate(region(p));
            self.seen_reserved[p as usize].store(true, Relaxed);
        }
        let read = &self.fifo_read[p as usize];
        let step = read.load(Relaxed);
        let flag = step.wrapping_add(1);
        let mut wait = |ready: &dyn Fn() -> bool| {
            self.wait(
                self.inbox()?,
                &f.head,
                &f.receiver_sleeping,
                ready,
                io::ErrorKind::UnexpectedEof,
            )
        };
        let (h, expected) = match p {
            Protocol::Ll => (
                ll::read_header(self.inbox()?.ll_step(step), flag, &mut wait)?,
                len as u32 as u64, // LL's header holds the low 32 bits
            ),
            // SAFETY: this step is the receiver's until `tail` moves past it.
            _ => (
                unsafe { ll128::read_header(self.inbox()?.ll128_step(step), flag as u64, &mut wait)? },
                len as u64,
            ),
        };
        if h.tag != tag {
            return Err(op_mismatch(self.peer, h.tag, tag));
        }
        if h.message_len != expected {
            return Err(len_mismatch(self.peer, h.message_len, len));
        }
        if h.len != dst.len() || offset + h.len > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the shared-memory channel is corrupt",
            ));
        }
        match p {
            Protocol::Ll => ll::read_data(self.inbox()?.ll_step(step), flag, dst, &mut wait)?,
            // SAFETY: as above.
            _ => unsafe { ll128::read_data(self.inbox()?.ll128_step(step), flag as u64, dst, &mut wait)? },
        }
        read.store(step.wrapping_add(1), Relaxed);
        f.tail.fetch_add(1, SeqCst);
        if f.sender_sleeping.load(SeqCst) != 0 {
            futex_wake(&f.tail);
        }
        Ok(())
    }

    /// Receives a message of `len` bytes by `p` into `dst`, step by step.
    fn recv_steps_into(&self, p: Protocol, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        let len = dst.len();
        let mut offset = 0;
        loop {
            let n = Self::step_data(p).min(len - offset);
            self.recv_step(p, tag, len, offset, &mut dst[offset..offset + n])?;
            offset += n;
            if offset >= len {
                return Ok(());
            }
        }
    }

    /// Receives a message of `len` bytes by `p`, handing each step to `each` from a
    /// buffer of this thread's (the lines hold flags between the data: no step can be
    /// read where it lies, as a Simple slot is).
    fn recv_steps_pieces(
        &self,
        p: Protocol,
        tag: u8,
        len: usize,
        each: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()> {
        thread_local! {
            static STAGING: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
        }
        let mut buf = STAGING.take();
        let mut offset = 0;
        let result = loop {
            let n = Self::step_data(p).min(len - offset);
            if buf.len() < n {
                buf.resize(n, 0);
            }
            if let Err(e) = self.recv_step(p, tag, len, offset, &mut buf[..n]) {
                break Err(e);
            }
            each(offset, &buf[..n]);
            offset += n;
            if offset >= len {
                break Ok(());
            }
        };
        STAGING.set(buf);
        result
    }
}

impl ShmLink {
    /// The rank at the other end.
    pub fn peer(&self) -> usize {
        self.peer
    }
}

impl Link for ShmLink {
    fn set_protocol(&self, proto: Protocol) {
        self.proto.store(proto as u8, Relaxed);
    }

    fn protocol(&self) -> Protocol {
        Protocol::from_index(self.proto.load(Relaxed))
    }

    fn send(&self, tag: u8, data: &[u8]) -> io::Result<()> {
        let p = self.protocol_for(tag);
        if p != Protocol::Simple {
            return self.send_steps(p, tag, data);
        }
        let mut offset = 0;
        loop {
            let n = SLOT_BYTES.min(data.len() - offset);
            let piece = self.free_slot(n)?;
            // SAFETY: the piece's place is free (see `free_slot`) and holds n bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(offset), self.out()?.place(piece, n), n) };
            self.publish(piece, tag, n, data.len(), offset);
            sent::count(Protocol::Simple);
            offset += n;
            if offset >= data.len() {
                return Ok(());
            }
        }
    }

    /// A message that fits a slot is written in place: `fill` gets the free slot itself.
    fn send_with(&self, tag: u8, len: usize, fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>) -> io::Result<()> {
        if let p @ (Protocol::Ll | Protocol::Ll128) = self.protocol_for(tag) {
            // The lines hold flags between the data: `fill` writes into a buffer of this
            // thread's, kept from call to call (a fresh one would cost page faults).
            thread_local! {
                static OUT: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
            }
            let mut buf = OUT.take();
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let sent = fill(&mut buf[..len]).and_then(|()| self.send_steps(p, tag, &buf[..len]));
            OUT.set(buf);
            return sent;
        }
        if len > SLOT_BYTES {
            let mut buf = vec![0u8; len];
            fill(&mut buf)?;
            return self.send(tag, &buf);
        }
        let piece = self.free_slot(len)?;
        // SAFETY: the piece's place is free (see `free_slot`) and holds len bytes; the
        // receiver will not read it before `publish`.
        fill(unsafe { std::slice::from_raw_parts_mut(self.out()?.place(piece, len), len) })?;
        self.publish(piece, tag, len, len, 0);
        sent::count(Protocol::Simple);
        Ok(())
    }

    fn recv_into(&self, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        let p = self.protocol_for(tag);
        if p != Protocol::Simple {
            return self.recv_steps_into(p, tag, dst);
        }
        let len = dst.len();
        self.recv_pieces(tag, len, &mut |off, piece| {
            dst[off..off + piece.len()].copy_from_slice(piece)
        })
    }

    /// Copies each piece out with non-temporal stores, which go to memory without first
    /// reading the destination into the cache: on a large buffer, a third less memory
    /// traffic than a plain copy.
    fn recv_into_streaming(&self, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        let p = self.protocol_for(tag);
        if p != Protocol::Simple {
            return self.recv_steps_into(p, tag, dst);
        }
        let len = dst.len();
        self.recv_pieces(tag, len, &mut |off, piece| {
            copy_around_cache(&mut dst[off..off + piece.len()], piece)
        })
    }

    /// Zero-copy: `each` reads each piece in its slot (`scratch` is not needed).
    fn recv_pieces(&self, tag: u8, len: usize, each: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        let p = self.protocol_for(tag);
        if p != Protocol::Simple {
            return self.recv_steps_pieces(p, tag, len, each);
        }
        let mut offset = 0;
        loop {
            let (at, n) = self.next_piece(tag, len, offset)?;
            // SAFETY: `at` holds `n` bytes the sender published; they stay ours until `release`.
            let piece = unsafe { std::slice::from_raw_parts(at, n) };
            each(offset, piece);
            self.release();
            offset += n;
            if offset >= len {
                return Ok(());
            }
        }
    }

    fn describe(&self) -> String {
        format!("rank {} over shared memory", self.peer)
    }

    /// The whole ring of the link's protocol: the sender can fill every slot (or step)
    /// before the receiver takes one.
    fn eager_limit(&self) -> usize {
        match self.protocol() {
            Protocol::Simple => SLOTS * SLOT_BYTES,
            Protocol::Ll => ll::STEPS * ll::STEP_DATA,
            Protocol::Ll128 => ll128::STEPS * ll128::STEP_DATA,
        }
    }
}

//! A simulated network (`--link 5us,10Gbps`): TCP links that take the time a fabric's
//! would, so that a laptop's emulated nodes show what a cluster's network does to the
//! algorithms (a message time dominated by the latency α, a link's bandwidth β).
//!
//! Each message is timed by its sender as one network card of that speed would carry it:
//! a rank's sends, to whichever peer, leave one after the other through its one card
//! (NCCL's ranks share their node's NICs too), each occupying it for `bytes / bandwidth`
//! (the sender waits that long, as a blocking send waits for the wire), and a message
//! arrives `latency` after its last byte left. Receiving is not limited: many senders to
//! one rank (incast) arrive as fast as they leave. The sender tells the receiver that moment (a small message before the
//! data), and the receiver hands nothing over before it. Messages in flight overlap, as on
//! a real link: a pipeline of pieces pays the latency once. Both ends read one clock, so
//! the ranks must share one machine (the emulated nodes of a rehearsal do).

use super::Link;
use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The simulated link's speed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Network {
    /// From the last byte leaving to its arrival.
    pub latency: Duration,
    /// Bits per second on each link, each way.
    pub bits_per_second: f64,
}

impl Network {
    /// Reads `LATENCY,BANDWIDTH`: `5us,10Gbps`, `1ms,100Mbps`, `0,25Gbps` (latency in ns,
    /// us, ms or s; bandwidth in bps, Kbps, Mbps, Gbps or Tbps, bits per second). One line
    /// saying what is wrong otherwise.
    pub fn parse(text: &str) -> Result<Network, String> {
        let (lat, bw) = text
            .split_once(',')
            .ok_or_else(|| format!("'{text}' is not LATENCY,BANDWIDTH (for instance 5us,10Gbps)"))?;
        let (latency, bits_per_second) = (latency(lat.trim())?, bandwidth(bw.trim())?);
        Ok(Network {
            latency,
            bits_per_second,
        })
    }

    /// How long `bytes` occupy a link.
    pub fn transfer(&self, bytes: usize) -> Duration {
        Duration::from_secs_f64(bytes as f64 * 8.0 / self.bits_per_second)
    }

    /// Whether a buffer of `bytes` crosses this link within `timeout` (its transfer and
    /// its latency): a collective whose buffer does not is refused before it runs, in one
    /// line, rather than every rank waiting on a wire that is still busy past the deadline.
    pub fn carries(&self, bytes: usize, timeout: Duration) -> Result<(), String> {
        let takes = self.transfer(bytes) + self.latency;
        if takes <= timeout {
            return Ok(());
        }
        let human = workbook_runtime::units::human_duration;
        Err(format!(
            "--link ({}): a buffer of {} takes {} to cross it, longer than --timeout ({}): raise --timeout \
             above {}, or use a smaller buffer or a faster link",
            self.describe(),
            workbook_runtime::units::human_bytes(bytes),
            human(takes),
            human(timeout),
            human(takes)
        ))
    }

    /// As a person reads it: `5 µs, 10 Gbit/s`.
    pub fn describe(&self) -> String {
        format!("{}, {}", self.latency_text(), self.bandwidth_text())
    }

    /// The latency: `5 µs`, `1.5 ms`.
    pub fn latency_text(&self) -> String {
        match self.latency.as_secs_f64() * 1e6 {
            x if x >= 1000.0 => format!("{} ms", trim(x / 1000.0)),
            x => format!("{} µs", trim(x)),
        }
    }

    /// The bandwidth: `10 Gbit/s`.
    pub fn bandwidth_text(&self) -> String {
        match self.bits_per_second {
            x if x >= 1e12 => format!("{} Tbit/s", trim(x / 1e12)),
            x if x >= 1e9 => format!("{} Gbit/s", trim(x / 1e9)),
            x => format!("{} Mbit/s", trim(x / 1e6)),
        }
    }
}

/// A number without needless decimals: 5, 2.5, 0.125.
fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `5us`, `1.5ms`, `0`: at most a second.
fn latency(t: &str) -> Result<Duration, String> {
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("latency '{t}' is not a number with a unit (5us, 1ms)"))?;
    let secs = match unit.to_ascii_lowercase().as_str() {
        "" if n == 0.0 => 0.0,
        "ns" => n * 1e-9,
        "us" | "µs" => n * 1e-6,
        "ms" => n * 1e-3,
        "s" => n,
        "" => return Err(format!("latency '{t}' needs a unit: ns, us, ms or s")),
        u => return Err(format!("latency '{t}' has an unknown unit '{u}' (ns, us, ms or s)")),
    };
    if !(0.0..=1.0).contains(&secs) {
        return Err(format!("latency '{t}' is out of range (0 to 1 s)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `10Gbps`, `100Mbps`: 1 Mbit/s to 100 Tbit/s.
fn bandwidth(t: &str) -> Result<f64, String> {
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("bandwidth '{t}' is not a number with a unit (10Gbps, 100Mbps)"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "bps" => 1.0,
        "kbps" => 1e3,
        "mbps" => 1e6,
        "gbps" => 1e9,
        "tbps" => 1e12,
        "" => {
            return Err(format!(
                "bandwidth '{t}' needs a unit: Mbps, Gbps or Tbps (bits per second)"
            ));
        }
        u => {
            return Err(format!(
                "bandwidth '{t}' has an unknown unit '{u}' (bps, Kbps, Mbps, Gbps or Tbps: bits per second)"
            ));
        }
    };
    let bps = n * scale;
    if !(1e6..=1e14).contains(&bps) {
        return Err(format!("bandwidth '{t}' is out of range (1 Mbps to 100 Tbps)"));
    }
    Ok(bps)
}

/// A link that carries its messages at the speed of a [`Network`], through this rank's one
/// simulated network card.
pub struct SimulatedLink {
    inner: Box<dyn Link>,
    net: Network,
    /// The clock both ends read: the arrival times they exchange count from it.
    origin: Instant,
    /// `--timeout`: how far ahead a message may be announced (see [`SimulatedLink::arrival`]).
    timeout: Duration,
}

/// When this rank's simulated network card is next free to send: every simulated link of
/// the process sends through it, one message after the other.
static CARD_FREE_AT: Mutex<Option<Instant>> = Mutex::new(None);

impl SimulatedLink {
    /// `inner` at the speed of `net`; no wait lasts longer than `timeout`.
    pub fn new(inner: Box<dyn Link>, net: Network, timeout: Duration) -> SimulatedLink {
        SimulatedLink {
            inner,
            net,
            origin: boot_origin(),
            timeout,
        }
    }

    /// When the message of `len` bytes announced next arrives, as its sender's stamp says.
    /// A stamp later than the link could need (the message's own time on the wire, its
    /// latency, and the sender's card busy for at most `--timeout` with earlier messages)
    /// is not a rank of this job's: refused as a protocol error naming the peer, never
    /// slept on.
    fn arrival(&self, tag: u8, len: usize) -> io::Result<Instant> {
        let mut stamp = [0u8; 8];
        self.inner.recv_into(tag, &mut stamp)?;
        let at = Duration::from_nanos(u64::from_le_bytes(stamp));
        let latest = Instant::now() + self.net.transfer(len) + self.net.latency + self.timeout;
        match self.origin.checked_add(at).filter(|t| *t <= latest) {
            Some(t) => Ok(t),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} announced a message of {} arriving {} from now, later than the simulated link could need: \
                     not a rank of this job, or a broken one",
                    self.inner.describe(),
                    workbook_runtime::units::human_bytes(len),
                    workbook_runtime::units::human_duration(
                        at.saturating_sub(Instant::now().saturating_duration_since(self.origin))
                    )
                ),
            )),
        }
    }
}

impl Link for SimulatedLink {
    fn send(&self, tag: u8, data: &[u8]) -> io::Result<()> {
        let now = Instant::now();
        let left = {
            let mut free = CARD_FREE_AT.lock().unwrap_or_else(|p| p.into_inner());
            let left = free.map_or(now, |f| f.max(now)) + self.net.transfer(data.len());
            *free = Some(left);
            left
        };
        let arrives = (left + self.net.latency).saturating_duration_since(self.origin);
        self.inner.send(tag, &(arrives.as_nanos() as u64).to_le_bytes())?;
        self.inner.send(tag, data)?;
        // A blocking send returns once its last byte has left.
        until(left);
        Ok(())
    }

    // The bytes are taken off the real link at once, and handed over at their simulated
    // arrival: the sender's socket never stalls behind a receiver waiting for the wire
    // (which its --timeout would take for a peer gone silent).
    fn recv_into(&self, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        let arrives = self.arrival(tag, dst.len())?;
        self.inner.recv_into(tag, dst)?;
        until(arrives);
        Ok(())
    }

    fn recv_pieces(&self, tag: u8, len: usize, each: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        let arrives = self.arrival(tag, len)?;
        let mut data = vec![0u8; len];
        self.inner.recv_into(tag, &mut data)?;
        until(arrives);
        each(0, &data);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{}, simulated at {}", self.inner.describe(), self.net.describe())
    }

    fn eager_limit(&self) -> usize {
        self.inner.eager_limit()
    }
}

/// One origin for every process of this machine: the moment the kernel's monotonic clock
/// (which `Instant` reads on Linux) read zero, so that an arrival time one rank computes
/// means the same moment to another.
fn boot_origin() -> Instant {
    let now_ns = workbook_runtime::clock::monotonic_ns();
    let now = Instant::now();
    now.checked_sub(Duration::from_nanos(now_ns)).unwrap_or(now)
}

/// Returns at `t`: sleeps through most of the wait, then yields the core until it is
/// time. The sleep is made precise first (the kernel's timer slack, 50 µs by default, as
/// long as a fast link's latency, set to 1 µs for this thread): ranks that wait on their
/// links leave the cores to the ranks that work, which matters when emulated nodes
/// outnumber the cores.
fn until(t: Instant) {
    precise_sleeps();
    loop {
        let now = Instant::now();
        if now >= t {
            return;
        }
        let left = t - now;
        if left > Duration::from_micros(20) {
            std::thread::sleep(left - Duration::from_micros(10));
        } else {
            std::thread::yield_now();
        }
    }
}

/// Sets this thread's timer slack to 1 µs (Linux's `PR_SET_TIMERSLACK`), once per thread.
fn precise_sleeps() {
    thread_local!(static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if !DONE.get() {
        // SAFETY: prctl with PR_SET_TIMERSLACK takes one integer argument and changes only
        // this thread's timer slack; it cannot fail in a way that matters here.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
        DONE.set(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_read_as_latency_and_bandwidth_in_bits() {
        let n = Network::parse("5us,10Gbps").unwrap();
        assert_eq!(n.latency, Duration::from_micros(5));
        assert_eq!(n.bits_per_second, 1e10);
        assert_eq!(n.describe(), "5 µs, 10 Gbit/s");
        assert_eq!(n.transfer(1250), Duration::from_micros(1));
        assert_eq!(
            Network::parse(" 1.5ms , 100Mbps ").unwrap().describe(),
            "1.5 ms, 100 Mbit/s"
        );
        assert_eq!(Network::parse("0,25GBPS").unwrap().latency, Duration::ZERO);
    }

    /// A link that hands over what it was given: a stamp, then a message.
    struct Canned(Mutex<Vec<Vec<u8>>>);

    impl Link for Canned {
        fn send(&self, _: u8, _: &[u8]) -> io::Result<()> {
            Ok(())
        }
        fn recv_into(&self, _: u8, dst: &mut [u8]) -> io::Result<()> {
            let next = self.0.lock().unwrap().remove(0);
            dst.copy_from_slice(&next);
            Ok(())
        }
        fn recv_pieces(&self, _: u8, _: usize, _: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
            unreachable!()
        }
        fn describe(&self) -> String {
            "rank 1 at 127.0.0.1:9".into()
        }
        fn eager_limit(&self) -> usize {
            0
        }
    }

    /// A stamp from far in the future (a stranger greeting as a rank) is a protocol
    /// error naming the peer, at once; one the link could need is slept on.
    #[test]
    fn a_message_announced_later_than_the_link_could_need_is_refused() {
        let net = Network::parse("0,1Gbps").unwrap();
        let at = |from_now: Duration| {
            let t = (Instant::now() + from_now).duration_since(boot_origin());
            (t.as_nanos() as u64).to_le_bytes().to_vec()
        };
        let link = |stamp: Vec<u8>| {
            let inner = Canned(Mutex::new(vec![stamp, vec![7u8; 4]]));
            SimulatedLink::new(Box::new(inner), net, Duration::from_secs(1))
        };
        let mut got = [0u8; 4];
        let started = Instant::now();
        let e = link(u64::MAX.to_le_bytes().to_vec())
            .recv_into(1, &mut got)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(
            e.to_string().contains("rank 1 at 127.0.0.1:9 announced a message"),
            "{e}"
        );
        let e = link(at(Duration::from_secs(3600))).recv_into(1, &mut got).unwrap_err();
        assert!(
            e.to_string().contains("later than the simulated link could need"),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(1), "refused, not slept on");
        link(at(Duration::from_millis(20))).recv_into(1, &mut got).unwrap();
        assert_eq!(got, [7; 4]);
        assert!(started.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn a_link_carries_what_crosses_it_within_the_timeout() {
        let net = Network::parse("1ms,1Mbps").unwrap();
        assert!(net.carries(125_000, Duration::from_secs(2)).is_ok());
        let e = net.carries(16 << 20, Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("a buffer of 16.0 MiB takes 134.2 s"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn what_a_link_cannot_be_is_refused_in_one_line() {
        for (text, says) in [
            ("5us", "not LATENCY,BANDWIDTH"),
            ("5,10Gbps", "needs a unit"),
            ("5us,10", "needs a unit"),
            ("5parsecs,1Gbps", "unknown unit 'parsecs'"),
            ("5us,10GBs", "unknown unit 'gbs'"),
            ("2s,1Gbps", "out of range"),
            ("5us,10bps", "out of range"),
            ("-5us,1Gbps", "not a number"),
            ("5us,nanGbps", "not a number"),
        ] {
            let e = Network::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
            assert!(!e.contains('\n'));
        }
    }
}

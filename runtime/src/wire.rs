//! Frames: how the store and the CPU backend's connections put bytes on a socket.
//!
//! Every message starts with a 16-byte header: the magic `NCWB`, a protocol version, a
//! kind byte, two reserved bytes and the payload length (u64, little endian). A reader
//! that sees anything else (a port scanner, `curl`, another program) closes that
//! connection: it never guesses. Lengths are checked against a limit before any memory is
//! reserved, so a hostile length cannot make a rank allocate gigabytes.

use std::io::{self, Read, Write};

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"NCWB";
/// Bumped whenever the frame layout or a message's payload changes.
pub const VERSION: u8 = 1;
/// Header size in bytes.
pub const HEADER: usize = 16;

/// Builds a frame header for `kind` and a payload of `len` bytes.
pub fn header(kind: u8, len: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = kind;
    h[8..].copy_from_slice(&len.to_le_bytes());
    h
}

/// Reads and validates one header; returns the kind and the payload length.
pub fn read_header(r: &mut impl Read, max_len: u64) -> io::Result<(u8, u64)> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h)?;
    if h[..4] != MAGIC {
        return Err(bad("not a frame of this program (wrong magic bytes)"));
    }
    if h[4] != VERSION {
        return Err(bad(format!(
            "protocol version {} where this build speaks {VERSION} (mixed builds?)",
            h[4]
        )));
    }
    let len = u64::from_le_bytes(h[8..].try_into().expect("8 bytes"));
    if len > max_len {
        return Err(bad(format!("frame of {len} bytes is over the {max_len}-byte limit")));
    }
    Ok((h[5], len))
}

/// Writes one whole frame.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    w.write_all(&header(kind, payload.len() as u64))?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one whole frame (payload at most `max_len` bytes).
pub fn read_frame(r: &mut impl Read, max_len: u64) -> io::Result<(u8, Vec<u8>)> {
    let (kind, len) = read_header(r, max_len)?;
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok((kind, payload))
}

/// An `InvalidData` error: what a malformed frame becomes.
pub fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Builds a payload out of fields: integers and length-prefixed byte strings.
#[derive(Default)]
pub struct Encoder(pub Vec<u8>);

impl Encoder {
    /// Appends a u64.
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a length-prefixed byte string.
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }
    /// Appends a length-prefixed UTF-8 string.
    pub fn str(self, s: &str) -> Self {
        self.bytes(s.as_bytes())
    }
}

/// Reads fields back out of a payload, failing (never panicking) on short or bad input.
pub struct Decoder<'a>(pub &'a [u8]);

impl<'a> Decoder<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(bad("payload ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// Reads a u64.
    pub fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// Reads a length-prefixed byte string.
    pub fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
        self.take(len as usize)
    }
    /// Reads a length-prefixed UTF-8 string.
    pub fn str(&mut self) -> io::Result<&'a str> {
        std::str::from_utf8(self.bytes()?).map_err(|_| bad("string is not UTF-8"))
    }
    /// Fails unless every byte was read.
    pub fn end(&self) -> io::Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(bad("payload has trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, 7, b"hello").unwrap();
        let (kind, payload) = read_frame(&mut buf.as_slice(), 100).unwrap();
        assert_eq!((kind, payload.as_slice()), (7, &b"hello"[..]));
    }

    #[test]
    fn garbage_and_oversized_frames_are_refused() {
        let err = read_frame(&mut &b"GET / HTTP/1.1\r\n\r\n"[..], 100).unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
        let mut big = header(1, 1 << 40).to_vec();
        big.extend_from_slice(b"x");
        let err = read_frame(&mut big.as_slice(), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
        let mut half = header(1, 10).to_vec();
        half.extend_from_slice(b"abc");
        assert!(read_frame(&mut half.as_slice(), 100).is_err());
    }

    #[test]
    fn random_bytes_never_panic_and_never_pass_for_a_frame() {
        let mut rng = testkit::Xorshift(0x2545_f491_4f6c_dd1d);
        let mut byte = || rng.below(256) as u8;
        for len in 0..2000 {
            let junk: Vec<u8> = (0..len % 97).map(|_| byte()).collect();
            assert!(read_frame(&mut junk.as_slice(), 1 << 20).is_err() || junk.starts_with(&MAGIC));
            let mut d = Decoder(&junk);
            let _ = (d.u64(), d.str(), d.bytes(), d.end());
        }
    }

    #[test]
    fn decoder_never_panics_on_short_input() {
        let p = Encoder::default().u64(5).str("key").bytes(b"v").0;
        let mut d = Decoder(&p);
        assert_eq!(d.u64().unwrap(), 5);
        assert_eq!(d.str().unwrap(), "key");
        assert_eq!(d.bytes().unwrap(), b"v");
        d.end().unwrap();
        for cut in 0..p.len() {
            let mut d = Decoder(&p[..cut]);
            let ok = d.u64().is_ok() && d.str().is_ok() && d.bytes().is_ok();
            assert!(!ok, "a payload cut at {cut} bytes decoded");
        }
    }
}

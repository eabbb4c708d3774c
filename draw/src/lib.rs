//! `--draw FILE.svg`: the collective that ran, as a picture (`FILE.html`: a page that
//! steps through it, [`page`]). One column per step (the first
//! is the start), one lane per rank; each lane holds the rank's buffer cut into its
//! chunks, each element a cell coloured by whose contributions it holds (one rank's colour,
//! a blend of several, or the final colour once it holds every rank's); an arrow per
//! message, from the sender's lane to the receiver's, in the sender's colour (dotted: a
//! read of a peer's memory, the single copy, where nothing is sent).
//!
//! The input is plain data ([`Panel`], [`Move`]), made by the harness from the same record
//! `--steps` prints; what each cell holds is worked out here from the messages alone
//! ([`contributions`]), and drawn with plotters' SVG backend ([`picture`]), whose
//! geometry [`layout`] gives (the tests render the SVG and look at those places).

pub mod contributions;
pub mod layout;
pub mod page;
pub mod palette;
pub mod picture;
pub mod timeline;

pub use page::html;
pub use picture::svg;

/// One communicator's collective: the world's, or one of a split's (a panel each).
#[derive(Clone, Debug)]
pub struct Panel {
    /// What ran: "all-reduce on 4 ranks, ring: 8 elements in 4 chunks".
    pub caption: String,
    /// Each row's name ("rank 2"), in the communicator's order.
    pub labels: Vec<String>,
    /// Each row's rank in the world: its colour and its number in the cells, the same in
    /// every panel.
    pub ranks: Vec<usize>,
    /// Elements in each rank's buffer.
    pub len: usize,
    /// Where the chunks begin and end: `[0, 2, 4, 6, 8]`.
    pub bounds: Vec<usize>,
    /// Each step's name ("reduce-scatter step 1 of 3"), step s at `[s - 1]`.
    pub steps: Vec<String>,
    /// Whether the collective reduces (every rank's elements count from the start).
    pub reducing: bool,
    /// Every message (and read), in no particular order.
    pub moves: Vec<Move>,
}

/// One message, or one read of a peer's memory, as the receiver saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Move {
    /// The step it belongs to, from 1.
    pub step: usize,
    /// The sender's row (the read's peer) and the receiver's.
    pub from: usize,
    pub to: usize,
    /// The elements it came from: of the sender's buffer, of its send buffer (out of
    /// place: only its own contributions), or none (a partial result held nowhere).
    pub source: Source,
    /// The receiver's elements it lands on (none: a partial result, passed on unkept).
    pub into: Option<(usize, usize)>,
    /// What the receiver did with it.
    pub how: How,
    /// A read of the peer's memory (the single copy), not a message.
    pub read: bool,
}

/// Where a message's elements came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source {
    /// Elements of the sender's buffer.
    Buffer(usize, usize),
    /// The partial result the sender made for its elements (pipelined), not written to
    /// them.
    PartialOf(usize, usize),
    /// Elements of its send buffer: its own contribution alone.
    SendBuffer(usize, usize),
    /// The partial result the sender made last (pipelined), held in no buffer.
    Partial,
}

/// What the receiver did with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Put it in place of what the elements held.
    Copy,
    /// Combined it with its own elements (added, for a sum).
    Reduce,
    /// Combined it with its own elements and passed the result on, unkept.
    Partial,
}

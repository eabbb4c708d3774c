//! The workbook's colours, one place for every picture: rank r is `rank(r)` in `--draw`'s
//! lanes and arrows, in `--steps`' row names on a terminal and in the trace's process
//! labels (by name: Perfetto colours slices itself), and the benchmark's plot takes its
//! lines' colours from the same ten, in turn.

/// Tableau's ten, in its order: they stay apart for most colour-blind readers.
pub const TEN: [(u8, u8, u8); 10] = [
    (78, 121, 167),
    (242, 142, 43),
    (225, 87, 89),
    (118, 183, 178),
    (89, 161, 79),
    (237, 201, 72),
    (176, 122, 161),
    (255, 157, 167),
    (156, 117, 95),
    (186, 176, 172),
];

/// Each of [`TEN`]'s names, for text that cannot show the colour.
pub const NAMES: [&str; 10] = [
    "blue", "orange", "red", "teal", "green", "yellow", "purple", "pink", "brown", "grey",
];

/// The colour of world rank `r` (cycling past ten).
pub fn rank(r: usize) -> (u8, u8, u8) {
    TEN[r % TEN.len()]
}

/// The name of world rank `r`'s colour: "blue".
pub fn rank_name(r: usize) -> &'static str {
    NAMES[r % NAMES.len()]
}

/// The colour of a plot's line `i`: the same ten, in turn.
pub fn line(i: usize) -> (u8, u8, u8) {
    TEN[i % TEN.len()]
}

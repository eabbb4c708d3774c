//! The numbers collectives carry and how reductions combine them: NCCL's data types
//! (`ncclFloat`, `ncclHalf`, ...) and reduction operators (`ncclSum`, `ncclAvg`, ...).
//!
//! The CPU backend reduces raw bytes, as NCCL's kernels do: a [`Reduction`] is the pair
//! (type, operator) turned into plain loops once per call, so the ring algorithms are
//! written once for every type.

use clap::ValueEnum;

/// NCCL's element types, with nccl-tests' names (`-d float`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// 32-bit floating point (`ncclFloat`).
    Float,
    /// 64-bit floating point (`ncclDouble`).
    Double,
    /// 32-bit signed integer (`ncclInt32`).
    Int32,
    /// 16-bit floating point (`ncclHalf`): 11 bits of precision, up to 65504.
    Half,
    /// bfloat16 (`ncclBfloat16`): float's range with 8 bits of precision.
    Bfloat16,
}

impl DataType {
    /// nccl-tests' name: `float`, `half`, `bfloat16`...
    pub fn name(self) -> &'static str {
        match self {
            DataType::Float => "float",
            DataType::Double => "double",
            DataType::Int32 => "int32",
            DataType::Half => "half",
            DataType::Bfloat16 => "bfloat16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::Double => 8,
            DataType::Float | DataType::Int32 => 4,
            DataType::Half | DataType::Bfloat16 => 2,
        }
    }
}

/// NCCL's reduction operators (`ncclRedOp_t`), with nccl-tests' names (`-o sum`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReduceOp {
    /// Element-wise sum (`ncclSum`).
    #[default]
    Sum,
    /// Element-wise product (`ncclProd`).
    Prod,
    /// Element-wise maximum (`ncclMax`).
    Max,
    /// Element-wise minimum (`ncclMin`).
    Min,
    /// The sum divided by the number of ranks (`ncclAvg`); integers divide and truncate.
    Avg,
}

impl ReduceOp {
    /// nccl-tests' name: `sum`, `prod`, `max`, `min`, `avg`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }

    /// What NCCL computes for one element from every rank's value (in rank order), in
    /// exact arithmetic: the expected result a check compares with.
    pub fn over(self, values: impl IntoIterator<Item = f64>) -> f64 {
        let values: Vec<f64> = values.into_iter().collect();
        match self {
            ReduceOp::Sum => values.iter().sum(),
            ReduceOp::Prod => values.iter().product(),
            ReduceOp::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
            ReduceOp::Avg => values.iter().sum::<f64>() / values.len().max(1) as f64,
        }
    }

    const fn code(self) -> u8 {
        self as u8
    }

    const fn from_code(code: u8) -> ReduceOp {
        match code {
            1 => ReduceOp::Prod,
            2 => ReduceOp::Max,
            3 => ReduceOp::Min,
            4 => ReduceOp::Avg,
            _ => ReduceOp::Sum,
        }
    }
}

/// A number type the collectives can carry and reduce.
///
/// NCCL's constant for each type and operator is the NCCL backend's to name
/// (`workbook_nccl::nccl::NcclName`): this layer knows no CUDA and no NCCL library.
///
/// # Safety
/// Only for plain numbers with no padding whose every bit pattern is a valid value, and
/// whose size is [`DataType::size`] of [`Element::TYPE`]: both backends move them as
/// bytes (the CPU backend reduces them as bytes; the NCCL backend copies them to and from
/// the GPU as bytes, and NCCL's kernels read them as `TYPE`).
pub unsafe trait Element:
    Copy + Default + PartialEq + PartialOrd + Send + Sync + std::fmt::Display + std::fmt::Debug + 'static
{
    /// Which of NCCL's types it is.
    const TYPE: DataType;
    /// Whether `self` is `expected`, allowing for the type's rounding.
    fn matches(self, expected: Self) -> bool;
    /// The value nearest to `v` (test data are small whole numbers, exact in every type).
    fn from_f64(v: f64) -> Self;
    /// The value as an f64 (for tables and checks).
    fn to_f64(self) -> f64;
    /// `self ⊕ other` for `op` as NCCL computes it: integers wrap around; `Avg` adds
    /// here, and [`Element::divide`] finishes it.
    fn combine(self, other: Self, op: ReduceOp) -> Self;
    /// `self / n`: the last step of `ncclAvg` (integers truncate toward zero).
    fn divide(self, n: usize) -> Self;
}

/// The floating-point types: combine in their own precision (half types through f32).
macro_rules! float_element {
    ($t:ty, $ty:expr, $tol:expr, $to:expr, $from:expr) => {
        // SAFETY: `half`'s 16-bit floats are `repr(transparent)` over a `u16`: plain data,
        // 2 bytes (TYPE's size), every one of the 65,536 bit patterns a value (NaNs included).
        unsafe impl Element for $t {
            const TYPE: DataType = $ty;
            fn matches(self, expected: Self) -> bool {
                let (a, e) = (self.to_f64(), expected.to_f64());
                a == e || (a.is_nan() && e.is_nan()) || (a - e).abs() <= $tol * e.abs().max(1.0)
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                let (a, b) = (self.to_f64(), other.to_f64());
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => Self::from_f64(a + b),
                    ReduceOp::Prod => Self::from_f64(a * b),
                    ReduceOp::Max => Self::from_f64(a.max(b)),
                    ReduceOp::Min => Self::from_f64(a.min(b)),
                }
            }
            fn divide(self, n: usize) -> Self {
                Self::from_f64(self.to_f64() / n as f64)
            }
        }
    };
}

// f32 and f64 get their own arithmetic below (in their precision, vectorised); the
// macro is for the 16-bit types, which compute through f64 and round back once.
float_element!(
    half::f16,
    DataType::Half,
    1e-2,
    |v: half::f16| v.to_f64(),
    half::f16::from_f64
);
float_element!(
    half::bf16,
    DataType::Bfloat16,
    2e-2,
    |v: half::bf16| v.to_f64(),
    half::bf16::from_f64
);

// SAFETY: a plain 32-bit number (4 bytes, TYPE's size); every bit pattern is an f32 (NaNs included).
unsafe impl Element for f32 {
    const TYPE: DataType = DataType::Float;
    fn matches(self, expected: f32) -> bool {
        // NaN is what a reduction over a NaN gives: NaN matches NaN (and nothing else).
        self == expected
            || (self.is_nan() && expected.is_nan())
            || (self - expected).abs() <= 1e-5 * expected.abs().max(1.0)
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn combine(self, other: f32, op: ReduceOp) -> f32 {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => self + other,
            ReduceOp::Prod => self * other,
            ReduceOp::Max => self.max(other),
            ReduceOp::Min => self.min(other),
        }
    }
    fn divide(self, n: usize) -> f32 {
        self / n as f32
    }
}

// SAFETY: a plain 64-bit number (8 bytes, TYPE's size); every bit pattern is an f64 (NaNs included).
unsafe impl Element for f64 {
    const TYPE: DataType = DataType::Double;
    fn matches(self, expected: f64) -> bool {
        self == expected
            || (self.is_nan() && expected.is_nan())
            || (self - expected).abs() <= 1e-12 * expected.abs().max(1.0)
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn combine(self, other: f64, op: ReduceOp) -> f64 {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => self + other,
            ReduceOp::Prod => self * other,
            ReduceOp::Max => self.max(other),
            ReduceOp::Min => self.min(other),
        }
    }
    fn divide(self, n: usize) -> f64 {
        self / n as f64
    }
}

// SAFETY: a plain 32-bit integer (4 bytes, TYPE's size); every bit pattern is an i32.
unsafe impl Element for i32 {
    const TYPE: DataType = DataType::Int32;
    fn matches(self, expected: i32) -> bool {
        self == expected
    }
    fn from_f64(v: f64) -> i32 {
        v as i32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn combine(self, other: i32, op: ReduceOp) -> i32 {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => self.wrapping_add(other),
            ReduceOp::Prod => self.wrapping_mul(other),
            ReduceOp::Max => self.max(other),
            ReduceOp::Min => self.min(other),
        }
    }
    fn divide(self, n: usize) -> i32 {
        self / n as i32
    }
}

/// The bytes of a slice of elements.
pub fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: Element types are plain numbers with no padding.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

/// The bytes of a slice of elements, writable: any bytes make valid elements.
pub fn as_bytes_mut<T: Element>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: Element types are plain numbers, valid for every bit pattern.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data)) }
}

/// One (type, operator) pair as loops over raw bytes: what the CPU backend's
/// algorithms call on what arrives from a link, whatever the type.
#[derive(Clone, Copy)]
pub struct Reduction {
    /// The operator.
    pub op: ReduceOp,
    /// Bytes per element.
    pub elem: usize,
    /// `dst = a ⊕ b`, element by element (all three the same length).
    pub combine: fn(dst: &mut [u8], a: &[u8], b: &[u8]),
    /// `acc = acc ⊕ b`.
    pub accumulate: fn(acc: &mut [u8], b: &[u8]),
    /// `ncclAvg`'s last step on a finished result: every element divided by `n`.
    divide: fn(data: &mut [u8], n: usize),
}

impl Reduction {
    /// The loops for `op` on elements of type `T`.
    pub fn of<T: Element>(op: ReduceOp) -> Reduction {
        const S: u8 = ReduceOp::Sum.code();
        const P: u8 = ReduceOp::Prod.code();
        const MAX: u8 = ReduceOp::Max.code();
        const MIN: u8 = ReduceOp::Min.code();
        type Loops = (fn(&mut [u8], &[u8], &[u8]), fn(&mut [u8], &[u8]));
        let (combine, accumulate): Loops = match op {
            ReduceOp::Sum | ReduceOp::Avg => (combine_bytes::<T, S>, accumulate_bytes::<T, S>),
            ReduceOp::Prod => (combine_bytes::<T, P>, accumulate_bytes::<T, P>),
            ReduceOp::Max => (combine_bytes::<T, MAX>, accumulate_bytes::<T, MAX>),
            ReduceOp::Min => (combine_bytes::<T, MIN>, accumulate_bytes::<T, MIN>),
        };
        Reduction {
            op,
            elem: size_of::<T>(),
            combine,
            accumulate,
            divide: divide_bytes::<T>,
        }
    }

    /// Finishes a reduced result: `ncclAvg` divides by the number of ranks, the other
    /// operators leave it as it is.
    pub fn finish(&self, data: &mut [u8], ranks: usize) {
        if self.op == ReduceOp::Avg {
            (self.divide)(data, ranks)
        }
    }
}

// The loops read and write through unaligned pointers: wire bytes promise no alignment,
// and on x86-64 an unaligned vector load costs the same. Each loop is compiled once per
// (type, operator), and the compiler vectorises it.

fn combine_bytes<T: Element, const OP: u8>(dst: &mut [u8], a: &[u8], b: &[u8]) {
    let n = dst.len().min(a.len()).min(b.len()) / size_of::<T>();
    let (d, a, b) = (
        dst.as_mut_ptr().cast::<T>(),
        a.as_ptr().cast::<T>(),
        b.as_ptr().cast::<T>(),
    );
    for i in 0..n {
        // SAFETY: i < n elements fit in each slice; any bytes are a valid T.
        unsafe {
            let v = a
                .add(i)
                .read_unaligned()
                .combine(b.add(i).read_unaligned(), ReduceOp::from_code(OP));
            d.add(i).write_unaligned(v);
        }
    }
}

fn accumulate_bytes<T: Element, const OP: u8>(acc: &mut [u8], b: &[u8]) {
    let n = acc.len().min(b.len()) / size_of::<T>();
    let (d, b) = (acc.as_mut_ptr().cast::<T>(), b.as_ptr().cast::<T>());
    for i in 0..n {
        // SAFETY: as in combine_bytes.
        unsafe {
            let v = d
                .add(i)
                .read_unaligned()
                .combine(b.add(i).read_unaligned(), ReduceOp::from_code(OP));
            d.add(i).write_unaligned(v);
        }
    }
}

fn divide_bytes<T: Element>(data: &mut [u8], n: usize) {
    let d = data.as_mut_ptr().cast::<T>();
    for i in 0..data.len() / size_of::<T>() {
        // SAFETY: in bounds; any bytes are a valid T.
        unsafe { d.add(i).write_unaligned(d.add(i).read_unaligned().divide(n)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_is_as_large_as_its_type_says() {
        // What the NCCL backend relies on: NCCL reads `count` elements of `TYPE`.
        fn size<T: Element>() -> (usize, usize) {
            (size_of::<T>(), T::TYPE.size())
        }
        for (rust, nccl) in [
            size::<f32>(),
            size::<f64>(),
            size::<i32>(),
            size::<half::f16>(),
            size::<half::bf16>(),
        ] {
            assert_eq!(rust, nccl);
        }
    }

    #[test]
    fn matching_allows_each_types_rounding_only() {
        assert!(3.0f32.matches(3.0));
        assert!(0.3f32.matches(0.1 + 0.2));
        assert!(!2.0f32.matches(3.0));
        assert!(!f32::NAN.matches(1.0) && !1.0f32.matches(f32::NAN));
        assert!(f32::NAN.matches(f32::NAN) && f64::NAN.matches(f64::NAN)); // --value nan
        assert!(half::f16::NAN.matches(half::f16::NAN));
        assert!(!7i32.matches(8));
        let h = |v: f64| half::f16::from_f64(v);
        assert!(h(1.0 / 3.0).matches(h(0.3334)));
        assert!(!h(2.0).matches(h(2.1)));
    }

    #[test]
    fn reductions_follow_nccl_for_every_operator() {
        let (a, b) = ([3i32, -7, i32::MAX], [2i32, 4, 1]);
        let run = |op| {
            let mut out = [0i32; 3];
            (Reduction::of::<i32>(op).combine)(as_bytes_mut(&mut out), as_bytes(&a), as_bytes(&b));
            out
        };
        assert_eq!(run(ReduceOp::Sum), [5, -3, i32::MIN]); // integers wrap
        assert_eq!(run(ReduceOp::Prod), [6, -28, i32::MAX]);
        assert_eq!(run(ReduceOp::Max), [3, 4, i32::MAX]);
        assert_eq!(run(ReduceOp::Min), [2, -7, 1]);
        // avg adds, then divides the finished result (integers truncate toward zero).
        let r = Reduction::of::<i32>(ReduceOp::Avg);
        let mut acc = [7i32, -7, 9];
        (r.accumulate)(as_bytes_mut(&mut acc), as_bytes(&[0, 0, 0]));
        r.finish(as_bytes_mut(&mut acc), 2);
        assert_eq!(acc, [3, -3, 4]);
        let r = Reduction::of::<half::bf16>(ReduceOp::Avg);
        let mut v = [half::bf16::from_f32(3.0)];
        r.finish(as_bytes_mut(&mut v), 2);
        assert_eq!(v[0].to_f32(), 1.5);
    }

    #[test]
    fn unaligned_bytes_reduce_exactly() {
        let mut wire = vec![0u8];
        wire.extend_from_slice(as_bytes(&[10.0f32, 20.0]));
        let mut acc = [1.0f32, 2.0, 3.0];
        (Reduction::of::<f32>(ReduceOp::Sum).accumulate)(as_bytes_mut(&mut acc), &wire[1..]);
        assert_eq!(acc, [11.0, 22.0, 3.0]);
    }
}

//! The element types the probe runs, their test values, and how results are shown.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::{NcclType, sys};

/// The element types the probe can run, with conversions for its test values.
pub trait Value: DeviceRepr + ValidAsZeroBits + NcclType + Copy + Send + Sync + 'static {
    /// The value nearest to `v`.
    fn from_f64(v: f64) -> Self;
    /// The value as an f64 (to show it).
    fn to_f64(self) -> f64;
}

macro_rules! value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
value!(f32, f64, i32, i64, u32, u64, u8, i8);

/// `ncclFloat16` (IEEE binary16), as its bits. The workspace enables cudarc's `f16`
/// feature, so `half::f16` and `half::bf16` would do as types; the probe keeps its own for
/// their conversions, exactly rounded in f64 arithmetic and independent of the double's.
/// half 2's `from_f64` can break a tie the wrong way (to f16 it goes through f32 on x86
/// CPUs with F16C; to bf16 it first drops the f64's low 32 bits):
/// `half::bf16::from_f64(4210689.0)` is 4194304, where the nearest bf16 is 4227072.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
pub struct F16(u16);

/// `ncclBfloat16` (the top half of a float32), as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
pub struct Bf16(u16);

// SAFETY (all four): plain 2-byte values, valid for every bit pattern (zero included).
unsafe impl DeviceRepr for F16 {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for F16 {}
// SAFETY: as above.
unsafe impl DeviceRepr for Bf16 {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for Bf16 {}

impl NcclType for F16 {
    fn as_nccl_type() -> sys::ncclDataType_t {
        sys::ncclDataType_t::ncclFloat16
    }
}

impl NcclType for Bf16 {
    /// NCCL's `ncclBfloat16` is 9. cudarc's nccl-02024 bindings name it; its nccl-02022
    /// ones do not (NCCL's header declares it only where CUDA's bf16 type exists), where 9
    /// is `ncclNumTypes`. The number works with both.
    fn as_nccl_type() -> sys::ncclDataType_t {
        // SAFETY: 9 is a variant of the enum in each of cudarc 0.19's NCCL bindings
        // (ncclBfloat16, or ncclNumTypes where bfloat16 is missing).
        unsafe { std::mem::transmute::<u32, sys::ncclDataType_t>(9) }
    }
}

impl Value for F16 {
    fn from_f64(v: f64) -> Self {
        F16(encode_float(v, 10, 5))
    }
    fn to_f64(self) -> f64 {
        decode_float(self.0, 10, 5)
    }
}

impl Value for Bf16 {
    fn from_f64(v: f64) -> Self {
        Bf16(encode_float(v, 7, 8))
    }
    fn to_f64(self) -> f64 {
        decode_float(self.0, 7, 8)
    }
}

/// `v` as the bits of a 16-bit IEEE-style float with `m` mantissa bits and `e` exponent
/// bits, rounded to nearest, ties to even (too large: infinity).
fn encode_float(v: f64, m: u32, e: u32) -> u16 {
    let bias = (1i32 << (e - 1)) - 1;
    let inf = ((1u32 << e) - 1) << m;
    let sign = if v.is_sign_negative() { 1u32 << (m + e) } else { 0 };
    if v.is_nan() {
        return (inf | 1 << (m - 1)) as u16;
    }
    let a = v.abs();
    let min_normal = 2f64.powi(1 - bias);
    let bits = if a < min_normal {
        // Subnormal: units of the smallest one (rounding up to min_normal gives its bits).
        (a / 2f64.powi(1 - bias - m as i32)).round_ties_even() as u32
    } else if a.is_infinite() {
        inf
    } else {
        let mut x = a.log2().floor() as i32;
        while 2f64.powi(x) > a {
            x -= 1;
        }
        while 2f64.powi(x + 1) <= a {
            x += 1;
        }
        let mut sig = (a / 2f64.powi(x) * 2f64.powi(m as i32)).round_ties_even() as u32;
        if sig == 2 << m {
            (x, sig) = (x + 1, 1 << m);
        }
        if x > bias {
            inf
        } else {
            (((x + bias) as u32) << m) | (sig - (1 << m))
        }
    };
    (sign | bits) as u16
}

/// The value of the bits [`encode_float`] makes.
fn decode_float(b: u16, m: u32, e: u32) -> f64 {
    let bias = (1i32 << (e - 1)) - 1;
    let sign = if (b >> (m + e)) & 1 == 1 { -1.0 } else { 1.0 };
    let ex = (u32::from(b) >> m) & ((1 << e) - 1);
    let man = u32::from(b) & ((1 << m) - 1);
    let magnitude = if ex == 0 {
        f64::from(man) * 2f64.powi(1 - bias - m as i32)
    } else if ex == (1 << e) - 1 {
        if man == 0 { f64::INFINITY } else { f64::NAN }
    } else {
        f64::from(man + (1 << m)) * 2f64.powi(ex as i32 - bias - m as i32)
    };
    sign * magnitude
}

/// What receive buffers hold before a collective: a result never written keeps it.
pub const UNTOUCHED: f64 = 99.0;

/// `n` test values: element `i` is `f(i)`, rounded to `T`.
pub fn values<T: Value>(n: usize, f: impl Fn(usize) -> f64) -> Vec<T> {
    (0..n).map(|i| T::from_f64(f(i))).collect()
}

/// The values as `a,b,c`; past 10 000 of them, only the first 16 and `...`.
pub fn show<T: Value>(v: &[T]) -> String {
    let shown = if v.len() > 10_000 { &v[..16] } else { v };
    let mut s = shown
        .iter()
        .map(|x| x.to_f64().to_string())
        .collect::<Vec<_>>()
        .join(",");
    if shown.len() < v.len() {
        s.push_str(",...");
    }
    s
}

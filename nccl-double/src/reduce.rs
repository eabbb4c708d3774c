//! NCCL's data types and reduction operations, computed on host memory.
//!
//! Sums and products of integers wrap, as on the GPU. `ncclAvg` is the sum divided by the
//! number of ranks: for floats `sum / n`; for integers the wrapped sum divided by `n`,
//! truncated toward zero (NCCL's `SumPostDiv`). Ranks are reduced in rank order, so
//! floating-point results are deterministic (real NCCL's order depends on the algorithm;
//! tests should use values whose sums are exact).
//!
//! Half precision (`ncclFloat16`, IEEE binary16, and `ncclBfloat16`, the top half of a
//! float32): every rank's element is widened to f32, reduced in f32 (in rank order, `avg`
//! dividing the f32 sum), and the result rounded back once, to nearest, ties to even
//! (overflow gives infinity, NaN stays NaN). The conversions are written here by hand:
//! the double depends on no crate. fp8 types are refused.

use std::fmt;

/// `ncclDataType_t`, the types the double reduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    BF16,
}

impl DataType {
    /// The type for NCCL's number, or why it is refused (`ncclInvalidArgument`).
    pub fn from_nccl(v: u32) -> Result<Self, String> {
        Ok(match v {
            0 => Self::I8,
            1 => Self::U8,
            2 => Self::I32,
            3 => Self::U32,
            4 => Self::I64,
            5 => Self::U64,
            6 => Self::F16,
            7 => Self::F32,
            8 => Self::F64,
            9 => Self::BF16,
            10 => return Err("data type 10 (ncclFloat8e4m3) is not supported by the test double".into()),
            11 => return Err("data type 11 (ncclFloat8e5m2) is not supported by the test double".into()),
            _ => return Err(format!("invalid data type {v}")),
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 => 1,
            Self::F16 | Self::BF16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::I8 => "ncclInt8",
            Self::U8 => "ncclUint8",
            Self::I32 => "ncclInt32",
            Self::U32 => "ncclUint32",
            Self::I64 => "ncclInt64",
            Self::U64 => "ncclUint64",
            Self::F16 => "ncclFloat16",
            Self::F32 => "ncclFloat32",
            Self::F64 => "ncclFloat64",
            Self::BF16 => "ncclBfloat16",
        })
    }
}

/// `ncclRedOp_t`, the built-in operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl Op {
    /// NCCL's number for the operation (`ncclSum` is 0), as `NCCL_DEBUG` prints it.
    pub fn to_nccl(self) -> u32 {
        match self {
            Self::Sum => 0,
            Self::Prod => 1,
            Self::Max => 2,
            Self::Min => 3,
            Self::Avg => 4,
        }
    }

    /// The operation for NCCL's number, or why it is refused (`ncclInvalidArgument`).
    pub fn from_nccl(v: u32) -> Result<Self, String> {
        Ok(match v {
            0 => Self::Sum,
            1 => Self::Prod,
            2 => Self::Max,
            3 => Self::Min,
            4 => Self::Avg,
            _ => {
                return Err(format!(
                    "reduction operation {v} is not supported by the test double (no PreMulSum)"
                ));
            }
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Sum => "ncclSum",
            Self::Prod => "ncclProd",
            Self::Max => "ncclMax",
            Self::Min => "ncclMin",
            Self::Avg => "ncclAvg",
        })
    }
}

/// One element type's arithmetic.
trait Elem: Copy + PartialOrd {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div_n(self, n: usize) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self { <$t>::from_ne_bytes(b.try_into().unwrap()) }
            fn store(self, b: &mut [u8]) { b.copy_from_slice(&self.to_ne_bytes()) }
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            // The wrapped sum divided by n, truncated toward zero (C's integer division,
            // as NCCL's SumPostDiv; in i128 so that no n wraps to 0 or a negative).
            fn div_n(self, n: usize) -> Self { (self as i128 / n as i128) as $t }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self { <$t>::from_ne_bytes(b.try_into().unwrap()) }
            fn store(self, b: &mut [u8]) { b.copy_from_slice(&self.to_ne_bytes()) }
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
            fn div_n(self, n: usize) -> Self { self / (n as $t) }
        }
    )*};
}
float_elem!(f32, f64);

fn reduce_as<T: Elem>(shares: &[&[u8]], op: Op) -> Result<Vec<u8>, String> {
    let mut out = crate::memory::try_copy(shares[0])?;
    for share in &shares[1..] {
        for (a, b) in out.chunks_exact_mut(T::SIZE).zip(share.chunks_exact(T::SIZE)) {
            let (x, y) = (T::load(a), T::load(b));
            let r = match op {
                Op::Sum | Op::Avg => x.add(y),
                Op::Prod => x.mul(y),
                Op::Max => {
                    if y > x {
                        y
                    } else {
                        x
                    }
                }
                Op::Min => {
                    if y < x {
                        y
                    } else {
                        x
                    }
                }
            };
            r.store(a);
        }
    }
    if op == Op::Avg {
        for a in out.chunks_exact_mut(T::SIZE) {
            T::load(a).div_n(shares.len()).store(a);
        }
    }
    Ok(out)
}

/// Reduces every rank's share (all of one length, at least one) element by element; an
/// error when host memory for the result is short ([`crate::memory::try_copy`]).
pub fn reduce(shares: &[&[u8]], dtype: DataType, op: Op) -> Result<Vec<u8>, String> {
    match dtype {
        DataType::I8 => reduce_as::<i8>(shares, op),
        DataType::U8 => reduce_as::<u8>(shares, op),
        DataType::I32 => reduce_as::<i32>(shares, op),
        DataType::U32 => reduce_as::<u32>(shares, op),
        DataType::I64 => reduce_as::<i64>(shares, op),
        DataType::U64 => reduce_as::<u64>(shares, op),
        DataType::F32 => reduce_as::<f32>(shares, op),
        DataType::F64 => reduce_as::<f64>(shares, op),
        DataType::F16 => reduce_half(shares, op, f16_to_f32, f32_to_f16),
        DataType::BF16 => reduce_half(shares, op, bf16_to_f32, f32_to_bf16),
    }
}

/// A 2-byte type reduced in f32: widened, reduced, rounded back once.
fn reduce_half(shares: &[&[u8]], op: Op, widen: fn(u16) -> f32, narrow: fn(f32) -> u16) -> Result<Vec<u8>, String> {
    let mut wide: Vec<Vec<u8>> = Vec::new();
    for s in shares {
        let mut w = Vec::new();
        w.try_reserve_exact(2 * s.len())
            .map_err(|_| crate::memory::no_room(2 * s.len()))?;
        w.extend(
            s.chunks_exact(2)
                .flat_map(|c| widen(u16::from_ne_bytes([c[0], c[1]])).to_ne_bytes()),
        );
        wide.push(w);
    }
    let parts: Vec<&[u8]> = wide.iter().map(Vec::as_slice).collect();
    let summed = reduce_as::<f32>(&parts, op)?;
    drop(wide);
    let mut out = Vec::new();
    out.try_reserve_exact(summed.len() / 2)
        .map_err(|_| crate::memory::no_room(summed.len() / 2))?;
    out.extend(
        summed
            .chunks_exact(4)
            .flat_map(|c| narrow(f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).to_ne_bytes()),
    );
    Ok(out)
}

/// IEEE binary16 to f32 (exact: every half is a float).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h >> 10) & 0x1f;
    let man = u32::from(h) & 0x3ff;
    let magnitude = match exp {
        // Zero and subnormals: man units of 2^-24 (exact in f32).
        0 => (man as f32 * 2f32.powi(-24)).to_bits(),
        // Infinities and NaNs (the payload kept, quiet or not).
        0x1f => 0x7f80_0000 | (man << 13),
        _ => ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// f32 to IEEE binary16, rounding to nearest, ties to even; past the largest half
/// (65504, or 65520 and up once rounded) is infinity; a NaN stays a (quiet) NaN.
pub fn f32_to_f16(f: f32) -> u16 {
    let b = f.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man == 0 { 0 } else { 0x200 | (man >> 13) as u16 };
        return sign | 0x7c00 | nan;
    }
    // The half's biased exponent, if the value is a normal half.
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    // Keeps the top bits of `sig` shifted right by `shift`, rounding to nearest even
    // (a carry out of the mantissa correctly moves up the exponent, or to infinity).
    let round = |sig: u32, shift: u32| -> u16 {
        let kept = sig >> shift;
        let rest = sig & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        let up = rest > half || (rest == half && kept & 1 == 1);
        (kept + u32::from(up)) as u16
    };
    if e <= 0 {
        // A subnormal half (or zero): units of 2^-24. Below 2^-25 everything rounds to 0.
        if e < -10 {
            return sign;
        }
        return sign | round(man | 0x80_0000, (14 - e) as u32);
    }
    sign | round(((e as u32) << 23) | man, 13)
}

/// bfloat16 to f32 (exact: the top half of a float).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 to bfloat16, rounding to nearest, ties to even; a NaN stays a (quiet) NaN.
pub fn f32_to_bf16(f: f32) -> u16 {
    let b = f.to_bits();
    if f.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let up = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(up) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Elem>(v: &[T]) -> Vec<u8> {
        let mut b = vec![0; v.len() * T::SIZE];
        for (x, c) in v.iter().zip(b.chunks_exact_mut(T::SIZE)) {
            x.store(c);
        }
        b
    }

    fn back<T: Elem>(b: &[u8]) -> Vec<T> {
        b.chunks_exact(T::SIZE).map(T::load).collect()
    }

    #[test]
    fn every_op_on_floats_and_ints() {
        let (a, b, c) = (bytes(&[1f32, 5.0]), bytes(&[2f32, -1.0]), bytes(&[3f32, 2.0]));
        let s = [&a[..], &b[..], &c[..]];
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Sum).unwrap()), [6.0, 6.0]);
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Prod).unwrap()), [6.0, -10.0]);
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Max).unwrap()), [3.0, 5.0]);
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Min).unwrap()), [1.0, -1.0]);
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Avg).unwrap()), [2.0, 2.0]);
        let (a, b) = (bytes(&[7i32, i32::MAX]), bytes(&[2i32, 1]));
        let s = [&a[..], &b[..]];
        assert_eq!(back::<i32>(&reduce(&s, DataType::I32, Op::Sum).unwrap()), [9, i32::MIN]);
        assert_eq!(
            back::<i32>(&reduce(&s, DataType::I32, Op::Avg).unwrap()),
            [4, i32::MIN / 2]
        );
        let (a, b) = (bytes(&[200u8]), bytes(&[100u8]));
        assert_eq!(
            back::<u8>(&reduce(&[&a[..], &b[..]], DataType::U8, Op::Sum).unwrap()),
            [44]
        );
        // Integer avg: the wrapped sum divided by n, truncated toward zero.
        let (a, b) = (bytes(&[-7i32, 7]), bytes(&[2i32, -2]));
        assert_eq!(
            back::<i32>(&reduce(&[&a[..], &b[..]], DataType::I32, Op::Avg).unwrap()),
            [-2, 2]
        );
        let s: Vec<Vec<u8>> = (0..300).map(|_| bytes(&[1u8])).collect();
        let s: Vec<&[u8]> = s.iter().map(Vec::as_slice).collect();
        // 300 ones wrap to 44 in u8, divided by 300 (not by 300 as u8).
        assert_eq!(back::<u8>(&reduce(&s, DataType::U8, Op::Avg).unwrap()), [0]);
        assert_eq!(DataType::from_nccl(6), Ok(DataType::F16));
        assert_eq!(DataType::from_nccl(9), Ok(DataType::BF16));
        assert!(DataType::from_nccl(10).unwrap_err().contains("ncclFloat8e4m3"));
        assert!(DataType::from_nccl(11).unwrap_err().contains("ncclFloat8e5m2"));
        assert!(DataType::from_nccl(12).unwrap_err().contains("invalid data type 12"));
        assert!(Op::from_nccl(5).is_err());
    }

    #[test]
    fn half_conversions_round_to_nearest_even() {
        // Exact values, both ways.
        for (h, f) in [
            (0x0000, 0.0),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x7bff, 65504.0),
            (0x0400, 2f32.powi(-14)),
            (0x0001, 2f32.powi(-24)),
            (0x03ff, 1023.0 * 2f32.powi(-24)),
            (0x7c00, f32::INFINITY),
            (0xfc00, f32::NEG_INFINITY),
        ] {
            assert_eq!(f32_to_f16(f), h, "{f}");
            assert_eq!(f16_to_f32(h), f, "{h:#x}");
        }
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0f32).to_bits());
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        // Ties to even: 2049 is halfway between 2048 and 2050; 2051 between 2050 and 2052.
        assert_eq!(f16_to_f32(f32_to_f16(2049.0)), 2048.0);
        assert_eq!(f16_to_f32(f32_to_f16(2051.0)), 2052.0);
        assert_eq!(f16_to_f32(f32_to_f16(2049.5)), 2050.0);
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        // Rounding up carries into the exponent, and past 65504 to infinity.
        assert_eq!(f32_to_f16(2047.9), 0x6800);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(1e10), 0x7c00);
        // Subnormals: 2^-25 is a tie (to 0), just above rounds to the smallest.
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.0001), 1);
        assert_eq!(f32_to_f16(3.0 * 2f32.powi(-25)), 2);
        assert_eq!(f32_to_f16(2f32.powi(-14) - 2f32.powi(-26)), 0x0400);
        assert_eq!(f32_to_f16(1e-30), 0);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert!(f16_to_f32(0x7e00).is_nan());

        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
        // 257 is halfway between 256 and 258 (8 significant bits): to even, 256; 259 to 260.
        assert_eq!(bf16_to_f32(f32_to_bf16(257.0)), 256.0);
        assert_eq!(bf16_to_f32(f32_to_bf16(259.0)), 260.0);
        assert_eq!(bf16_to_f32(f32_to_bf16(2520.0)), 2528.0);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        // Against a reference in f64 arithmetic, over a million floats of every range.
        let reference = |f: f32| -> u16 {
            let sign = if f.is_sign_negative() { 0x8000 } else { 0 };
            let a = f64::from(f).abs();
            if a >= 65520.0 {
                return sign | 0x7c00;
            }
            if a < 2f64.powi(-14) {
                return sign | (a * 2f64.powi(24)).round_ties_even() as u16;
            }
            let mut e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
            let mut m = (a / 2f64.powi(e) * 1024.0).round_ties_even() as u16;
            if m == 2048 {
                (e, m) = (e + 1, 1024);
            }
            sign | (((e + 15) as u16) << 10) | (m - 1024)
        };
        for bits in (0..=u32::MAX).step_by(4099) {
            let f = f32::from_bits(bits);
            if !f.is_nan() {
                assert_eq!(f32_to_f16(f), reference(f), "{f:e} ({bits:#x})");
            }
        }
        // Every half survives the round trip.
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if !f.is_nan() {
                assert_eq!(f32_to_f16(f), h, "{h:#x}");
            }
            if !bf16_to_f32(h).is_nan() {
                assert_eq!(f32_to_bf16(bf16_to_f32(h)), h, "{h:#x}");
            }
        }
    }

    #[test]
    fn halves_reduce_in_f32_and_round_once() {
        let h = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| f32_to_f16(*x).to_ne_bytes()).collect() };
        let b = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| f32_to_bf16(*x).to_ne_bytes()).collect() };
        let out = |v: Vec<u8>, w: fn(u16) -> f32| -> Vec<f32> {
            v.chunks_exact(2).map(|c| w(u16::from_ne_bytes([c[0], c[1]]))).collect()
        };
        // 2048 + 1 + 1 = 2050 in f32, exact in half (rounding at each step would give 2048).
        let (x, y, z) = (h(&[2048.0, 3.0]), h(&[1.0, -4.0]), h(&[1.0, 2.0]));
        let s = [&x[..], &y[..], &z[..]];
        assert_eq!(
            out(reduce(&s, DataType::F16, Op::Sum).unwrap(), f16_to_f32),
            [2050.0, 1.0]
        );
        assert_eq!(
            out(reduce(&s, DataType::F16, Op::Prod).unwrap(), f16_to_f32),
            [2048.0, -24.0]
        );
        assert_eq!(
            out(reduce(&s, DataType::F16, Op::Max).unwrap(), f16_to_f32),
            [2048.0, 3.0]
        );
        assert_eq!(
            out(reduce(&s, DataType::F16, Op::Min).unwrap(), f16_to_f32),
            [1.0, -4.0]
        );
        assert_eq!(
            out(reduce(&s, DataType::F16, Op::Avg).unwrap(), f16_to_f32),
            [f16_to_f32(f32_to_f16(2050.0 / 3.0)), 1.0 / 3.0].map(|v| f16_to_f32(f32_to_f16(v)))
        );
        let (x, y) = (b(&[255.0, 1.5]), b(&[2.0, 2.0]));
        let s = [&x[..], &y[..]];
        // 257 ties to 256; 1.5 * 2 = 3.
        assert_eq!(
            out(reduce(&s, DataType::BF16, Op::Sum).unwrap(), bf16_to_f32),
            [256.0, 3.5]
        );
        assert_eq!(
            out(reduce(&s, DataType::BF16, Op::Prod).unwrap(), bf16_to_f32),
            [510.0, 3.0]
        );
        assert_eq!(
            out(reduce(&s, DataType::BF16, Op::Avg).unwrap(), bf16_to_f32),
            [128.0, 1.75]
        );
    }
}

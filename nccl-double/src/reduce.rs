//! NCCL's data types and reduction operations, computed on host memory.
//!
//! Sums and products of integers wrap, as on the GPU. `ncclAvg` is the sum divided by the
//! number of ranks (integer division for integer types). Ranks are reduced in rank
//! order, so floating-point results are deterministic (real NCCL's order depends on the
//! algorithm; tests should use values whose sums are exact).

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
    F32,
    F64,
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
            7 => Self::F32,
            8 => Self::F64,
            6 => return Err("ncclFloat16 is not supported by the test double".into()),
            9..=11 => {
                return Err(format!(
                    "data type {v} (bfloat16/fp8) is not supported by the test double"
                ));
            }
            _ => return Err(format!("invalid data type {v}")),
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 => 1,
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
            Self::F32 => "ncclFloat32",
            Self::F64 => "ncclFloat64",
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
            fn div_n(self, n: usize) -> Self { self / (n as $t) }
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

fn reduce_as<T: Elem>(shares: &[&[u8]], op: Op) -> Vec<u8> {
    let mut out = shares[0].to_vec();
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
    out
}

/// Reduces every rank's share (all of one length, at least one) element by element.
pub fn reduce(shares: &[&[u8]], dtype: DataType, op: Op) -> Vec<u8> {
    match dtype {
        DataType::I8 => reduce_as::<i8>(shares, op),
        DataType::U8 => reduce_as::<u8>(shares, op),
        DataType::I32 => reduce_as::<i32>(shares, op),
        DataType::U32 => reduce_as::<u32>(shares, op),
        DataType::I64 => reduce_as::<i64>(shares, op),
        DataType::U64 => reduce_as::<u64>(shares, op),
        DataType::F32 => reduce_as::<f32>(shares, op),
        DataType::F64 => reduce_as::<f64>(shares, op),
    }
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
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Sum)), [6.0, 6.0]);
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Prod)), [6.0, -10.0]);
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Max)), [3.0, 5.0]);
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Min)), [1.0, -1.0]);
        assert_eq!(back::<f32>(&reduce(&s, DataType::F32, Op::Avg)), [2.0, 2.0]);
        let (a, b) = (bytes(&[7i32, i32::MAX]), bytes(&[2i32, 1]));
        let s = [&a[..], &b[..]];
        assert_eq!(back::<i32>(&reduce(&s, DataType::I32, Op::Sum)), [9, i32::MIN]);
        assert_eq!(back::<i32>(&reduce(&s, DataType::I32, Op::Avg)), [4, i32::MIN / 2]);
        let (a, b) = (bytes(&[200u8]), bytes(&[100u8]));
        assert_eq!(back::<u8>(&reduce(&[&a[..], &b[..]], DataType::U8, Op::Sum)), [44]);
        assert!(DataType::from_nccl(6).unwrap_err().contains("Float16"));
        assert!(Op::from_nccl(5).is_err());
    }
}

//! NCCL's constants for the workbook's element types and operators: `workbook-runtime`
//! names them by its own enums ([`DataType`], [`ReduceOp`]) and links no NCCL, so the
//! mapping to `ncclDataType_t` and `ncclRedOp_t` lives here, with the calls that pass them.

use crate::element::{DataType, ReduceOp};
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};

/// NCCL's constant for a workbook enum: `DataType::Half.nccl()` is `ncclFloat16`,
/// `ReduceOp::Avg.nccl()` is `ncclAvg`. A trait, so that the NCCL backend's calls read as
/// before while the enums themselves stay free of NCCL's bindings.
pub trait NcclName {
    /// NCCL's enum for it (`ncclDataType_t`, `ncclRedOp_t`).
    type Nccl;
    /// NCCL's constant for it.
    fn nccl(self) -> Self::Nccl;
}

impl NcclName for DataType {
    type Nccl = ncclDataType_t;
    fn nccl(self) -> ncclDataType_t {
        match self {
            DataType::Float => ncclDataType_t::ncclFloat32,
            DataType::Double => ncclDataType_t::ncclFloat64,
            DataType::Int32 => ncclDataType_t::ncclInt32,
            DataType::Half => ncclDataType_t::ncclFloat16,
            DataType::Bfloat16 => ncclDataType_t::ncclBfloat16,
        }
    }
}

impl NcclName for ReduceOp {
    type Nccl = ncclRedOp_t;
    fn nccl(self) -> ncclRedOp_t {
        match self {
            ReduceOp::Sum => ncclRedOp_t::ncclSum,
            ReduceOp::Prod => ncclRedOp_t::ncclProd,
            ReduceOp::Max => ncclRedOp_t::ncclMax,
            ReduceOp::Min => ncclRedOp_t::ncclMin,
            ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::nccl::NcclType;

    /// The same constants cudarc gives each Rust type (what the backend passed before the
    /// mapping moved here), and the codes of NCCL's header.
    #[test]
    fn each_type_is_the_one_cudarc_names_for_it() {
        use crate::element::Element;
        fn both<T: Element + NcclType>() -> (ncclDataType_t, ncclDataType_t) {
            (T::TYPE.nccl(), T::as_nccl_type())
        }
        for (ours, cudarcs) in [
            both::<f32>(),
            both::<f64>(),
            both::<i32>(),
            both::<half::f16>(),
            both::<half::bf16>(),
        ] {
            assert_eq!(ours, cudarcs);
        }
        let ops = [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ];
        assert_eq!(ops.map(|o| o.nccl() as u32), [0, 1, 2, 3, 4]);
    }
}

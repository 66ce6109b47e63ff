//! The element types and reduction operations the core understands.

use crate::error::{CoreError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I32,
    I64,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// A floating-point type (every other is an integer).
    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::I64)
    }

    /// The NumPy name (`numpy.dtype(...).name`; bfloat16 is ml_dtypes').
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                CoreError::UnsupportedDtype(format!(
                    "unsupported dtype {name:?}; supported: {}",
                    names(Self::ALL.iter().map(|d| d.name()))
                ))
            })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    /// Sum, then divide by the number of ranks (integers: truncating division, as in C).
    Avg,
    Prod,
    Min,
    Max,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Prod,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|op| op.name() == name)
            .ok_or_else(|| {
                CoreError::InvalidArgument(format!(
                    "unknown op {name:?}; accepted: {}",
                    names(Self::ALL.iter().map(|op| op.name()))
                ))
            })
    }

    /// The element-wise combine that the schedules run; `Avg` divides once at the end.
    pub fn combining(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            op => op,
        }
    }
}

pub(crate) fn names<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

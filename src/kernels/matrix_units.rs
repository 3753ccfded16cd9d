//! The matrix units (cooperative matrices) as the kernels see them: the
//! matrix size a kernel is compiled for, and the configuration an adapter
//! offers that the GEMM and the fused attention kernels run on.

use crate::device::capabilities::Capabilities;

/// The size of the square cooperative matrices a matrix-unit kernel is
/// compiled for: its `COOP` slot holds `shaders/coop16.wgsl` or
/// `shaders/coop8.wgsl` ([`Kernel::slots`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CoopSize {
    /// `coop_mat8x8` (Mesa 26's lavapipe; Apple's simdgroup matrices).
    Eight,
    /// `coop_mat16x16` (NVIDIA's and AMD's tensor and matrix cores).
    Sixteen,
}

impl CoopSize {
    /// Rows (and columns) of one matrix.
    pub fn dim(self) -> u32 {
        match self {
            CoopSize::Eight => 8,
            CoopSize::Sixteen => 16,
        }
    }

    /// The size whose matrices are `dim` x `dim`, if there is one.
    pub fn from_dim(dim: u32) -> Option<CoopSize> {
        match dim {
            8 => Some(CoopSize::Eight),
            16 => Some(CoopSize::Sixteen),
            _ => None,
        }
    }
}

/// The matrix-unit configuration a cooperative-matrix kernel is compiled
/// for: square matrices of `size` with f16 inputs and f32 accumulators, at
/// subgroup scope on an adapter whose subgroups are `subgroup` wide (fixed:
/// the kernels give each subgroup its own block of the workgroup's tile).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CoopShape {
    /// The matrices' size.
    pub size: CoopSize,
    /// The subgroup width.
    pub subgroup: u32,
}

/// The matrix-unit configuration the cooperative-matrix kernels run on here
/// ([`Capabilities::f16_matrix_units`]), or `None` (the f32 kernels run).
pub fn coop_shape(caps: &Capabilities) -> Option<CoopShape> {
    let (n, subgroup) = caps.f16_matrix_units()?;
    Some(CoopShape {
        size: CoopSize::from_dim(n)?,
        subgroup,
    })
}

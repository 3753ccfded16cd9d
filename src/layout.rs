//! Conversions between ONNX's 3D form `[B, S, H·D]` and the 4D form
//! `[B, H, S, D]` the engine computes on.

use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// `[B, S, H·D]` → `[B, H, S, D]` for `heads` heads (ONNX's 3D inputs).
pub fn split_heads(tensor: &'static str, t: &HostTensor, heads: usize) -> Result<HostTensor> {
    let &[b, s, hd] = t.shape() else {
        return Err(Error::Rank {
            tensor,
            expected: "3 ([batch, sequence, heads * head size])",
            got: t.shape().to_vec(),
        });
    };
    if heads == 0 || hd % heads != 0 {
        return Err(Error::InvalidOption {
            name: "q_num_heads/kv_num_heads",
            value: format!("{heads} for {tensor} with last dimension {hd}"),
            reason: "the head count must be positive and divide the last dimension of the 3D input",
        });
    }
    let d = hd / heads;
    let src = t.data();
    let mut out = vec![0.0; src.len()];
    for bi in 0..b {
        for si in 0..s {
            for h in 0..heads {
                let from = (bi * s + si) * hd + h * d;
                let to = ((bi * heads + h) * s + si) * d;
                out[to..to + d].copy_from_slice(&src[from..from + d]);
            }
        }
    }
    // (f16 inputs stay f16: the device keeps them so.)
    Ok(HostTensor::named(tensor, [b, heads, s, d], out)?.into_dtype(t.dtype()))
}

/// `[B, H, S, D]` → `[B, S, H·D]` (ONNX's 3D Y).
pub fn merge_heads(t: &HostTensor) -> Result<HostTensor> {
    let &[b, heads, s, d] = t.shape() else {
        return Err(Error::Rank {
            tensor: "Y",
            expected: "4 ([batch, heads, sequence, head size])",
            got: t.shape().to_vec(),
        });
    };
    let src = t.data();
    let mut out = vec![0.0; src.len()];
    for bi in 0..b {
        for h in 0..heads {
            for si in 0..s {
                let from = ((bi * heads + h) * s + si) * d;
                let to = (bi * s + si) * heads * d + h * d;
                out[to..to + d].copy_from_slice(&src[from..from + d]);
            }
        }
    }
    Ok(HostTensor::named("Y", [b, s, heads * d], out)?.into_dtype(t.dtype()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_merge_is_identity() {
        let t = HostTensor::new([2, 3, 8], (0..48).map(|x| x as f32).collect()).unwrap();
        let four = split_heads("Q", &t, 4).unwrap();
        assert_eq!(four.shape(), &[2, 4, 3, 2]);
        // Batch 0, head 1, position 2 holds elements 2*8 + 2..2*8 + 4.
        assert_eq!(&four.data()[(3 + 2) * 2..(3 + 2) * 2 + 2], &[18.0, 19.0]);
        assert_eq!(merge_heads(&four).unwrap(), t);
        assert!(matches!(
            split_heads("Q", &t, 3),
            Err(Error::InvalidOption { .. })
        ));
        assert!(matches!(
            split_heads("Q", &four, 2),
            Err(Error::Rank { .. })
        ));
        // An f16 tensor stays f16 both ways.
        let half = t.clone().into_dtype(crate::tensor::DType::F16);
        let split = split_heads("Q", &half, 4).unwrap();
        assert_eq!(split.dtype(), crate::tensor::DType::F16);
        assert_eq!(
            merge_heads(&split).unwrap().dtype(),
            crate::tensor::DType::F16
        );
    }
}

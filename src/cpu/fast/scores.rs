//! `qk_matmul_output` modes 0 and 1: the scaled scores (and their softcapped
//! form) of every key, masked or not, for one query block. Modes 2 and 3 are
//! captured by the block kernel itself as it goes (see [`super::block`]).

use super::block::{scores_t, Shared};
use super::math::tanh;
use crate::options::QkMatmulOutputMode;

/// Writes `scale · Q Kᵀ` (mode 0) or its softcapped form (mode 1) for the
/// block's queries (`q`, packed as the block kernel packs them) into `out`
/// (`[rows, T]`), using `st` (`[bk][bq]`) as the tile buffer and `tile` for
/// tiles packed on the way ([`Shared::tile`]).
#[inline(always)]
pub(crate) fn raw_scores<const MR: usize, const NR: usize, const FMA: bool>(
    sh: &Shared<'_>,
    bkv: usize,
    q: &[f32],
    st: &mut [f32],
    (keys, values): (&mut Vec<f32>, &mut Vec<f32>),
    out: &mut [f32],
) {
    let (t_len, bk, bq) = (sh.dims.total_len(), sh.shape.bk, sh.bq);
    let softcap = match sh.options.qk_matmul_output_mode {
        Some(QkMatmulOutputMode::Softcapped) if sh.options.softcap > 0.0 => sh.options.softcap,
        _ => 0.0,
    };
    for (tile, j0) in (0..t_len).step_by(bk).enumerate() {
        let nk = bk.min(t_len - j0);
        let (tile_keys, _, _) = sh.tile(bkv, tile, keys, values);
        scores_t::<MR, NR>(sh, tile_keys, nk, q, st);
        for (r, row) in out.chunks_exact_mut(t_len).enumerate() {
            for (k, o) in row[j0..j0 + nk].iter_mut().enumerate() {
                let x = st[k * bq + r];
                *o = if softcap > 0.0 {
                    softcap * tanh::<FMA>(x / softcap)
                } else {
                    x
                };
            }
        }
    }
}

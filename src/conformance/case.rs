//! One conformance case: problem sizes, mask form and options, and the seeded
//! random inputs they describe.

use std::fmt;

use crate::error::Result;
use crate::options::AttentionOptions;
use crate::problem::AttentionInputs;
use crate::rng::SplitMix64;
use crate::tensor::{HostMask, HostTensor};

/// The attention mask a case carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskForm {
    /// No `attn_mask`.
    None,
    /// A bool mask (about 80% `true`) of the given rank, broadcast as described on [`MaskForm::shape`].
    Bool(u8),
    /// A float mask (normal values, about 10% `-inf`) of the given rank.
    Float(u8),
    /// A bool mask `[Nq, T']` whose last dimension `T'` is shorter than `T`.
    ShortBool,
    /// A bool mask `[B, 1, Nq, T]` in which every third query row is all `false`.
    EmptyRows,
}

impl MaskForm {
    /// The mask's shape for `[B, Hq, Nq, T]`: rank 1 `[T]`, rank 2 `[Nq, T]`,
    /// rank 3 `[Hq, 1, T]`, rank 4 `[B, 1, Nq, T]`.
    pub fn shape(self, batch: usize, q_heads: usize, q_len: usize, total: usize) -> Vec<usize> {
        match self {
            MaskForm::None => Vec::new(),
            MaskForm::Bool(rank) | MaskForm::Float(rank) => match rank {
                1 => vec![total],
                2 => vec![q_len, total],
                3 => vec![q_heads, 1, total],
                _ => vec![batch, 1, q_len, total],
            },
            MaskForm::ShortBool => vec![q_len, total.div_ceil(2)],
            MaskForm::EmptyRows => vec![batch, 1, q_len, total],
        }
    }
}

impl fmt::Display for MaskForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaskForm::None => f.write_str("none"),
            MaskForm::Bool(r) => write!(f, "bool{r}d"),
            MaskForm::Float(r) => write!(f, "float{r}d"),
            MaskForm::ShortBool => f.write_str("short-bool"),
            MaskForm::EmptyRows => f.write_str("empty-rows"),
        }
    }
}

/// A conformance case: everything needed to generate its inputs from a seed.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseSpec {
    /// A short unique name (used by `--filter`).
    pub name: String,
    /// B.
    pub batch: usize,
    /// Hq.
    pub q_heads: usize,
    /// Hkv.
    pub kv_heads: usize,
    /// Nq.
    pub q_len: usize,
    /// Nk (new keys, without the past).
    pub kv_len: usize,
    /// P: past length (0 = no past given).
    pub past_len: usize,
    /// Dk.
    pub head_dim: usize,
    /// Dv.
    pub v_head_dim: usize,
    /// The mask.
    pub mask: MaskForm,
    /// Give random `nonpad_kv_seqlen` (including 0 and T).
    pub nonpad: bool,
    /// Multiplies Q so scores reach this magnitude (1 = ordinary logits).
    pub logit_scale: f32,
    /// Q, K, V and the past as f16 (rounded after generation): Y, the scores
    /// and the presents come back as f16.
    pub f16: bool,
    /// The options (the path is chosen by the runner).
    pub options: AttentionOptions,
}

impl CaseSpec {
    /// A case with no mask, no past and default options.
    pub fn new(
        name: impl Into<String>,
        [batch, q_heads, kv_heads]: [usize; 3],
        [q_len, kv_len]: [usize; 2],
        [head_dim, v_head_dim]: [usize; 2],
    ) -> Self {
        Self {
            name: name.into(),
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len,
            past_len: 0,
            head_dim,
            v_head_dim,
            mask: MaskForm::None,
            nonpad: false,
            logit_scale: 1.0,
            f16: false,
            options: AttentionOptions::default(),
        }
    }

    /// Sets the mask.
    pub fn mask(mut self, mask: MaskForm) -> Self {
        self.mask = mask;
        self
    }

    /// Adds a past of `len` positions.
    pub fn past(mut self, len: usize) -> Self {
        self.past_len = len;
        self
    }

    /// Adds random per-batch lengths.
    pub fn nonpad(mut self) -> Self {
        self.nonpad = true;
        self
    }

    /// Makes Q, K, V and the past f16 tensors.
    pub fn f16(mut self) -> Self {
        self.f16 = true;
        self
    }

    /// Scales the logits so they reach about `scale` in magnitude.
    pub fn logits(mut self, scale: f32) -> Self {
        self.logit_scale = scale;
        self
    }

    /// Changes the options.
    pub fn with(mut self, change: impl FnOnce(&mut AttentionOptions)) -> Self {
        change(&mut self.options);
        self
    }

    /// `B×Hq/Hkv Nq×T Dk/Dv` in one short string.
    pub fn shape_text(&self) -> String {
        let past = if self.past_len > 0 {
            format!("{}+", self.past_len)
        } else {
            String::new()
        };
        format!(
            "{}x{}/{} q{} k{}{} d{}/{}",
            self.batch,
            self.q_heads,
            self.kv_heads,
            self.q_len,
            past,
            self.kv_len,
            self.head_dim,
            self.v_head_dim
        )
    }

    /// Multiply-adds of QKᵀ and PV together, a measure of the case's cost.
    pub fn work(&self) -> u64 {
        let t = (self.past_len + self.kv_len) as u64;
        (self.batch * self.q_heads * self.q_len) as u64
            * t
            * (self.head_dim + self.v_head_dim) as u64
    }

    /// The case's inputs drawn from `seed`.
    pub fn generate(&self, seed: u64) -> Result<CaseInputs> {
        let mut rng = SplitMix64::new(seed ^ fnv1a(&self.name));
        let (b, hq, hkv) = (self.batch, self.q_heads, self.kv_heads);
        let (nq, nk, p, dk, dv) = (
            self.q_len,
            self.kv_len,
            self.past_len,
            self.head_dim,
            self.v_head_dim,
        );
        let total = p + nk;
        // Scores are q·k·scale; unit normals give a standard deviation of about
        // sqrt(dk)·scale = 1, so multiplying Q by logit_scale sets their size.
        let q = HostTensor::named(
            "Q",
            [b, hq, nq, dk],
            rng.try_normal_vec("Q", &[b, hq, nq, dk], self.logit_scale)?,
        )?;
        let k = HostTensor::named(
            "K",
            [b, hkv, nk, dk],
            rng.try_normal_vec("K", &[b, hkv, nk, dk], 1.0)?,
        )?;
        let v = HostTensor::named(
            "V",
            [b, hkv, nk, dv],
            rng.try_normal_vec("V", &[b, hkv, nk, dv], 1.0)?,
        )?;
        let past = if p > 0 {
            Some((
                HostTensor::named(
                    "past_key",
                    [b, hkv, p, dk],
                    rng.try_normal_vec("past_key", &[b, hkv, p, dk], 1.0)?,
                )?,
                HostTensor::named(
                    "past_value",
                    [b, hkv, p, dv],
                    rng.try_normal_vec("past_value", &[b, hkv, p, dv], 1.0)?,
                )?,
            ))
        } else {
            None
        };
        let shape = self.mask.shape(b, hq, nq, total);
        let len: usize = shape.iter().product();
        let mask = match self.mask {
            MaskForm::None => None,
            MaskForm::Bool(_) | MaskForm::ShortBool => Some(HostMask::bool(
                shape,
                (0..len).map(|_| rng.chance(0.8)).collect(),
            )?),
            MaskForm::Float(_) => {
                let values = (0..len)
                    .map(|_| {
                        if rng.chance(0.1) {
                            f32::NEG_INFINITY
                        } else {
                            rng.normal() * 2.0
                        }
                    })
                    .collect();
                Some(HostMask::float(shape, values)?)
            }
            MaskForm::EmptyRows => {
                let cols = total;
                let values = (0..len)
                    .map(|idx| {
                        let row = (idx / cols) % nq;
                        row % 3 != 1 && rng.chance(0.8)
                    })
                    .collect();
                Some(HostMask::bool(shape, values)?)
            }
        };
        let nonpad = self.nonpad.then(|| {
            (0..b)
                .map(|i| match i % 3 {
                    0 => total as i64,
                    1 => rng.below(total + 1) as i64,
                    _ => (total / 2) as i64,
                })
                .collect()
        });
        let (q, k, v, past) = if self.f16 {
            (
                q.into_f16(),
                k.into_f16(),
                v.into_f16(),
                past.map(|(pk, pv)| (pk.into_f16(), pv.into_f16())),
            )
        } else {
            (q, k, v, past)
        };
        Ok(CaseInputs {
            q,
            k,
            v,
            mask,
            past,
            nonpad,
        })
    }
}

/// The owned inputs of a case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseInputs {
    /// Q.
    pub q: HostTensor,
    /// K.
    pub k: HostTensor,
    /// V.
    pub v: HostTensor,
    /// The mask, if any.
    pub mask: Option<HostMask>,
    /// `past_key`, `past_value`, if any.
    pub past: Option<(HostTensor, HostTensor)>,
    /// `nonpad_kv_seqlen`, if any.
    pub nonpad: Option<Vec<i64>>,
}

impl CaseInputs {
    /// Rounds Q, K, V and the past to the nearest f16 values (ties to even),
    /// keeping their dtype: the operands the matrix units multiply under
    /// `Precision::Fast`.
    pub fn round_operands_to_f16(&mut self) {
        let mut tensors = vec![&mut self.q, &mut self.k, &mut self.v];
        if let Some((pk, pv)) = &mut self.past {
            tensors.push(pk);
            tensors.push(pv);
        }
        for tensor in tensors {
            for x in tensor.data_mut() {
                *x = crate::tensor::round_to_f16(*x);
            }
        }
    }

    /// The largest finite `|value|` of V and the past values (0 when none).
    pub fn largest_finite_value(&self) -> f64 {
        let past = self.past.as_ref().map(|(_, pv)| pv.data()).unwrap_or(&[]);
        self.v
            .data()
            .iter()
            .chain(past)
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, &x| m.max(f64::from(x.abs())))
    }

    /// Borrows the inputs as an [`AttentionInputs`].
    pub fn as_inputs(&self) -> AttentionInputs<'_, HostTensor> {
        let mut inputs = AttentionInputs::new(&self.q, &self.k, &self.v);
        if let Some(mask) = &self.mask {
            inputs = inputs.with_mask(mask);
        }
        if let Some((pk, pv)) = &self.past {
            inputs = inputs.with_past(pk, pv);
        }
        inputs.nonpad_kv_seqlen = self.nonpad.as_deref();
        inputs
    }
}

/// FNV-1a of a name, so each case draws different numbers from one seed.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, byte| {
        (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::validate;

    #[test]
    fn generated_inputs_validate() {
        for mask in [
            MaskForm::None,
            MaskForm::Bool(1),
            MaskForm::Bool(2),
            MaskForm::Float(3),
            MaskForm::Float(4),
            MaskForm::ShortBool,
            MaskForm::EmptyRows,
        ] {
            let case = CaseSpec::new("t", [2, 6, 2], [7, 5], [8, 3])
                .mask(mask)
                .past(3);
            let inputs = case.generate(1).unwrap();
            let dims = validate(&inputs.as_inputs(), &case.options).unwrap();
            assert_eq!(dims.total_len(), 8);
            let nonpad = CaseSpec::new("n", [3, 2, 2], [4, 9], [4, 4])
                .nonpad()
                .generate(1)
                .unwrap();
            validate(&nonpad.as_inputs(), &AttentionOptions::default()).unwrap();
        }
    }

    #[test]
    fn same_seed_same_inputs() {
        let case = CaseSpec::new("t", [1, 2, 1], [3, 4], [5, 6]).mask(MaskForm::Float(2));
        assert_eq!(case.generate(9).unwrap(), case.generate(9).unwrap());
        assert_ne!(case.generate(9).unwrap(), case.generate(10).unwrap());
    }
}

//! Kernels' parameter blocks, each defined once in Rust (`uniform_block!`):
//! the `#[repr(C)]` plain-old-data struct written to the uniform buffer, and
//! the list of its 4-byte words ([`UniformBlock::words`]) that a test
//! (`tests/shaders.rs`) compares with the `Params` struct each kernel's WGSL
//! declares, word by word: a field added, dropped or moved on one side fails
//! it instead of silently shifting the other.

/// The type of one 4-byte word of a parameter block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `f32`.
    F32,
}

/// One 4-byte word: the field it belongs to and its type. Fields named
/// `_...` (padding) or `extra...` (a word whose meaning differs by kernel)
/// are compared by type only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word {
    /// The field's name.
    pub name: &'static str,
    /// Its type.
    pub scalar: Scalar,
}

impl Word {
    /// Whether the word's name is its own (not padding, nor a word whose
    /// meaning differs by kernel), so that the WGSL must use it too.
    pub fn is_named(&self) -> bool {
        !self.name.starts_with('_') && !self.name.starts_with("extra")
    }
}

/// A field of a parameter block: a scalar, an array of them, or a nested block.
pub trait Field {
    /// Appends the field's words, named `name`.
    fn push_words(name: &'static str, out: &mut Vec<Word>);
}

macro_rules! scalar_field {
    ($($ty:ty => $scalar:ident),*) => {$(
        impl Field for $ty {
            fn push_words(name: &'static str, out: &mut Vec<Word>) {
                out.push(Word { name, scalar: Scalar::$scalar });
            }
        }
    )*};
}
scalar_field!(u32 => U32, i32 => I32, f32 => F32);

impl<T: Field, const N: usize> Field for [T; N] {
    fn push_words(name: &'static str, out: &mut Vec<Word>) {
        for _ in 0..N {
            T::push_words(name, out);
        }
    }
}

/// A kernel's parameter block.
pub trait UniformBlock: bytemuck::Pod {
    /// Its 4-byte words in order, nested blocks flattened in place.
    fn words() -> Vec<Word>;
}

/// Defines a parameter block: the `#[repr(C)]` `Pod` struct and its
/// [`UniformBlock`] word list (a nested block's fields are spliced in under
/// their own names).
macro_rules! uniform_block {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($(#[$field_meta:meta])* $field_vis:vis $field:ident : $ty:ty),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $($(#[$field_meta])* $field_vis $field: $ty),*
        }

        impl $crate::kernels::uniform::UniformBlock for $name {
            fn words() -> Vec<$crate::kernels::uniform::Word> {
                let mut out = Vec::new();
                $(<$ty as $crate::kernels::uniform::Field>::push_words(stringify!($field), &mut out);)*
                out
            }
        }

        impl $crate::kernels::uniform::Field for $name {
            fn push_words(_: &'static str, out: &mut Vec<$crate::kernels::uniform::Word>) {
                out.extend(<$name as $crate::kernels::uniform::UniformBlock>::words());
            }
        }
    };
}
pub(crate) use uniform_block;

/// The words of the parameter block `kernel` takes: what its WGSL `Params`
/// must declare.
pub fn kernel_words(kernel: crate::kernels::registry::Kernel) -> Vec<Word> {
    use crate::kernels::registry::Kernel as K;
    use crate::kernels::*;
    match kernel {
        K::Gemm | K::GemmSkinny | K::GemmSubgroup | K::GemmCoop(_) => gemm::Params::words(),
        K::GemmCoopPacked(_) => gemm::packed::Params::words(),
        K::CoopPack => gemm::packed::PackParams::words(),
        K::Softmax => softmax::Params::words(),
        K::Mask => mask::Params::words(),
        K::Concat => concat::Params::words(),
        K::FmaPeak => ceilings::FmaParams::words(),
        K::CopyPeak => ceilings::CopyParams::words(),
        K::AttentionFused
        | K::AttentionSubgroup
        | K::AttentionTiled
        | K::AttentionTiledWide
        | K::AttentionTiledShuffle
        | K::AttentionTiledChunked
        | K::AttentionCoop(_)
        | K::AttentionCoopPacked(_)
        | K::AttentionCoopShared(_) => attention::ChunkParams::words(),
        K::AttentionScores
        | K::AttentionDecode
        | K::AttentionDecodeF16
        | K::AttentionDecodeStream
        | K::AttentionDecodeStreamF16 => attention::Params::words(),
        K::AttentionMerge => decode::MergeParams::words(),
        K::ConvertF16 => convert::Params::words(),
        K::Position => position::Params::words(),
        K::LinearFeatures => linear::FeatureParams::words(),
        K::LinearScan => linear::ScanParams::words(),
        K::LinearOutput => linear::OutputParams::words(),
        K::LinearWeights => linear::WeightParams::words(),
        K::AdditiveScores => additive::Params::words(),
        K::Projection => projection::Params::words(),
        K::CacheAppend => cache_append::Params::words(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    uniform_block! {
        struct Inner { a: u32, b: f32 }
    }
    uniform_block! {
        struct Outer { inner: Inner, c: i32, _pad: [u32; 2] }
    }

    #[test]
    fn nested_blocks_and_arrays_flatten_to_their_words() {
        let words = Outer::words();
        let names: Vec<_> = words.iter().map(|w| w.name).collect();
        assert_eq!(names, ["a", "b", "c", "_pad", "_pad"]);
        assert_eq!(words[1].scalar, Scalar::F32);
        assert_eq!(words.len() * 4, std::mem::size_of::<Outer>());
        assert!(!words[3].is_named());
    }
}

//! Kernels' parameter blocks, each defined once in Rust (`uniform_block!`):
//! the `#[repr(C)]` plain-old-data struct written to the uniform buffer, and
//! the list of its 4-byte words ([`UniformBlock::words`]), from which each
//! kernel's WGSL `struct Params` is written ([`ParamsText::wgsl`], spliced
//! in at its `// #include PARAMS` line): there is no second copy to drift.

/// A kernel's parameter block as its WGSL declares it: the block's words,
/// with the names this kernel gives the words a block shares among kernels
/// with other meanings (`extra...`), in the kernel's own `struct Params`.
#[derive(Clone, Copy)]
pub struct ParamsText {
    /// The block's words ([`UniformBlock::words`]).
    pub words: fn() -> Vec<Word>,
    /// `(word, name)`: the kernel's names for the block's shared words.
    pub names: &'static [(&'static str, &'static str)],
}

impl ParamsText {
    /// The block `B`, its words named as the block names them.
    pub const fn of<B: UniformBlock>() -> ParamsText {
        ParamsText {
            words: B::words,
            names: &[],
        }
    }

    /// This block with the kernel's `names` for its shared words.
    pub const fn named(self, names: &'static [(&'static str, &'static str)]) -> ParamsText {
        ParamsText {
            words: self.words,
            names,
        }
    }

    /// The words, each named as this kernel names it.
    pub fn words(&self) -> Vec<Word> {
        (self.words)()
            .into_iter()
            .map(
                |word| match self.names.iter().find(|(from, _)| *from == word.name) {
                    Some(&(_, name)) => Word { name, ..word },
                    None => word,
                },
            )
            .collect()
    }

    /// The WGSL `struct Params` of these words: one field a word, an
    /// array's words numbered (`_pad0`, `_pad1`) but for four at a 16-byte
    /// offset, a `vec4`; each field's Rust doc comment as a WGSL comment
    /// above it.
    pub fn wgsl(&self) -> String {
        let words = self.words();
        let mut out = String::from("struct Params {\n");
        let mut i = 0;
        while i < words.len() {
            let word = words[i];
            let run = words[i..]
                .iter()
                .take_while(|w| w.name == word.name)
                .count();
            if let Some(doc) = word.doc {
                for line in doc.lines() {
                    out += &format!(
                        "    //{}{}\n",
                        if line.is_empty() { "" } else { " " },
                        line.trim()
                    );
                }
            }
            if run == 4 && i % 4 == 0 && !word.name.starts_with('_') {
                // Four words at a 16-byte offset: a vector the kernel indexes.
                out += &format!("    {}: vec4<{}>,\n", word.name, word.scalar.wgsl());
            } else {
                for n in 0..run {
                    let name = match run {
                        1 => word.name.to_string(),
                        _ => format!("{}{n}", word.name),
                    };
                    out += &format!("    {name}: {},\n", words[i + n].scalar.wgsl());
                }
            }
            i += run;
        }
        out += "}\n";
        out
    }
}

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

impl Scalar {
    /// The WGSL type.
    pub fn wgsl(self) -> &'static str {
        match self {
            Scalar::U32 => "u32",
            Scalar::I32 => "i32",
            Scalar::F32 => "f32",
        }
    }
}

/// One 4-byte word: the field it belongs to, its type and doc comment. Fields named
/// `_...` (padding) or `extra...` (a word whose meaning differs by kernel)
/// are compared by type only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word {
    /// The field's name.
    pub name: &'static str,
    /// Its type.
    pub scalar: Scalar,
    /// The field's Rust doc comment, where it has one (the WGSL's comment).
    pub doc: Option<&'static str>,
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
    /// Appends the field's words, named `name`, documented by `doc`.
    fn push_words(name: &'static str, doc: Option<&'static str>, out: &mut Vec<Word>);
}

macro_rules! scalar_field {
    ($($ty:ty => $scalar:ident),*) => {$(
        impl Field for $ty {
            fn push_words(name: &'static str, doc: Option<&'static str>, out: &mut Vec<Word>) {
                out.push(Word { name, scalar: Scalar::$scalar, doc });
            }
        }
    )*};
}
scalar_field!(u32 => U32, i32 => I32, f32 => F32);

impl<T: Field, const N: usize> Field for [T; N] {
    fn push_words(name: &'static str, doc: Option<&'static str>, out: &mut Vec<Word>) {
        for i in 0..N {
            T::push_words(name, doc.filter(|_| i == 0), out);
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
            $($(#[doc = $doc:literal])* $field_vis:vis $field:ident : $ty:ty),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $($(#[doc = $doc])* $field_vis $field: $ty),*
        }

        impl $crate::shader::uniform::UniformBlock for $name {
            fn words() -> Vec<$crate::shader::uniform::Word> {
                let mut out = Vec::new();
                $({
                    let doc: &'static str = concat!($($doc, "\n"),*);
                    let doc = (!doc.is_empty()).then_some(doc.trim_end());
                    <$ty as $crate::shader::uniform::Field>::push_words(stringify!($field), doc, &mut out);
                })*
                out
            }
        }

        impl $crate::shader::uniform::Field for $name {
            fn push_words(
                _: &'static str,
                _: Option<&'static str>,
                out: &mut Vec<$crate::shader::uniform::Word>,
            ) {
                out.extend(<$name as $crate::shader::uniform::UniformBlock>::words());
            }
        }
    };
}
pub(crate) use uniform_block;

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

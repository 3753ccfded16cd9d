//! A pipeline's key: a kernel and the values of its `override` constants.
//! Its text form (`gemm[TRANS_A=0,TRANS_B=1]`) is the wgpu label, so a GPU
//! error names the exact variant.

use std::fmt;

use crate::shader::kernel::Kernel;

/// A kernel plus the values of its override constants: one compiled pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PipelineKey {
    /// The kernel.
    pub kernel: Kernel,
    /// Override constants by name, sorted, as integers (booleans are 0/1).
    pub constants: Vec<(&'static str, i64)>,
}

impl PipelineKey {
    /// A key with no override constants.
    pub fn new(kernel: Kernel) -> Self {
        Self {
            kernel,
            constants: Vec::new(),
        }
    }

    /// Adds an integer override constant.
    pub fn with(mut self, name: &'static str, value: i64) -> Self {
        self.constants.retain(|(n, _)| *n != name);
        self.constants.push((name, value));
        self.constants.sort_unstable();
        self
    }

    /// Adds a boolean override constant.
    pub fn with_flag(self, name: &'static str, value: bool) -> Self {
        self.with(name, i64::from(value))
    }
}

impl fmt::Display for PipelineKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kernel.name())?;
        if !self.constants.is_empty() {
            f.write_str("[")?;
            for (i, (name, value)) in self.constants.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{name}={value}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shader::kernel::{KernelDef, Needs, Origin};
    use crate::shader::uniform::ParamsText;

    macro_rules! made_up {
        ($name:literal) => {
            Kernel::new(&KernelDef {
                name: $name,
                origin: Origin::File("none.wgsl", ""),
                slots: &[],
                bindings: &[],
                params: ParamsText {
                    words: Vec::new,
                    names: &[],
                },
                needs: Needs::CORE,
                specialised_per_call: false,
            })
        };
    }
    const GEMM: Kernel = made_up!("gemm");
    const SOFTMAX: Kernel = made_up!("softmax");

    #[test]
    fn key_text_is_sorted_and_stable() {
        let key = PipelineKey::new(GEMM)
            .with_flag("TRANS_B", true)
            .with_flag("TRANS_A", false);
        assert_eq!(key.to_string(), "gemm[TRANS_A=0,TRANS_B=1]");
        let same = PipelineKey::new(GEMM)
            .with_flag("TRANS_A", false)
            .with_flag("TRANS_B", true);
        assert_eq!(key, same);
        assert_eq!(PipelineKey::new(SOFTMAX).to_string(), "softmax");
    }
}

//! Output files written whole or not at all, and never over an input.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use webattn::HostTensor;

/// Outputs staged in temporary files beside their targets; [`Staged::commit`]
/// renames them all into place. Dropped uncommitted, it removes them.
pub struct Staged {
    files: Vec<(PathBuf, PathBuf)>,
}

impl Staged {
    /// Checks every output path before any work: its folder exists, it is not
    /// a folder, and it is none of the inputs.
    pub fn check_targets(
        outputs: &[(&str, &Path)],
        inputs: &[(&str, &Path)],
    ) -> anyhow::Result<()> {
        let canonical_inputs: Vec<(&str, PathBuf)> = inputs
            .iter()
            .filter_map(|(name, p)| p.canonicalize().ok().map(|c| (*name, c)))
            .collect();
        for (i, (name, path)) in outputs.iter().enumerate() {
            if path.is_dir() {
                bail!(
                    "output {name} ({}) is a directory; give a file path",
                    path.display()
                );
            }
            let folder = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if !folder.is_dir() {
                bail!(
                    "output {name} ({}): folder {} does not exist",
                    path.display(),
                    folder.display()
                );
            }
            if let Ok(target) = folder
                .canonicalize()
                .map(|f| f.join(path.file_name().unwrap_or_default()))
            {
                if let Some((input, _)) = canonical_inputs.iter().find(|(_, c)| *c == target) {
                    bail!("output {name} ({}) would overwrite input {input}; inputs are never modified", path.display());
                }
            }
            if outputs[..i].iter().any(|(_, other)| other == path) {
                bail!("output {name} ({}) is given twice", path.display());
            }
        }
        Ok(())
    }

    pub fn new() -> Self {
        Staged { files: Vec::new() }
    }

    /// Writes `tensor` to a temporary file beside `target`.
    pub fn stage(&mut self, target: &Path, tensor: &HostTensor) -> anyhow::Result<()> {
        let name = target.file_name().unwrap_or_default().to_string_lossy();
        let tmp = target.with_file_name(format!(".{name}.webattn-{}.partial", std::process::id()));
        webattn::npy::write_tensor(&tmp, tensor)?;
        self.files.push((tmp, target.to_path_buf()));
        Ok(())
    }

    /// Renames every staged file into place.
    pub fn commit(mut self) -> anyhow::Result<()> {
        for (tmp, target) in std::mem::take(&mut self.files) {
            std::fs::rename(&tmp, &target)
                .with_context(|| format!("cannot write {}", target.display()))?;
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (tmp, _) in &self.files {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Writes `text` to `path` whole or not at all (a temporary file, then a rename).
pub fn write_text(path: &Path, text: &str) -> anyhow::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.webattn-{}.partial", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            anyhow::anyhow!("cannot write {}: {e}", path.display())
        })
}

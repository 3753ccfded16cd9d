//! Device limits by name: which set to start from (the adapter's own, WebGPU's
//! defaults that every browser guarantees, or wgpu's downlevel set), and single
//! limits lowered by their wgpu names, so one machine can run the engine as a
//! small adapter would (`webattn check --limits webgpu-default`,
//! `--limit max_storage_buffer_binding_size=4MiB`).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Reads or writes one field of [`wgpu::Limits`].
struct LimitField {
    name: &'static str,
    get: fn(&wgpu::Limits) -> u64,
    set: fn(&mut wgpu::Limits, u64) -> std::result::Result<(), ()>,
    /// An alignment: larger is more restrictive (every other limit is a maximum).
    alignment: bool,
}

macro_rules! limit_fields {
    ($($field:ident: $ty:ty $(, $alignment:literal)?);* $(;)?) => {
        &[$(LimitField {
            name: stringify!($field),
            get: |l| l.$field as u64,
            set: |l, v| {
                l.$field = <$ty>::try_from(v).map_err(|_| ())?;
                Ok(())
            },
            alignment: false $(|| $alignment)?,
        }),*]
    };
}

/// The limits a compute engine depends on, by their wgpu names.
const FIELDS: &[LimitField] = limit_fields! {
    max_storage_buffer_binding_size: u64;
    max_buffer_size: u64;
    max_compute_workgroup_storage_size: u32;
    max_compute_invocations_per_workgroup: u32;
    max_compute_workgroup_size_x: u32;
    max_compute_workgroup_size_y: u32;
    max_compute_workgroup_size_z: u32;
    max_compute_workgroups_per_dimension: u32;
    max_storage_buffers_per_shader_stage: u32;
    max_uniform_buffers_per_shader_stage: u32;
    max_uniform_buffer_binding_size: u64;
    max_bind_groups: u32;
    max_bindings_per_bind_group: u32;
    max_dynamic_storage_buffers_per_pipeline_layout: u32;
    max_dynamic_uniform_buffers_per_pipeline_layout: u32;
    max_immediate_size: u32;
    min_storage_buffer_offset_alignment: u32, true;
    min_uniform_buffer_offset_alignment: u32, true;
};

/// The names `--limit` accepts: wgpu's names of the limits compute work depends on.
pub fn limit_names() -> impl Iterator<Item = &'static str> {
    FIELDS.iter().map(|f| f.name)
}

/// The value of the limit called `name` in `limits`, if it is one [`limit_names`] lists.
pub fn limit_value(limits: &wgpu::Limits, name: &str) -> Option<u64> {
    FIELDS
        .iter()
        .find(|f| f.name == name)
        .map(|f| (f.get)(limits))
}

/// Parses a size: a plain number of bytes or units, or a number with a binary
/// (`KiB`, `MiB`, `GiB`) or decimal (`KB`, `MB`, `GB`) suffix, e.g. `4MiB`,
/// `16KiB`, `128`.
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = |reason| Error::InvalidOption {
        name: "limit value",
        value: text.to_string(),
        reason,
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number
        .replace('_', "")
        .parse()
        .map_err(|_| bad("must be a whole number, optionally with KiB, MiB, GiB, KB, MB or GB"))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(bad("the unit must be one of B, KiB, MiB, GiB, KB, MB, GB")),
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| bad("does not fit in 64 bits"))
}

/// One limit set by its wgpu name, as `NAME=VALUE` (`max_storage_buffer_binding_size=4MiB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Index of the limit in `FIELDS`.
    field: usize,
    value: u64,
}

impl LimitOverride {
    /// The override of `name` to `value`; the name must be one of [`limit_names`].
    pub fn new(name: &str, value: u64) -> Result<LimitOverride> {
        let index = FIELDS
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| Error::InvalidOption {
                name: "limit name",
                value: name.to_string(),
                reason: "not a limit webattn can set; use one of wgpu's names: \
                         max_storage_buffer_binding_size, max_buffer_size, \
                         max_compute_workgroup_storage_size, max_compute_invocations_per_workgroup, \
                         max_compute_workgroup_size_x/_y/_z, max_compute_workgroups_per_dimension, \
                         max_storage_buffers_per_shader_stage, max_uniform_buffers_per_shader_stage, \
                         max_uniform_buffer_binding_size, max_bind_groups, max_bindings_per_bind_group, \
                         max_immediate_size, min_storage_buffer_offset_alignment, \
                         min_uniform_buffer_offset_alignment (see `webattn info`)",
            })?;
        let mut probe = wgpu::Limits::default();
        (FIELDS[index].set)(&mut probe, value).map_err(|_| Error::InvalidOption {
            name: "limit value",
            value: format!("{name}={value}"),
            reason: "too large for this limit (it is a 32-bit value)",
        })?;
        Ok(LimitOverride {
            field: index,
            value,
        })
    }

    /// The limit's wgpu name.
    pub fn name(&self) -> &'static str {
        FIELDS[self.field].name
    }

    /// Its value (bytes for sizes, counts otherwise).
    pub fn value(&self) -> u64 {
        self.value
    }

    fn field(&self) -> &'static LimitField {
        &FIELDS[self.field]
    }
}

impl FromStr for LimitOverride {
    type Err = Error;
    fn from_str(text: &str) -> Result<LimitOverride> {
        let (name, value) = text.split_once('=').ok_or_else(|| Error::InvalidOption {
            name: "limit",
            value: text.to_string(),
            reason: "must be NAME=VALUE, e.g. max_storage_buffer_binding_size=4MiB",
        })?;
        LimitOverride::new(name.trim(), parse_size(value)?)
    }
}

impl fmt::Display for LimitOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name(), self.value)
    }
}

/// Which set of limits a device starts from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LimitsPreset {
    /// The adapter's own (its best).
    #[default]
    Adapter,
    /// WebGPU's defaults, which every browser guarantees: 128 MiB per storage
    /// binding, 256 MiB per buffer, 16 KiB of workgroup memory, 256 invocations,
    /// 8 storage buffers per stage. Where the adapter has less, its own value.
    WebGpuDefault,
    /// wgpu's downlevel defaults (older GL and mobile adapters), clamped the same way.
    Downlevel,
    /// Exactly these limits; any beyond the adapter's fail device creation.
    Exact(Box<wgpu::Limits>),
}

impl FromStr for LimitsPreset {
    type Err = Error;
    fn from_str(text: &str) -> Result<LimitsPreset> {
        match text {
            "adapter" => Ok(LimitsPreset::Adapter),
            "webgpu-default" | "webgpu" | "default" => Ok(LimitsPreset::WebGpuDefault),
            "downlevel" => Ok(LimitsPreset::Downlevel),
            _ => Err(Error::InvalidOption {
                name: "limits",
                value: text.to_string(),
                reason: "must be adapter, webgpu-default or downlevel",
            }),
        }
    }
}

/// The limits an engine's device is created with: a preset, then overrides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceLimits {
    /// The set to start from.
    pub preset: LimitsPreset,
    /// Single limits set after the preset, in order.
    pub overrides: Vec<LimitOverride>,
}

impl From<wgpu::Limits> for DeviceLimits {
    fn from(limits: wgpu::Limits) -> DeviceLimits {
        DeviceLimits {
            preset: LimitsPreset::Exact(Box::new(limits)),
            overrides: Vec::new(),
        }
    }
}

impl DeviceLimits {
    /// WebGPU's defaults (see [`LimitsPreset::WebGpuDefault`]).
    pub fn webgpu_default() -> DeviceLimits {
        DeviceLimits {
            preset: LimitsPreset::WebGpuDefault,
            overrides: Vec::new(),
        }
    }

    /// These limits with one more override.
    pub fn with(mut self, name: &str, value: u64) -> Result<DeviceLimits> {
        self.overrides.push(LimitOverride::new(name, value)?);
        Ok(self)
    }

    /// Whether these are simply the adapter's own limits.
    pub fn is_adapter_default(&self) -> bool {
        self.preset == LimitsPreset::Adapter && self.overrides.is_empty()
    }

    /// The limits to request from an adapter whose own are `adapter`. An
    /// override beyond the adapter's capability is an error that names it.
    pub fn resolve(&self, adapter: &wgpu::Limits) -> Result<wgpu::Limits> {
        let clamp_to_adapter = |mut limits: wgpu::Limits| {
            for field in FIELDS {
                let (want, have) = ((field.get)(&limits), (field.get)(adapter));
                let worse = if field.alignment {
                    want.max(have)
                } else {
                    want.min(have)
                };
                // A value read from `adapter` fits the field it came from.
                let _ = (field.set)(&mut limits, worse);
            }
            limits
        };
        let mut limits = match &self.preset {
            LimitsPreset::Adapter => adapter.clone(),
            LimitsPreset::WebGpuDefault => clamp_to_adapter(wgpu::Limits::default()),
            LimitsPreset::Downlevel => clamp_to_adapter(wgpu::Limits::downlevel_defaults()),
            LimitsPreset::Exact(limits) => (**limits).clone(),
        };
        for o in &self.overrides {
            let field = o.field();
            let have = (field.get)(adapter);
            let beyond = if field.alignment {
                o.value < have
            } else {
                o.value > have
            };
            if beyond {
                return Err(Error::InvalidOption {
                    name: "limit",
                    value: format!("{o} (the adapter's is {have})"),
                    reason: "beyond what the adapter supports; limits can only be lowered",
                });
            }
            if field.alignment && !o.value.is_power_of_two() {
                return Err(Error::InvalidOption {
                    name: "limit",
                    value: o.to_string(),
                    reason: "an alignment must be a power of two",
                });
            }
            (field.set)(&mut limits, o.value).map_err(|_| Error::InvalidOption {
                name: "limit",
                value: o.to_string(),
                reason: "too large for this limit",
            })?;
        }
        Ok(limits)
    }
}

impl fmt::Display for DeviceLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.preset {
            LimitsPreset::Adapter => f.write_str("the adapter's limits")?,
            LimitsPreset::WebGpuDefault => f.write_str("WebGPU's default limits")?,
            LimitsPreset::Downlevel => f.write_str("wgpu's downlevel limits")?,
            LimitsPreset::Exact(_) => f.write_str("the caller's limits")?,
        }
        for o in &self.overrides {
            write!(f, ", {o}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("128").unwrap(), 128);
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("16 KiB").unwrap(), 16 << 10);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("1_024").unwrap(), 1024);
        for bad in ["", "MiB", "4 parsecs", "-1", "99999999999999999999GiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn overrides_parse_and_apply() {
        let o: LimitOverride = "max_storage_buffer_binding_size=1MiB".parse().unwrap();
        assert_eq!(
            (o.name(), o.value()),
            ("max_storage_buffer_binding_size", 1 << 20)
        );
        assert!("max_textures=3".parse::<LimitOverride>().is_err());
        assert!("max_storage_buffer_binding_size"
            .parse::<LimitOverride>()
            .is_err());
        assert!("max_compute_invocations_per_workgroup=8GiB"
            .parse::<LimitOverride>()
            .is_err());

        let adapter = wgpu::Limits {
            max_storage_buffer_binding_size: 2 << 30,
            max_compute_workgroup_storage_size: 32 << 10,
            ..wgpu::Limits::default()
        };
        let limits = DeviceLimits {
            preset: LimitsPreset::Adapter,
            overrides: vec![o],
        }
        .resolve(&adapter)
        .unwrap();
        assert_eq!(limits.max_storage_buffer_binding_size, 1 << 20);
        assert_eq!(limits.max_compute_workgroup_storage_size, 32 << 10);

        let too_big = DeviceLimits::default()
            .with("max_buffer_size", 1 << 40)
            .unwrap();
        assert!(matches!(
            too_big.resolve(&adapter),
            Err(Error::InvalidOption { name: "limit", .. })
        ));
    }

    #[test]
    fn presets_never_exceed_the_adapter() {
        let small = wgpu::Limits {
            max_compute_workgroup_storage_size: 8 << 10,
            ..wgpu::Limits::default()
        };
        let limits = DeviceLimits::webgpu_default().resolve(&small).unwrap();
        assert_eq!(limits.max_compute_workgroup_storage_size, 8 << 10);
        assert_eq!(limits.max_storage_buffer_binding_size, 128 << 20);
        assert_eq!(
            "webgpu-default".parse::<LimitsPreset>().unwrap(),
            LimitsPreset::WebGpuDefault
        );
        assert!("huge".parse::<LimitsPreset>().is_err());
    }
}

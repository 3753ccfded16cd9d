//! A backward call's plan: where it runs and with which tiles, the device
//! memory it takes, and why; made before anything is recorded, and the only
//! decision its run follows (as [`crate::CallPlan`] is the forward's).

use std::fmt;

use crate::device::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::gradients::GradientOptions;
use crate::kernels::backward::{self, BackwardTiles};
use crate::options::{AttentionOptions, KernelPath, Precision};
use crate::problem::AttentionDims;

/// How one backward call runs.
#[derive(Debug, Clone, PartialEq)]
pub struct BackwardPlan {
    /// `Fused` (the GPU kernels), `Cpu` or `Oracle`.
    pub path: KernelPath,
    /// The fused kernels' tiles, on the GPU.
    pub tiles: Option<BackwardTiles>,
    /// Device memory the call allocates (0 on the CPU).
    pub workspace_bytes: u64,
    /// Why this path, where the engine chose it or something was left out.
    pub reason: Option<String>,
}

impl fmt::Display for BackwardPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backward: {}", self.path)?;
        if let Some(t) = &self.tiles {
            write!(
                f,
                " (dQ {} rows x {} keys, dK/dV {} keys x {} rows; {} bytes of workspace)",
                t.dq.query_rows, t.dq.keys_per_tile, t.keys, t.query_rows, self.workspace_bytes
            )?;
        }
        if let Some(reason) = &self.reason {
            write!(f, ": {reason}")?;
        }
        Ok(())
    }
}

/// Plans a backward call on an adapter with `caps` (`None`: a CPU engine
/// without one). `Auto` takes the fused kernels on a GPU engine where they
/// take the call, else the CPU backend, saying why; a path asked for by name
/// runs there or is refused with the reason.
pub fn plan_backward(
    caps: Option<&Capabilities>,
    gpu_engine: bool,
    dims: &AttentionDims,
    options: &AttentionOptions,
    grads: GradientOptions,
) -> Result<BackwardPlan> {
    let host = |path, reason: Option<String>| BackwardPlan {
        path,
        tiles: None,
        workspace_bytes: 0,
        reason,
    };
    let fast_note = (options.precision == Precision::Fast)
        .then_some("the fused backward computes in f32 (its matrix-unit form is not built)");
    match options.path {
        KernelPath::Oracle => return Ok(host(KernelPath::Oracle, None)),
        KernelPath::Cpu => return Ok(host(KernelPath::Cpu, None)),
        KernelPath::Unfused => {
            return Err(Error::Conflict(
                "the backward pass has no unfused GPU path yet: use KernelPath::Fused, Cpu or \
                 Oracle",
            ))
        }
        KernelPath::Fused | KernelPath::Auto => {}
    }
    let asked = options.path == KernelPath::Fused;
    if grads.mask_gradient {
        if asked {
            return Err(Error::Conflict(
                "the fused backward does not write the mask's gradient yet: use KernelPath::Cpu \
                 or Oracle for it",
            ));
        }
        return Ok(host(
            KernelPath::Cpu,
            Some("the mask's gradient is computed on the CPU backend".into()),
        ));
    }
    let Some(caps) = caps else {
        if asked {
            return Err(Error::Conflict(
                "a GPU path was asked for but this engine runs on the CPU backend with no \
                 adapter",
            ));
        }
        return Ok(host(KernelPath::Cpu, None));
    };
    if !gpu_engine && !asked {
        return Ok(host(KernelPath::Cpu, None));
    }
    match BackwardTiles::for_dims(dims.head_dim, dims.v_head_dim, &caps.limits) {
        Ok(tiles) => Ok(BackwardPlan {
            path: KernelPath::Fused,
            tiles: Some(tiles),
            workspace_bytes: backward::workspace_bytes(dims),
            reason: fast_note.map(String::from),
        }),
        Err(e) if !asked => Ok(host(
            KernelPath::Cpu,
            Some(format!("the fused backward does not take this call: {e}")),
        )),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(d: usize) -> AttentionDims {
        AttentionDims::plain(1, [8, 2], [1024, 1024], [d, d])
    }

    fn on(
        caps: Option<&Capabilities>,
        gpu: bool,
        d: usize,
        path: KernelPath,
        grads: GradientOptions,
    ) -> Result<BackwardPlan> {
        let options = AttentionOptions {
            path,
            ..Default::default()
        };
        plan_backward(caps, gpu, &dims(d), &options, grads)
    }

    #[test]
    fn auto_takes_the_fused_kernels_on_a_gpu_engine_where_they_fit() {
        let caps = Capabilities::synthetic("DiscreteGpu");
        let plain = GradientOptions::default();
        let plan = on(Some(&caps), true, 64, KernelPath::Auto, plain).unwrap();
        assert_eq!(plan.path, KernelPath::Fused);
        let tiles = plan.tiles.unwrap();
        // WebGPU's 16 KiB of workgroup memory: Q and dY rows of 64 + 64.
        assert!(tiles.dkdv_workgroup_bytes() <= 16 << 10);
        assert_eq!(plan.workspace_bytes, backward::workspace_bytes(&dims(64)));
        assert!(plan.reason.is_none());
        // Head dims past the fused kernels: the CPU backend, saying why.
        let big = on(Some(&caps), true, 512, KernelPath::Auto, plain).unwrap();
        assert_eq!(big.path, KernelPath::Cpu);
        assert!(big.reason.unwrap().contains("head dim"));
        // ... and refused where asked for by name.
        assert!(matches!(
            on(Some(&caps), true, 512, KernelPath::Fused, plain),
            Err(Error::Limit { .. })
        ));
    }

    #[test]
    fn a_cpu_engine_plans_the_cpu_unless_the_adapter_is_named() {
        let lavapipe = Capabilities::synthetic("Cpu");
        let plain = GradientOptions::default();
        let auto = on(Some(&lavapipe), false, 64, KernelPath::Auto, plain).unwrap();
        assert_eq!((auto.path, auto.workspace_bytes), (KernelPath::Cpu, 0));
        let named = on(Some(&lavapipe), false, 64, KernelPath::Fused, plain).unwrap();
        assert_eq!(named.path, KernelPath::Fused);
        assert!(matches!(
            on(None, false, 64, KernelPath::Fused, plain),
            Err(Error::Conflict(_))
        ));
    }

    #[test]
    fn what_the_fused_backward_lacks_is_refused_by_name_and_planned_around_by_auto() {
        let caps = Capabilities::synthetic("DiscreteGpu");
        let mask = GradientOptions {
            mask_gradient: true,
        };
        let plan = on(Some(&caps), true, 64, KernelPath::Auto, mask).unwrap();
        assert_eq!(plan.path, KernelPath::Cpu);
        assert!(plan.reason.unwrap().contains("mask"));
        assert!(matches!(
            on(Some(&caps), true, 64, KernelPath::Fused, mask),
            Err(Error::Conflict(_))
        ));
        assert!(matches!(
            on(
                Some(&caps),
                true,
                64,
                KernelPath::Unfused,
                GradientOptions::default()
            ),
            Err(Error::Conflict(_))
        ));
        let fast = AttentionOptions {
            precision: Precision::Fast,
            ..Default::default()
        };
        let plan = plan_backward(
            Some(&caps),
            true,
            &dims(64),
            &fast,
            GradientOptions::default(),
        )
        .unwrap();
        assert!(plan.reason.unwrap().contains("f32"));
    }
}

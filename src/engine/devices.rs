//! A GPU engine's devices: the one it runs on, the ones that replaced it
//! after losses, and how to request another.
//!
//! A device can be lost at any time (a driver reset, a removed GPU, the
//! browser reclaiming it, `Device::destroy`). The call in flight then fails
//! with [`Error::DeviceLost`]; the engine's next async call requests a fresh
//! device the way the first was requested and runs there. Tensors remember
//! which device they were made on, so one from a lost device reports
//! [`Error::TensorLost`] instead of reading garbage.

use std::sync::OnceLock;

use crate::device::context::{GpuContext, PowerPreference};
use crate::error::{Error, Result};
use crate::limits::DeviceLimits;

/// How an engine's device was requested, to request another after a loss.
#[derive(Debug, Clone)]
pub(crate) struct DeviceRecipe {
    pub power: PowerPreference,
    pub limits: DeviceLimits,
    pub matrix_units: crate::options::MatrixUnits,
    pub runtime_checks: crate::options::RuntimeChecks,
}

impl DeviceRecipe {
    /// A device as this recipe says.
    pub async fn request(&self) -> Result<GpuContext> {
        let ctx = GpuContext::request_with(self.power, &self.limits, self.matrix_units).await?;
        Ok(ctx.with_runtime_checks(self.runtime_checks))
    }
}

/// One device. The fresh device that replaces it after a loss hangs off
/// `next`, so references handed out earlier stay valid and the newest is found
/// by walking the chain (losses are rare).
#[derive(Debug)]
struct Generation {
    number: u64,
    ctx: GpuContext,
    next: OnceLock<Box<Generation>>,
}

impl Generation {
    fn new(number: u64, ctx: GpuContext) -> Generation {
        Generation {
            number,
            ctx,
            next: OnceLock::new(),
        }
    }

    fn latest(&self) -> &Generation {
        let mut generation = self;
        while let Some(next) = generation.next.get() {
            generation = next;
        }
        generation
    }
}

/// A GPU engine's devices.
#[derive(Debug)]
pub(crate) struct GpuDevices {
    first: Generation,
    /// `None` for engines made from a caller's context: the engine cannot know
    /// how that device was made, so it cannot make another.
    recipe: Option<DeviceRecipe>,
}

impl GpuDevices {
    /// The devices of an engine whose first device is `ctx`.
    pub fn new(ctx: GpuContext, recipe: Option<DeviceRecipe>) -> GpuDevices {
        GpuDevices {
            first: Generation::new(0, ctx),
            recipe,
        }
    }

    /// The newest device's context.
    pub fn current(&self) -> &GpuContext {
        &self.first.latest().ctx
    }

    /// The newest device's number: 0 for the first, one more per replacement.
    pub fn generation(&self) -> u64 {
        self.first.latest().number
    }

    /// The newest device's context and number, read together.
    pub fn latest(&self) -> (&GpuContext, u64) {
        let latest = self.first.latest();
        (&latest.ctx, latest.number)
    }

    /// Replaces the newest device with a fresh one if it was lost; says whether
    /// it did. Concurrent callers may both request a device; the first to
    /// finish wins and the other's is dropped.
    pub async fn recover(&self) -> Result<bool> {
        let current = self.first.latest();
        let Err(Error::DeviceLost(reason)) = current.ctx.check_alive() else {
            return Ok(false);
        };
        let Some(recipe) = &self.recipe else {
            return Err(Error::DeviceLost(format!(
                "{reason}; this engine was made from a caller's context and cannot make \
                 another device: create a new Engine"
            )));
        };
        let ctx = recipe.request().await.map_err(|e| {
            Error::DeviceLost(format!("{reason}; no fresh device could be created: {e}"))
        })?;
        // Settings made on the device after it was requested carry over (its
        // clock readings do not: the fresh device's clocks are its own).
        ctx.set_clock_guard(current.ctx.clock_guard_setting());
        let number = current.number + 1;
        if current
            .next
            .set(Box::new(Generation::new(number, ctx)))
            .is_ok()
        {
            log::warn!(
                "webattn: the GPU device was lost ({reason}); continuing on a fresh device \
                 (generation {number})"
            );
        }
        Ok(true)
    }
}

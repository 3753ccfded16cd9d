//! Running a call's plan: whole or in pieces, on the fused or the unfused
//! route, with the present K and V, f16 tensors widened or read in place.

pub(crate) mod backward;
pub(crate) mod fused_route;
pub(crate) mod half;
pub(crate) mod present;
pub mod single;
pub(crate) mod split;
pub(crate) mod unfused_route;

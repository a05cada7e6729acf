//! `FlareDriverCall`: the driver calls a pool makes (for fault injection), and its
//! integer form as C passes it.

use super::super::generate::c_enum;
use crate::driver::{driver_calls, DriverCall};

driver_calls!(c_enum! {
    /// The driver calls a pool makes, for `flare_sim_inject_failure`. The numbers are
    /// stable.
    pub enum FlareDriverCall for DriverCall;
});
/// A `FlareDriverCall` as C passes it (see [`RawStatus`]).
///
/// [`RawStatus`]: super::RawStatus
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDriverCall(pub u32);

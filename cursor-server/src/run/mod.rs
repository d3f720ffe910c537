//! The loop engine: one actor per request id, fed by both transports, owning all of the run's state.

pub mod actor;
pub mod command;
pub mod inbox;
pub mod lifecycle;
pub mod loop_engine;
pub mod registry;

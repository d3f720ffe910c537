//! The loop engine: one actor per request id, fed by both transports, owning all of the run's state.

pub mod actor;
mod batch;
mod compaction;
pub mod inbox;
pub mod lifecycle;
pub mod loop_engine;
mod opening;
pub mod registry;
mod turn;
mod user_command;

//! Compiling a model request: history + mode → system prompt and messages (`compiler`), then into a
//! provider's wire format (`projector`).

pub mod compiler;
pub mod derived_state;
pub mod projector;

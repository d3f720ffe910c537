//! Compiling a model request: the validated prompt assets (`assets`), history + mode → system
//! prompt, tools and messages (`compiler`), then a provider's wire format (`projector`).

pub mod assets;
pub mod compiler;
pub mod derived_state;
pub mod images;
pub mod projector;

//! cursor-server: a self-hosted backend for the Cursor agent protocol.
//!
//! Layers, top to bottom: `cursor` (HTTP/Connect adapter) → `run` (one actor per run) →
//! `prompting` + `model` → `provider` → `store`.

pub mod app;
pub mod config;
pub mod cursor;
pub mod error;
pub mod model;
pub mod prompting;
pub mod provider;
pub mod run;
pub mod state;
pub mod store;

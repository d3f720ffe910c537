//! cursor-server: a self-hosted backend for the Cursor agent protocol.
//!
//! Layers, top to bottom: `cursor` (HTTP/Connect adapter) → `run` (one actor per run) →
//! `prompting` + `model` → `provider` → `store`. `ops` (health, readiness, metrics) sits beside
//! `cursor` at the top; its `metrics` file is a leaf every layer may record into. `cluster` (several
//! nodes on one database) sits at the top too: it places and forwards a run's requests.

pub mod app;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod connections;
pub mod console;
pub mod cursor;
pub mod error;
pub mod model;
pub mod ops;
pub mod prompting;
pub mod provider;
pub mod run;
pub mod state;
pub mod store;

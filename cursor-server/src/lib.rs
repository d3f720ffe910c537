//! cursor-server: a self-hosted backend for the Cursor agent protocol.
//!
//! Folders are layers (docs/architecture.md, checked by tests/architecture.rs), top to bottom:
//! entry (`main`, `lib`, `app`) → routes (`wire`, `console`, `ops`, `connections`,
//! `auth/identify`) → runs (`run`, `cluster`, `state`, `auth`) → the client side of a run (`client`) → services (`tools`, `sync`,
//! `provider`, `prompting`, `error`) → base (`cursor`'s protobuf types and Connect framing,
//! `model`, `store`, `config`, `ops/metrics`, `ops/drift`). Imports point down.

pub mod app;
pub mod auth;
pub mod client;
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
pub mod sync;
pub mod tools;
pub mod wire;

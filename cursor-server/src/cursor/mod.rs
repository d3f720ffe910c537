//! The Cursor protocol adapter: Connect framing, routes, and translation between protobuf and the
//! loop's domain types. No loop decisions are made here.

pub mod bidi_append;
pub mod blob_sync;
pub mod catalog;
pub mod checkpoint;
pub mod connect;
pub mod exec;
pub mod handlers;
pub mod import;
pub mod interaction;
pub mod pending;
pub mod projection;
pub mod proto;
pub mod run_sse;
pub mod selected_context;
pub mod tool_result;
pub mod tools;

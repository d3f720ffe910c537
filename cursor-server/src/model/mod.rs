//! Pure domain types: no Cursor protobuf, no provider JSON.

pub mod conversation;
pub mod message;
pub mod runtime_tag;
pub mod tool;
pub mod usage;

//! The base of the Cursor protocol: the protobuf types the schema generates and Connect framing.
//! Everything that translates between these messages and the domain lives in the layers above
//! (`client/`, `tools/`, `sync/`, `wire/`); nothing here makes a decision.

pub mod connect;
pub mod proto;

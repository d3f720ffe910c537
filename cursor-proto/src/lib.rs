//! cursor-proto: the Cursor protobuf schema, read from the user's own Cursor install.
//!
//! Why a crate of its own: `cursor-server`'s build script needs the schema before the server compiles, so the
//! extractor cannot live inside the server; the server's `schema-check` command loads and compares schemas at
//! run time with the same code.
//!
//! Pipeline: [`extract`] parses a JavaScript bundle (oxc), resolves every protobuf-es class, enum and service to
//! its full name and builds a `FileDescriptorSet`; [`printer`] renders it as `.proto` files; [`write`] puts them
//! on disk atomically; [`compare`] names the differences between two schemas; [`fingerprint`] hashes one.

pub mod compare;
pub mod extract;
pub mod fingerprint;
pub mod install;
mod js;
pub mod printer;
pub mod write;

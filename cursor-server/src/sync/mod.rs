//! The conversation's state on the client: the immutable blob graph and its checkpoints, the
//! projection of history onto it, a client's conversation imported back, and the KV exchange that
//! stores blobs on the client.

pub mod blob_sync;
pub mod checkpoint;
pub mod import;
pub mod projection;

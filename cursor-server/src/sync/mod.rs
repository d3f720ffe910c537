//! The conversation's state on the client: the immutable blob graph and its checkpoints, the
//! projection of history onto it (kept between runs), a client's conversation imported back, and the KV exchange that
//! stores blobs on the client.

pub mod blob_sync;
pub mod checkpoint;
pub mod history;
pub mod import;
pub mod projection;

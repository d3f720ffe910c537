//! The HTTP routes Cursor calls (RunSSE, BidiAppend, HTTP/2 Run, the model catalog) and the
//! pass-through of everything else to Cursor's backend: the top of the protocol, above the runs.

pub mod catalog;
pub mod handlers;

//! Who is asking (`[auth]`): a layer in front of every route this server answers that ties the
//! request to a verified person (`Caller`) or refuses it with a Connect error saying what to do;
//! which person a run belongs to, so another cannot append to it or take over its conversation.
//! Without `[auth]` nothing here runs and the server is single-user exactly as before.
//!
//! Sits at the top beside `cursor/` (whose Connect errors it answers with) and `console/`; the
//! runs learn a run's person through `AppState::auth` only.

pub mod admin;
pub mod budget;
pub mod cursor_account;
pub mod identify;
pub mod runs;
pub mod service;

pub use service::{Caller, TOKEN_HEADER, TOKEN_PREFIX, USER_HEADER, new_token, token_hash};

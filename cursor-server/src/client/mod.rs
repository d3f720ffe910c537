//! The run's side of the Cursor client, below the runs and above the services: what transports
//! tell a run (`command`), the uplink decoded into it (`bidi_append`, `selected_context`), and the
//! downlink a run writes to (`downlink`, `interaction`).

pub mod bidi_append;
pub mod command;
pub mod downlink;
pub mod interaction;
pub mod selected_context;

//! The integration suites that exercise history, checkpoints, recovery, the console and several
//! nodes on one database, once more on PostgreSQL: each suite file is a module of this one test
//! binary, and the fixtures put every server of a binary whose name ends in `_postgres` on a
//! database of its own in the cluster the binary starts (`support/postgres.rs`). The same files
//! run on SQLite as their own binaries.
// Each suite declares its own copies of the support modules, as it does in its own binary; the
// copies share the one cluster (see `Cluster::shared`).
#![allow(clippy::duplicate_mod)]

#[path = "auth.rs"]
mod auth;
#[path = "checkpoint_recovery.rs"]
mod checkpoint_recovery;
#[path = "cluster.rs"]
mod cluster;
#[path = "console.rs"]
mod console;
#[path = "interrupt.rs"]
mod interrupt;
#[path = "prefix_stability.rs"]
mod prefix_stability;
#[path = "runtime_tag_once.rs"]
mod runtime_tag_once;
#[path = "text_turn.rs"]
mod text_turn;
#[path = "tool_loop.rs"]
mod tool_loop;

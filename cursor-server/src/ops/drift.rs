//! Schema drift seen at run time: what a connected client sends that this server's schema does not know.
//!
//! Owns the detector and its record. prost skips unknown fields silently and keeps enum numbers it does not
//! know as plain integers, so a client newer than the schema would go unnoticed until something breaks. Here
//! the wire bytes of each `AgentClientMessage` are walked once more against a table build.rs generates from
//! the schema (`drift_table.rs`: every message the client can reach, its field numbers, and which field holds
//! which message or enum), and each unknown field, unknown oneof variant (an unknown field number too) or enum
//! value out of range is recorded. Each distinct (message, field number) is recorded once, with the client
//! version from the request headers, logged once at WARN with the fix, counted in `/metrics` and listed on the
//! console overview.
//!
//! Why a table and a second walk instead of prost-reflect: the walk only reads tags and lengths (strings and
//! bytes are skipped by length) and touches no allocator while nothing is found, so it costs well under a
//! microsecond for a typical client message (`benches/hot_paths.rs`, `drift` rows). The record is process-wide
//! like the metrics recorder: the schema is the binary's, so what the binary's clients send beyond it is too.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// What a field holds, as far as drift goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Other,
    /// A message: an index into [`MESSAGES`].
    Message(usize),
    /// An enum: an index into [`ENUMS`].
    Enum(usize),
}

pub(crate) struct Message {
    pub name: &'static str,
    /// Field numbers, sorted.
    pub fields: &'static [(u32, Kind)],
}

pub(crate) struct Enum {
    pub name: &'static str,
    /// Values, sorted.
    pub values: &'static [i32],
}

include!(concat!(env!("OUT_DIR"), "/drift_table.rs"));

/// Deeper than this is not walked (prost's own recursion limit is 100).
const MAX_DEPTH: u32 = 100;

/// One thing the schema does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    /// A field number the message does not declare (an unknown oneof variant is one too).
    UnknownField { message: &'static str, number: u32 },
    /// An enum field holding a number the enum does not declare.
    UnknownEnumValue {
        message: &'static str,
        number: u32,
        enum_name: &'static str,
        value: i32,
    },
}

/// Walks an encoded `agent.v1.AgentClientMessage` and adds what the schema does not know to `found`. Bytes
/// that do not parse stop the walk quietly: prost decides whether the message is valid.
pub fn scan(bytes: &[u8], found: &mut Vec<Finding>) {
    scan_message(bytes, 0, 0, found);
}

fn scan_message(
    mut bytes: &[u8],
    message: usize,
    depth: u32,
    found: &mut Vec<Finding>,
) -> Option<()> {
    let table = MESSAGES.get(message)?;
    while !bytes.is_empty() {
        let tag = varint(&mut bytes)?;
        let (number, wire) = (u32::try_from(tag >> 3).ok()?, (tag & 7) as u8);
        let kind = match table.fields.binary_search_by_key(&number, |(n, _)| *n) {
            Ok(at) => table.fields[at].1,
            Err(_) => {
                found.push(Finding::UnknownField {
                    message: table.name,
                    number,
                });
                skip(&mut bytes, wire, number)?;
                continue;
            }
        };
        match (kind, wire) {
            (Kind::Message(inner), 2) if depth < MAX_DEPTH => {
                let body = length_delimited(&mut bytes)?;
                scan_message(body, inner, depth + 1, found)?;
            }
            (Kind::Enum(e), 0) => {
                let value = varint(&mut bytes)? as i32;
                check_enum(table.name, number, e, value, found);
            }
            (Kind::Enum(e), 2) => {
                let mut packed = length_delimited(&mut bytes)?;
                while !packed.is_empty() {
                    let value = varint(&mut packed)? as i32;
                    check_enum(table.name, number, e, value, found);
                }
            }
            _ => skip(&mut bytes, wire, number)?,
        }
    }
    Some(())
}

fn check_enum(message: &'static str, number: u32, e: usize, value: i32, found: &mut Vec<Finding>) {
    if let Some(known) = ENUMS.get(e)
        && known.values.binary_search(&value).is_err()
    {
        found.push(Finding::UnknownEnumValue {
            message,
            number,
            enum_name: known.name,
            value,
        });
    }
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

fn length_delimited<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
    let length = usize::try_from(varint(bytes)?).ok()?;
    if length > bytes.len() {
        return None;
    }
    let (body, rest) = bytes.split_at(length);
    *bytes = rest;
    Some(body)
}

/// Skips one value of wire type `wire`; a group is skipped to its end tag.
fn skip(bytes: &mut &[u8], wire: u8, number: u32) -> Option<()> {
    match wire {
        0 => varint(bytes).map(drop),
        1 => advance(bytes, 8),
        2 => length_delimited(bytes).map(drop),
        3 => loop {
            let tag = varint(bytes)?;
            let (inner, inner_wire) = (u32::try_from(tag >> 3).ok()?, (tag & 7) as u8);
            if inner_wire == 4 {
                return (inner == number).then_some(());
            }
            skip(bytes, inner_wire, inner)?;
        },
        5 => advance(bytes, 4),
        _ => None,
    }
}

fn advance(bytes: &mut &[u8], n: usize) -> Option<()> {
    *bytes = bytes.get(n..)?;
    Some(())
}

/// One distinct drift, as the console and the log show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub message: &'static str,
    pub number: u32,
    /// "unknown field" or "enum value out of range (agent.v1.X: 7)".
    pub what: String,
    /// The client version the first time it was seen (`x-cursor-client-version`).
    pub client_version: Option<String>,
    /// How many client messages carried it.
    pub count: u64,
}

fn record() -> &'static Mutex<BTreeMap<(&'static str, u32), Seen>> {
    static RECORD: OnceLock<Mutex<BTreeMap<(&'static str, u32), Seen>>> = OnceLock::new();
    RECORD.get_or_init(Mutex::default)
}

/// Checks one encoded client message and records what the schema does not know. The first sighting of each
/// (message, field number) is logged at WARN and counted in `/metrics`; later ones only count.
pub fn observe(bytes: &[u8], client_version: Option<&str>) {
    let mut found = Vec::new();
    scan(bytes, &mut found);
    if found.is_empty() {
        return;
    }
    let mut record = record()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for finding in found {
        let (message, number, what) = match finding {
            Finding::UnknownField { message, number } => {
                (message, number, "unknown field".to_owned())
            }
            Finding::UnknownEnumValue {
                message,
                number,
                enum_name,
                value,
            } => (
                message,
                number,
                format!("enum value out of range ({enum_name}: {value})"),
            ),
        };
        let entry = record.entry((message, number)).or_insert_with(|| {
            let version = client_version.unwrap_or("unknown");
            tracing::warn!(
                schema_message = message,
                field = number,
                client_version = version,
                "the Cursor client sent {message} field {number} ({what}), which this server's schema does not \
                 know; it is ignored. Rebuild against your Cursor install: `cursor-server schema-check`"
            );
            super::metrics::schema_drift(message, number, if what == "unknown field" { "field" } else { "enum_value" });
            Seen {
                message,
                number,
                what,
                client_version: client_version.map(str::to_owned),
                count: 0,
            }
        });
        entry.count += 1;
    }
}

/// Every distinct drift seen since start, by message and field number.
pub fn seen() -> Vec<Seen> {
    record()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .values()
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_starts_at_the_client_message_and_is_sorted() {
        assert_eq!(MESSAGES[0].name, "agent.v1.AgentClientMessage");
        for message in MESSAGES {
            assert!(
                message.fields.windows(2).all(|w| w[0].0 < w[1].0),
                "{}",
                message.name
            );
        }
    }

    #[test]
    fn an_unknown_field_and_an_unknown_enum_value_are_found_and_known_ones_are_not() {
        use crate::cursor::proto::agent::{AgentClientMessage, agent_client_message};
        use prost::Message as _;
        let known = AgentClientMessage {
            message: Some(agent_client_message::Message::ClientHeartbeat(
                Default::default(),
            )),
        }
        .encode_to_vec();
        let mut found = Vec::new();
        scan(&known, &mut found);
        assert!(found.is_empty(), "{found:?}");
        // Field 999 (varint) appended to the top level.
        let mut unknown = known.clone();
        unknown.extend_from_slice(&[0xB8, 0x3E, 0x01]);
        scan(&unknown, &mut found);
        assert_eq!(
            found,
            [Finding::UnknownField {
                message: "agent.v1.AgentClientMessage",
                number: 999
            }]
        );
    }
}

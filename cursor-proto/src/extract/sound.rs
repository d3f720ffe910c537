//! Keeping an extracted schema compilable: what `protoc` would refuse is left out, each with a [`Problem`].
//!
//! Owns the rules a bundle's metadata can break while every other type stays usable: names that are not
//! protobuf identifiers, field numbers out of range or used twice, field, value and method names used twice,
//! enums with no readable value (or, in a proto3 file, no zero value), map keys of a type that cannot be a key,
//! and references to a type that is missing, was left out, or is of the other kind (a message where an enum is
//! expected, an enum as a method's input). Removing a type is done first, so the references to it are caught by
//! the same pass.

use std::collections::{BTreeMap, BTreeSet};

use super::Schema;
use crate::js::{FieldKind, MapValue, Problem, RawField, Syntax};

/// The highest field number protobuf allows (2^29 - 1).
const MAX_FIELD_NUMBER: i32 = 536_870_911;

/// Field numbers protobuf keeps for itself.
const RESERVED_FIELD_NUMBERS: std::ops::RangeInclusive<i32> = 19_000..=19_999;

/// Scalar types a map key may have: every integer type, `bool` and `string` (not floats, not bytes).
const MAP_KEY_TYPES: &[i32] = &[3, 4, 5, 6, 7, 8, 9, 13, 15, 16, 17, 18];

impl Schema {
    /// Leaves out whatever would make the schema fail to compile, recording why in `problems`.
    pub(super) fn make_sound(&mut self) {
        let mut problems = Vec::new();
        let mut problem = |owner: &str, member: &str, reason: String| {
            problems.push(Problem {
                owner: owner.to_owned(),
                member: member.to_owned(),
                reason,
            });
        };

        // Types whose own name or values are unusable go first.
        let mut well_named = |name: &String| {
            let good = is_full_name(name);
            if !good {
                problem(name, "", bad_full_name());
            }
            good
        };
        self.messages.retain(|name, _| well_named(name));
        self.services.retain(|name, _| well_named(name));
        let syntaxes: BTreeMap<String, Syntax> = self
            .enums
            .keys()
            .map(|name| (name.clone(), self.syntax_of(name)))
            .collect();
        self.enums.retain(|name, value| {
            if !is_full_name(name) {
                problem(name, "", bad_full_name());
                return false;
            }
            let mut names = BTreeSet::new();
            value.values.retain(|(number, value_name)| {
                if !is_identifier(value_name) {
                    problem(
                        name,
                        value_name,
                        "not a valid enum value name; left out".to_owned(),
                    );
                    false
                } else if !names.insert(value_name.clone()) {
                    problem(
                        name,
                        value_name,
                        format!("the name is used again (= {number}); the repeat is left out"),
                    );
                    false
                } else {
                    true
                }
            });
            if value.values.is_empty() {
                problem(
                    name,
                    "",
                    "no value could be read; the enum is left out".to_owned(),
                );
                return false;
            }
            if syntaxes.get(name) == Some(&Syntax::Proto3) {
                // proto3 wants the zero value first; declaration order carries no meaning.
                match value.values.iter().position(|(number, _)| *number == 0) {
                    Some(zero) => value.values[..=zero].rotate_right(1),
                    None => {
                        problem(
                            name,
                            "",
                            "a proto3 enum needs a zero value and none could be read; the enum is left out"
                                .to_owned(),
                        );
                        return false;
                    }
                }
            }
            true
        });

        // Then every member, against the types that are left.
        let kinds: BTreeMap<String, Kind> = self
            .messages
            .keys()
            .map(|name| (name.clone(), Kind::Message))
            .chain(self.enums.keys().map(|name| (name.clone(), Kind::Enum)))
            .collect();
        for (name, message) in &mut self.messages {
            let mut numbers = BTreeMap::new();
            let mut names = BTreeSet::new();
            message.fields.retain(|field| {
                let reason = field_problem(field, &kinds)
                    .or_else(|| {
                        numbers.get(&field.number).map(|other: &String| {
                            format!(
                                "number {} is also field `{other}`; the second is left out",
                                field.number
                            )
                        })
                    })
                    .or_else(|| {
                        names
                            .contains(&field.name)
                            .then(|| "the name is used twice; the second is left out".to_owned())
                    });
                match reason {
                    Some(reason) => {
                        problem(name, &field.name, reason);
                        false
                    }
                    None => {
                        numbers.insert(field.number, field.name.clone());
                        names.insert(field.name.clone());
                        true
                    }
                }
            });
        }
        for (name, service) in &mut self.services {
            let mut names = BTreeSet::new();
            service.methods.retain(|method| {
                let reason = if !is_identifier(&method.name) {
                    Some("not a valid method name; left out".to_owned())
                } else if !names.insert(method.name.clone()) {
                    Some("the name is used twice; the second is left out".to_owned())
                } else {
                    [("input", &method.input), ("output", &method.output)]
                        .into_iter()
                        .find_map(|(what, target)| {
                            reference_problem(target, Kind::Message, &kinds)
                                .map(|reason| format!("{what}: {reason}"))
                        })
                };
                match reason {
                    Some(reason) => {
                        problem(name, &method.name, reason);
                        false
                    }
                    None => true,
                }
            });
        }
        self.problems.extend(problems);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Message,
    Enum,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Message => "a message",
            Kind::Enum => "an enum",
        }
    }
}

fn bad_full_name() -> String {
    "not a valid protobuf full name (dot-separated identifiers); the type is left out".to_owned()
}

/// Why a field cannot be kept, if it cannot.
fn field_problem(field: &RawField, kinds: &BTreeMap<String, Kind>) -> Option<String> {
    if !is_identifier(&field.name) {
        return Some("not a valid field name; left out".to_owned());
    }
    if field.number > MAX_FIELD_NUMBER || RESERVED_FIELD_NUMBERS.contains(&field.number) {
        return Some(format!(
            "field number {} is out of range or reserved by protobuf; left out",
            field.number
        ));
    }
    if let Some(oneof) = &field.oneof
        && !is_identifier(oneof)
    {
        return Some(format!("oneof name {oneof:?} is not valid; left out"));
    }
    match &field.kind {
        FieldKind::Scalar(_) => None,
        FieldKind::Message(target) => reference_problem(target, Kind::Message, kinds),
        FieldKind::Enum(target) => reference_problem(target, Kind::Enum, kinds),
        FieldKind::Map { key, value } => {
            if !MAP_KEY_TYPES.contains(key) {
                return Some(format!(
                    "scalar type {key} cannot be a map key; the field is left out"
                ));
            }
            match value {
                MapValue::Scalar(_) => None,
                MapValue::Message(target) => reference_problem(target, Kind::Message, kinds),
                MapValue::Enum(target) => reference_problem(target, Kind::Enum, kinds),
            }
        }
    }
}

/// Why a reference to `target` as a `wanted` cannot be kept, if it cannot.
fn reference_problem(target: &str, wanted: Kind, kinds: &BTreeMap<String, Kind>) -> Option<String> {
    match kinds.get(target) {
        Some(kind) if *kind == wanted => None,
        Some(kind) => Some(format!(
            "{target} is {}, where {} is expected; left out",
            kind.noun(),
            wanted.noun()
        )),
        None => Some(format!(
            "its type {target} was left out (see that entry); left out too"
        )),
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`, what protobuf accepts as a name.
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_full_name(name: &str) -> bool {
    name.split('.').all(is_identifier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_and_full_names() {
        assert!(is_identifier("user_message2"));
        assert!(is_identifier("_x"));
        assert!(!is_identifier(""));
        assert!(!is_identifier("2x"));
        assert!(!is_identifier("a-b"));
        assert!(is_full_name("agent.v1.UserMessage"));
        assert!(!is_full_name("agent..UserMessage"));
        assert!(!is_full_name(".agent.v1.X"));
        assert!(!is_full_name(""));
    }
}

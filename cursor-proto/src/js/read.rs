//! Reading protobuf-es metadata once its owner is known: the literals generated code writes (`!0`, `void 0`,
//! `-1`), field entries (`{no, name, kind, T, K, V, oneof, opt, repeated, ...}`), enum value lists, service
//! method entries, and the scalar-type and method-kind tables. Also the small syntax helpers the collector in
//! `js.rs` shares (object entries, arrow results, define descriptors, webpack export lists).
//!
//! Whatever cannot be read becomes a [`Problem`] naming the type and the member; nothing is dropped silently.

use std::collections::HashMap;

use oxc_ast::ast::{
    Argument, ArrayExpression, ArrayExpressionElement, ArrowFunctionBody, CallExpression,
    Expression, ObjectExpression, ObjectPropertyKind, Statement, UnaryOperator,
};

use super::{
    Collector, FieldKind, Idempotency, MapValue, MethodKind, Problem, RawEnum, RawField,
    RawMessage, RawMethod, RawService, Site, Syntax,
};

impl<'a> Collector<'_, 'a> {
    pub(super) fn read_message(
        &self,
        name: &str,
        fields: &'a Expression<'a>,
        runtime: Option<&'a Expression<'a>>,
        problems: &mut Vec<Problem>,
    ) -> RawMessage {
        let syntax = self.syntax(runtime).unwrap_or(Syntax::Proto3);
        let mut message = RawMessage {
            full_name: name.to_owned(),
            syntax,
            fields: Vec::new(),
            site: Site::default(),
        };
        let Some(list) = field_array(fields) else {
            problems.push(Problem {
                owner: name.to_owned(),
                member: String::new(),
                reason: format!(
                    "its field list could not be read: `{}`",
                    self.snippet(fields)
                ),
            });
            return message;
        };
        for element in &list.elements {
            let Some(Expression::ObjectExpression(object)) =
                element.as_expression().map(Expression::without_parentheses)
            else {
                let reason = match element.as_expression() {
                    Some(other) => format!(
                        "a field entry is not an object literal: `{}`",
                        self.snippet(other)
                    ),
                    None => "a field entry is a hole or a spread".to_owned(),
                };
                problems.push(Problem {
                    owner: name.to_owned(),
                    member: String::new(),
                    reason,
                });
                continue;
            };
            match self.read_field(object) {
                Ok(field) => message.fields.push(field),
                Err((member, reason)) => problems.push(Problem {
                    owner: name.to_owned(),
                    member,
                    reason,
                }),
            }
        }
        message
    }

    fn read_field(&self, object: &'a ObjectExpression<'a>) -> Result<RawField, (String, String)> {
        let props: HashMap<&str, &'a Expression<'a>> = object_entries(object).collect();
        let name = match props.get("name").and_then(|e| literal(e)) {
            Some(Lit::Str(name)) => name.to_owned(),
            _ => {
                let reason = self.unreadable("field name (`name`)", props.get("name").copied());
                return Err((String::new(), reason));
            }
        };
        let fail = |reason: String| (name.clone(), reason);
        let number = match props.get("no").and_then(|e| literal(e)) {
            Some(Lit::Num(n)) if n.fract() == 0.0 && n >= 1.0 && n <= f64::from(i32::MAX) => {
                n as i32
            }
            _ => {
                return Err(fail(
                    self.unreadable("field number (`no`)", props.get("no").copied()),
                ));
            }
        };
        let kind_name = match props.get("kind").and_then(|e| literal(e)) {
            Some(Lit::Str(kind)) => kind,
            _ => {
                return Err(fail(
                    self.unreadable("field kind (`kind`)", props.get("kind").copied()),
                ));
            }
        };
        let t = props.get("T").copied();
        let kind = match kind_name {
            "scalar" => FieldKind::Scalar(
                t.and_then(scalar_type)
                    .ok_or_else(|| fail(self.unreadable("scalar type", t)))?,
            ),
            "message" => FieldKind::Message(self.resolve("type (`T`)", t).map_err(fail)?),
            "enum" => FieldKind::Enum(self.resolve("type (`T`)", t).map_err(fail)?),
            "map" => {
                let key = props
                    .get("K")
                    .copied()
                    .and_then(scalar_type)
                    .ok_or_else(|| {
                        fail(self.unreadable("map key type", props.get("K").copied()))
                    })?;
                let Some(Expression::ObjectExpression(value)) =
                    props.get("V").map(|v| v.without_parentheses())
                else {
                    return Err(fail("map without a value type (`V`)".to_owned()));
                };
                let value: HashMap<&str, &'a Expression<'a>> = object_entries(value).collect();
                let vt = value.get("T").copied();
                let value = match value.get("kind").and_then(|e| literal(e)) {
                    Some(Lit::Str("scalar")) => MapValue::Scalar(
                        vt.and_then(scalar_type)
                            .ok_or_else(|| fail(self.unreadable("map value type", vt)))?,
                    ),
                    Some(Lit::Str("message")) => {
                        MapValue::Message(self.resolve("map value type (`V.T`)", vt).map_err(fail)?)
                    }
                    Some(Lit::Str("enum")) => {
                        MapValue::Enum(self.resolve("map value type (`V.T`)", vt).map_err(fail)?)
                    }
                    _ => return Err(fail("map value of unknown kind".to_owned())),
                };
                FieldKind::Map { key, value }
            }
            other => return Err(fail(format!("unknown field kind {other:?}"))),
        };
        let flag = |key: &str| {
            matches!(
                props.get(key).and_then(|e| literal(e)),
                Some(Lit::Bool(true))
            )
        };
        let oneof = match props.get("oneof").and_then(|e| literal(e)) {
            Some(Lit::Str(oneof)) => Some(oneof.to_owned()),
            _ => None,
        };
        let packed = match props.get("packed").and_then(|e| literal(e)) {
            Some(Lit::Bool(packed)) => Some(packed),
            _ => None,
        };
        let js_string = matches!(props.get("L").and_then(|e| literal(e)), Some(Lit::Num(n)) if n == 1.0)
            || props
                .get("L")
                .is_some_and(|e| static_property_name(e) == Some("STRING"));
        let json_name = match props.get("jsonName").and_then(|e| literal(e)) {
            Some(Lit::Str(json)) => Some(json.to_owned()),
            _ => None,
        };
        let default = props.get("default").and_then(|e| match literal(e) {
            Some(Lit::Str(s)) => Some(s.to_owned()),
            Some(Lit::Num(n)) => Some(format_number(n)),
            Some(Lit::Bool(b)) => Some(b.to_string()),
            _ => None,
        });
        Ok(RawField {
            number,
            name,
            json_name,
            kind,
            repeated: flag("repeated"),
            optional: flag("opt"),
            required: flag("req"),
            oneof,
            packed,
            js_string,
            delimited: flag("delimited"),
            default,
        })
    }

    /// The full name `t` refers to; `what` names the reference in the reason when it does not resolve.
    fn resolve(&self, what: &str, t: Option<&'a Expression<'a>>) -> Result<String, String> {
        let Some(t) = t else {
            return Err(format!("no {what}"));
        };
        self.type_name(t).map(str::to_owned).ok_or_else(|| {
            format!(
                "{what} `{}` does not resolve to a message or enum",
                self.snippet(t)
            )
        })
    }

    /// The values of `setEnumType(X, name, [...])` or `makeEnum(name, [...])`. An entry that cannot be read is
    /// a [`Problem`] of the enum (named by the value's name when that much is readable, else by its position);
    /// the others are kept.
    pub(super) fn read_enum(
        &self,
        name: &str,
        values: &'a Expression<'a>,
        problems: &mut Vec<Problem>,
    ) -> RawEnum {
        let mut out = RawEnum {
            full_name: name.to_owned(),
            values: Vec::new(),
            syntax: None,
            site: Site::default(),
        };
        let Expression::ArrayExpression(list) = values.without_parentheses() else {
            problems.push(Problem {
                owner: name.to_owned(),
                member: String::new(),
                reason: format!(
                    "its value list could not be read: `{}`",
                    self.snippet(values)
                ),
            });
            return out;
        };
        for (index, element) in list.elements.iter().enumerate() {
            match self.read_enum_value(element) {
                Ok(value) => out.values.push(value),
                Err((member, reason)) => problems.push(Problem {
                    owner: name.to_owned(),
                    member: member.unwrap_or_else(|| format!("value #{}", index + 1)),
                    reason,
                }),
            }
        }
        out
    }

    fn read_enum_value(
        &self,
        element: &'a ArrayExpressionElement<'a>,
    ) -> Result<(i32, String), (Option<String>, String)> {
        let object = match element.as_expression().map(Expression::without_parentheses) {
            Some(Expression::ObjectExpression(object)) => object,
            Some(other) => {
                return Err((
                    None,
                    format!(
                        "the value entry is not an object literal: `{}`",
                        self.snippet(other)
                    ),
                ));
            }
            None => return Err((None, "the value entry is a hole or a spread".to_owned())),
        };
        let props: HashMap<&str, &'a Expression<'a>> = object_entries(object).collect();
        let name = match props.get("name").and_then(|e| literal(e)) {
            Some(Lit::Str(name)) => name.to_owned(),
            _ => {
                return Err((
                    None,
                    self.unreadable("value name (`name`)", props.get("name").copied()),
                ));
            }
        };
        match props.get("no").and_then(|e| literal(e)) {
            Some(Lit::Num(n))
                if n.fract() == 0.0 && n >= f64::from(i32::MIN) && n <= f64::from(i32::MAX) =>
            {
                Ok((n as i32, name))
            }
            _ => {
                let reason = self.unreadable("value number (`no`)", props.get("no").copied());
                Err((Some(name), reason))
            }
        }
    }

    fn unreadable(&self, what: &str, expr: Option<&'a Expression<'a>>) -> String {
        match expr {
            Some(expr) => format!("unreadable {what} `{}`", self.snippet(expr)),
            None => format!("no {what}"),
        }
    }

    pub(super) fn read_service(
        &self,
        object: &'a ObjectExpression<'a>,
        problems: &mut Vec<Problem>,
    ) -> Option<RawService> {
        let props: HashMap<&str, &'a Expression<'a>> = object_entries(object).collect();
        let Some(Lit::Str(full_name)) = props.get("typeName").and_then(|e| literal(e)) else {
            return None;
        };
        let Some(Expression::ObjectExpression(methods)) =
            props.get("methods").map(|m| m.without_parentheses())
        else {
            return None;
        };
        let mut service = RawService {
            full_name: full_name.to_owned(),
            methods: Vec::new(),
            site: Site::default(),
        };
        for (local, method) in object_entries(methods) {
            let read = match method.without_parentheses() {
                Expression::ObjectExpression(method) => self.read_method(method),
                other => Err((
                    None,
                    format!(
                        "the method entry is not an object literal: `{}`",
                        self.snippet(other)
                    ),
                )),
            };
            match read {
                Ok(method) => service.methods.push(method),
                // Named by the method's own name when it could be read, else by its key in `methods`.
                Err((name, reason)) => problems.push(Problem {
                    owner: full_name.to_owned(),
                    member: name.unwrap_or_else(|| local.to_owned()),
                    reason,
                }),
            }
        }
        Some(service)
    }

    fn read_method(
        &self,
        method: &'a ObjectExpression<'a>,
    ) -> Result<RawMethod, (Option<String>, String)> {
        let props: HashMap<&str, &'a Expression<'a>> = object_entries(method).collect();
        let Some(Lit::Str(name)) = props.get("name").and_then(|e| literal(e)) else {
            return Err((
                None,
                self.unreadable("method name (`name`)", props.get("name").copied()),
            ));
        };
        let fail = |reason: String| (Some(name.to_owned()), reason);
        let input = self
            .resolve("input type (`I`)", props.get("I").copied())
            .map_err(fail)?;
        let output = self
            .resolve("output type (`O`)", props.get("O").copied())
            .map_err(fail)?;
        let kind = match props.get("kind").map(|k| method_kind(k)) {
            Some(Some(kind)) => kind,
            _ => {
                return Err(fail(
                    self.unreadable("method kind (`kind`)", props.get("kind").copied()),
                ));
            }
        };
        let idempotency = props.get("idempotency").and_then(|e| {
            match static_property_name(e).or(match literal(e) {
                Some(Lit::Num(1.0)) => Some("NoSideEffects"),
                Some(Lit::Num(2.0)) => Some("Idempotent"),
                _ => None,
            }) {
                Some("NoSideEffects") => Some(Idempotency::NoSideEffects),
                Some("Idempotent") => Some(Idempotency::Idempotent),
                _ => None,
            }
        });
        Ok(RawMethod {
            name: name.to_owned(),
            input,
            output,
            kind,
            idempotency,
        })
    }
}

/// A literal value as generated code writes it (`!0` is true, `!1` false, `void 0` undefined).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Lit<'a> {
    Num(f64),
    Str(&'a str),
    Bool(bool),
    Undefined,
}

pub(super) fn literal<'a>(expr: &'a Expression<'a>) -> Option<Lit<'a>> {
    match expr.without_parentheses() {
        Expression::NumericLiteral(n) => Some(Lit::Num(n.value)),
        Expression::StringLiteral(s) => Some(Lit::Str(s.value.as_str())),
        Expression::BooleanLiteral(b) => Some(Lit::Bool(b.value)),
        Expression::Identifier(id) if id.name.as_str() == "undefined" => Some(Lit::Undefined),
        Expression::UnaryExpression(unary) => match (unary.operator, literal(&unary.argument)?) {
            (UnaryOperator::LogicalNot, Lit::Num(n)) => Some(Lit::Bool(n == 0.0)),
            (UnaryOperator::LogicalNot, Lit::Bool(b)) => Some(Lit::Bool(!b)),
            (UnaryOperator::UnaryNegation, Lit::Num(n)) => Some(Lit::Num(-n)),
            (UnaryOperator::Void, _) => Some(Lit::Undefined),
            _ => None,
        },
        _ => None,
    }
}

/// A scalar type: a number (`T: 9`) or, unminified, `ScalarType.STRING`.
pub(super) fn scalar_type(expr: &Expression<'_>) -> Option<i32> {
    const NAMES: &[(&str, i32)] = &[
        ("DOUBLE", 1),
        ("FLOAT", 2),
        ("INT64", 3),
        ("UINT64", 4),
        ("INT32", 5),
        ("FIXED64", 6),
        ("FIXED32", 7),
        ("BOOL", 8),
        ("STRING", 9),
        ("BYTES", 12),
        ("UINT32", 13),
        ("SFIXED32", 15),
        ("SFIXED64", 16),
        ("SINT32", 17),
        ("SINT64", 18),
    ];
    if let Expression::NumericLiteral(n) = expr.without_parentheses() {
        let value = n.value as i32;
        return NAMES.iter().any(|(_, v)| *v == value).then_some(value);
    }
    let name = static_property_name(expr)?;
    NAMES.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

pub(super) fn method_kind(expr: &Expression<'_>) -> Option<MethodKind> {
    let by_name = |name: &str| match name {
        "Unary" => Some(MethodKind::Unary),
        "ServerStreaming" => Some(MethodKind::ServerStreaming),
        "ClientStreaming" => Some(MethodKind::ClientStreaming),
        "BiDiStreaming" => Some(MethodKind::BiDiStreaming),
        _ => None,
    };
    if let Some(name) = static_property_name(expr) {
        return by_name(name);
    }
    match expr.without_parentheses() {
        Expression::NumericLiteral(n) => match n.value as i32 {
            0 => Some(MethodKind::Unary),
            1 => Some(MethodKind::ServerStreaming),
            2 => Some(MethodKind::ClientStreaming),
            3 => Some(MethodKind::BiDiStreaming),
            _ => None,
        },
        Expression::StringLiteral(s) => by_name(s.value.as_str()),
        _ => None,
    }
}

pub(super) fn static_property_name<'a>(expr: &'a Expression<'a>) -> Option<&'a str> {
    expr.without_parentheses()
        .as_member_expression()
        .and_then(|m| m.static_property_name())
}

pub(super) fn callee_property<'a>(call: &'a CallExpression<'a>) -> Option<&'a str> {
    let callee = match call.callee.without_parentheses() {
        // `(0, r.X)(...)`: webpack's way of calling an import without `this`.
        Expression::SequenceExpression(seq) => seq.expressions.last()?,
        callee => callee,
    };
    match callee.without_parentheses() {
        Expression::Identifier(id) => Some(id.name.as_str()),
        other => static_property_name(other),
    }
}

pub(super) fn key_name<'a>(key: &'a oxc_ast::ast::PropertyKey<'a>) -> Option<&'a str> {
    match key {
        oxc_ast::ast::PropertyKey::StaticIdentifier(id) => Some(id.name.as_str()),
        oxc_ast::ast::PropertyKey::StringLiteral(s) => Some(s.value.as_str()),
        _ => None,
    }
}

pub(super) fn number_key(value: f64) -> String {
    format_number(value)
}

pub(super) fn format_number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        value.to_string()
    }
}

/// `key: value` pairs of an object literal with plain keys (methods and shorthands included).
pub(super) fn object_entries<'a>(
    object: &'a ObjectExpression<'a>,
) -> impl Iterator<Item = (&'a str, &'a Expression<'a>)> + 'a {
    object
        .properties
        .iter()
        .filter_map(|property| match property {
            ObjectPropertyKind::ObjectProperty(p) if !p.computed => {
                Some((key_name(&p.key)?, &p.value))
            }
            _ => None,
        })
}

/// `{value: v}` or `{get: () => v}` as `Object.defineProperty` takes them.
pub(super) fn descriptor_value<'a>(expr: &'a Expression<'a>) -> Option<&'a Expression<'a>> {
    let Expression::ObjectExpression(object) = expr.without_parentheses() else {
        return None;
    };
    object_entries(object)
        .find_map(|(key, value)| (key == "value" || key == "get").then_some(value))
}

pub(super) fn webpack_export_list<'a>(
    list: &'a ArrayExpression<'a>,
) -> Vec<(&'a str, &'a Expression<'a>)> {
    let items: Vec<Option<&'a Expression<'a>>> = list
        .elements
        .iter()
        .map(ArrayExpressionElement::as_expression)
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < items.len() {
        let (Some(Expression::StringLiteral(key)), Some(flag)) = (items[i], items[i + 1]) else {
            break;
        };
        let is_value = matches!(literal(flag), Some(Lit::Num(n)) if n == 0.0);
        if is_value {
            if let Some(Some(value)) = items.get(i + 2) {
                out.push((key.value.as_str(), *value));
            }
            i += 3;
        } else {
            out.push((key.value.as_str(), flag));
            i += 2;
        }
    }
    out
}

/// What an arrow returns: its expression body, or the argument of a body that is one `return`.
pub(super) fn arrow_result<'a>(
    arrow: &'a oxc_ast::ast::ArrowFunctionExpression<'a>,
) -> Option<&'a Expression<'a>> {
    match &arrow.body {
        ArrowFunctionBody::FunctionBody(body) => match body.statements.as_slice() {
            [Statement::ReturnStatement(ret)] => ret.argument.as_ref(),
            _ => None,
        },
        body => body.as_expression(),
    }
}

/// The array of field entries inside `util.newFieldList(() => [...])`, `() => [...]` or `[...]`.
pub(super) fn field_array<'a>(expr: &'a Expression<'a>) -> Option<&'a ArrayExpression<'a>> {
    match expr.without_parentheses() {
        Expression::ArrayExpression(list) => Some(list),
        Expression::ArrowFunctionExpression(arrow) => field_array(arrow_result(arrow)?),
        Expression::FunctionExpression(function) => {
            match function.body.as_ref()?.statements.as_slice() {
                [Statement::ReturnStatement(ret)] => field_array(ret.argument.as_ref()?),
                _ => None,
            }
        }
        Expression::CallExpression(call) => call
            .arguments
            .iter()
            .filter_map(Argument::as_expression)
            .find_map(field_array),
        _ => None,
    }
}

/// The runtime a `setEnumType`/`makeEnum` call was made through: `X` of `X.util.setEnumType(...)` or
/// `X.makeEnum(...)`.
pub(super) fn callee_runtime<'a>(call: &'a CallExpression<'a>) -> Option<&'a Expression<'a>> {
    let Expression::StaticMemberExpression(callee) = call.callee.without_parentheses() else {
        return None;
    };
    match callee.object.without_parentheses() {
        Expression::StaticMemberExpression(util) if util.property.name == "util" => {
            Some(&util.object)
        }
        other => Some(other),
    }
}

//! Reading protobuf-es (v1) metadata out of one JavaScript bundle.
//!
//! Owns the JavaScript side of extraction: parsing with oxc, scope resolution with oxc_semantic, and turning
//! what the generated code *means* into [`Bundle`] (messages, enums and services with every referenced type
//! resolved to its full name). Nothing here knows about descriptors or `.proto` text (`extract.rs` does).
//!
//! Bundlers write the same generated classes in different shapes, so facts are read by meaning, not by one
//! textual pattern:
//! - a *member* of an owner is any way a property gets a value: `X.p = v`, a static class field
//!   `static p = v`, `this.p = v` in a static block, a define helper `f(X, "p", v)` /
//!   `Object.defineProperty(X, "p", {value|get})`, or an export getter map `f(X, {p: () => v})` /
//!   webpack's `n.d(X, ["p", 0, v])`;
//! - an *owner* is a symbol (scope-resolved, so two `n`s in two scopes never mix), a class, or a
//!   `makeMessageType`/`makeEnum` call;
//! - an expression is followed to its owners through aliases (`var a = b`), class bindings (`var X = class n`),
//!   member reads of namespaces and webpack modules (`r.KSt` where `r = n(804)`), `getEnumType(X)`, arrows
//!   `() => X`, sequences `(0, X)` and `X || {}`.
//!
//! A message is an owner with a `typeName` string member and a `fields` member; an enum is the first argument of
//! `setEnumType(X, "name", [...])` (or a `makeEnum` call); a service is an object literal with `typeName` and
//! `methods`.

use std::collections::{HashMap, HashSet};

use oxc_allocator::Allocator;
use oxc_ast::AstKind;
use oxc_ast::ast::{
    Argument, ArrayExpression, ArrayExpressionElement, ArrowFunctionBody, AssignmentOperator,
    AssignmentTarget, BindingPattern, CallExpression, Expression, ObjectExpression,
    ObjectPropertyKind, Statement, UnaryOperator,
};
use oxc_parser::Parser;
use oxc_semantic::{AstNodes, Scoping, SemanticBuilder};
use oxc_span::{GetSpan, SourceType};
use oxc_syntax::node::NodeId;
use oxc_syntax::symbol::SymbolId;

/// How deep an expression is followed through aliases and members before giving up (cycles are cut earlier).
const MAX_DEPTH: u32 = 48;

/// Everything protobuf-es declares in one bundle, with references resolved to full names.
#[derive(Debug, Default)]
pub(crate) struct Bundle {
    pub messages: Vec<RawMessage>,
    pub enums: Vec<RawEnum>,
    pub services: Vec<RawService>,
    /// Fields left out because their type could not be resolved, or whose metadata could not be read.
    pub problems: Vec<Problem>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Syntax {
    Proto2,
    Proto3,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawMessage {
    pub full_name: String,
    pub syntax: Syntax,
    pub fields: Vec<RawField>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawField {
    pub number: i32,
    pub name: String,
    pub json_name: Option<String>,
    pub kind: FieldKind,
    pub repeated: bool,
    pub optional: bool,
    pub required: bool,
    pub oneof: Option<String>,
    pub packed: Option<bool>,
    /// `L: 1`: a 64-bit integer read as a JavaScript string (`jstype = JS_STRING`).
    pub js_string: bool,
    pub delimited: bool,
    pub default: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FieldKind {
    Scalar(i32),
    Message(String),
    Enum(String),
    Map { key: i32, value: MapValue },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MapValue {
    Scalar(i32),
    Message(String),
    Enum(String),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawEnum {
    pub full_name: String,
    pub values: Vec<(i32, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawService {
    pub full_name: String,
    pub methods: Vec<RawMethod>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawMethod {
    pub name: String,
    pub input: String,
    pub output: String,
    pub kind: MethodKind,
    pub idempotency: Option<Idempotency>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MethodKind {
    Unary,
    ServerStreaming,
    ClientStreaming,
    BiDiStreaming,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Idempotency {
    NoSideEffects,
    Idempotent,
}

/// Something the extractor read but could not use; the rest of the schema stays sound without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// The message, enum or service it belongs to.
    pub owner: String,
    /// The field or method (empty for the type itself).
    pub member: String,
    pub reason: String,
}

/// The bundle could not be read as JavaScript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParseFailure {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Parses `source` and reads every protobuf-es declaration in it.
pub(crate) fn read_bundle(source: &str) -> Result<Bundle, ParseFailure> {
    let allocator = Allocator::default();
    let parsed = parse(&allocator, source)?;
    let semantic = SemanticBuilder::new().with_build_nodes(true).build(parsed);
    let semantic = semantic.semantic;
    let mut collector = Collector::new(source, semantic.scoping(), semantic.nodes());
    collector.collect();
    Ok(collector.into_bundle())
}

fn parse<'a>(
    allocator: &'a Allocator,
    source: &'a str,
) -> Result<&'a oxc_ast::ast::Program<'a>, ParseFailure> {
    // Bundles are scripts (esbuild's cjs, webpack's IIFE); a module is tried when a script does not parse
    // (top-level `import`/`export`).
    let mut first_failure = None;
    for source_type in [SourceType::cjs(), SourceType::mjs()] {
        let ret = Parser::new(allocator, source, source_type).parse();
        if ret.panicked || ret.diagnostics.has_errors() {
            if first_failure.is_none() {
                let (message, offset) = ret
                    .diagnostics
                    .errors()
                    .next()
                    .map(|e| {
                        let offset = e.labels.first().map_or(0, |label| label.offset());
                        (e.message.to_string(), offset)
                    })
                    .unwrap_or_else(|| ("the parser gave up".to_owned(), 0));
                let (line, column) = line_column(source, offset as usize);
                first_failure = Some(ParseFailure {
                    line,
                    column,
                    message,
                });
            }
            continue;
        }
        return Ok(allocator.alloc(ret.program));
    }
    Err(first_failure.unwrap_or(ParseFailure {
        line: 1,
        column: 1,
        message: "not JavaScript".to_owned(),
    }))
}

fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let before = &source[..offset.min(source.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Something that can have members and be a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Owner {
    Symbol(SymbolId),
    /// A class, by the start of its span.
    Class(u32),
    /// A `makeMessageType(...)` / `makeEnum(...)` call, by the start of its span.
    Call(u32),
}

enum Def<'a> {
    Message {
        name: &'a str,
        fields: &'a Expression<'a>,
        runtime: Option<&'a Expression<'a>>,
    },
    Enum {
        name: &'a str,
        values: &'a Expression<'a>,
    },
}

struct Collector<'s, 'a> {
    source: &'s str,
    scoping: &'s Scoping,
    nodes: &'s AstNodes<'a>,
    /// Every value a symbol is given: its initializer and each `x = v`.
    values: HashMap<SymbolId, Vec<&'a Expression<'a>>>,
    class_of_binding: HashMap<SymbolId, u32>,
    members: HashMap<Owner, HashMap<&'a str, &'a Expression<'a>>>,
    defs: HashMap<Owner, Def<'a>>,
    /// Enum definitions in order of appearance (owners may repeat; the first wins).
    enum_order: Vec<Owner>,
    services: Vec<&'a ObjectExpression<'a>>,
    /// webpack module id → its `exports` parameter.
    modules: HashMap<String, SymbolId>,
}

impl<'s, 'a> Collector<'s, 'a> {
    fn new(source: &'s str, scoping: &'s Scoping, nodes: &'s AstNodes<'a>) -> Self {
        Self {
            source,
            scoping,
            nodes,
            values: HashMap::new(),
            class_of_binding: HashMap::new(),
            members: HashMap::new(),
            defs: HashMap::new(),
            enum_order: Vec::new(),
            services: Vec::new(),
            modules: HashMap::new(),
        }
    }

    fn collect(&mut self) {
        let nodes = self.nodes;
        for node in nodes.iter() {
            match node.kind() {
                AstKind::VariableDeclarator(decl) => {
                    if let (BindingPattern::BindingIdentifier(id), Some(init)) =
                        (&decl.id, &decl.init)
                        && let Some(symbol) = id.symbol_id.get()
                    {
                        self.values.entry(symbol).or_default().push(init);
                    }
                }
                AstKind::AssignmentExpression(assign)
                    if assign.operator == AssignmentOperator::Assign =>
                {
                    self.on_assignment(node.id(), &assign.left, &assign.right);
                }
                AstKind::Class(class) => {
                    if let Some(symbol) = class.id.as_ref().and_then(|id| id.symbol_id.get()) {
                        self.class_of_binding.insert(symbol, class.span.start);
                    }
                }
                AstKind::PropertyDefinition(prop) if prop.r#static => {
                    if let (Some(name), Some(value), Some(class)) = (
                        key_name(&prop.key),
                        &prop.value,
                        self.enclosing_class(node.id()),
                    ) {
                        self.add_member(Owner::Class(class), name, value);
                    }
                }
                AstKind::CallExpression(call) => self.on_call(node.id(), call),
                AstKind::ObjectExpression(object) => self.on_object(node.id(), object),
                _ => {}
            }
        }
        self.find_message_defs();
    }

    fn add_member(&mut self, owner: Owner, name: &'a str, value: &'a Expression<'a>) {
        self.members
            .entry(owner)
            .or_default()
            .entry(name)
            .or_insert(value);
    }

    fn member(&self, owner: Owner, name: &str) -> Option<&'a Expression<'a>> {
        self.members.get(&owner)?.get(name).copied()
    }

    fn symbol_of(&self, id: &oxc_ast::ast::IdentifierReference<'a>) -> Option<SymbolId> {
        let reference = id.reference_id.get()?;
        self.scoping.get_reference(reference).symbol_id()
    }

    /// The class whose static block or static field contains `node` (`this` there is the class), if no
    /// ordinary function comes first.
    fn enclosing_class(&self, node: NodeId) -> Option<u32> {
        for ancestor in self.nodes.ancestors(node) {
            match ancestor.kind() {
                AstKind::Class(class) => return Some(class.span.start),
                AstKind::Function(_) => return None,
                _ => {}
            }
        }
        None
    }

    /// The owner an expression written as a member's target stands for: an identifier or `this`.
    fn target_owner(&self, node: NodeId, expr: &'a Expression<'a>) -> Option<Owner> {
        match expr.without_parentheses() {
            Expression::Identifier(id) => self.symbol_of(id).map(Owner::Symbol),
            Expression::ThisExpression(_) => self.enclosing_class(node).map(Owner::Class),
            _ => None,
        }
    }

    fn on_assignment(
        &mut self,
        node: NodeId,
        left: &'a AssignmentTarget<'a>,
        right: &'a Expression<'a>,
    ) {
        match left {
            AssignmentTarget::AssignmentTargetIdentifier(id) => {
                if let Some(symbol) = self.symbol_of(id) {
                    self.values.entry(symbol).or_default().push(right);
                }
            }
            AssignmentTarget::StaticMemberExpression(member) => {
                if let Some(owner) = self.target_owner(node, &member.object) {
                    self.add_member(owner, member.property.name.as_str(), right);
                }
            }
            AssignmentTarget::ComputedMemberExpression(member) => {
                if let (Expression::StringLiteral(key), Some(owner)) =
                    (&member.expression, self.target_owner(node, &member.object))
                {
                    self.add_member(owner, key.value.as_str(), right);
                }
            }
            _ => {}
        }
    }

    fn on_call(&mut self, node: NodeId, call: &'a CallExpression<'a>) {
        let args: Vec<&'a Expression<'a>> = call
            .arguments
            .iter()
            .filter_map(Argument::as_expression)
            .collect();
        let callee_name = callee_property(call);
        match (callee_name, args.as_slice()) {
            (Some("setEnumType"), [target, Expression::StringLiteral(name), values, ..]) => {
                if let Some(owner) = self.target_owner(node, target) {
                    self.define(
                        owner,
                        Def::Enum {
                            name: name.value.as_str(),
                            values,
                        },
                    );
                }
            }
            (Some("makeEnum"), [Expression::StringLiteral(name), values, ..]) => {
                self.define(
                    Owner::Call(call.span.start),
                    Def::Enum {
                        name: name.value.as_str(),
                        values,
                    },
                );
            }
            (Some("makeMessageType"), [Expression::StringLiteral(name), fields, ..]) => {
                let runtime = match call.callee.without_parentheses() {
                    Expression::StaticMemberExpression(m) => Some(&m.object),
                    _ => None,
                };
                self.define(
                    Owner::Call(call.span.start),
                    Def::Message {
                        name: name.value.as_str(),
                        fields,
                        runtime,
                    },
                );
            }
            // A define helper: `__publicField(X, "typeName", v)`, `Object.defineProperty(X, "p", {value: v})`.
            (_, [target, Expression::StringLiteral(key), value, ..]) => {
                if let Some(owner) = self.target_owner(node, target) {
                    let value = descriptor_value(value).unwrap_or(value);
                    self.add_member(owner, key.value.as_str(), value);
                }
            }
            // An export getter map: esbuild's `__export(ns, {A: () => a})`, webpack's `n.d(exports, {A: () => a})`.
            (_, [target, Expression::ObjectExpression(map)]) => {
                if let Some(owner) = self.target_owner(node, target) {
                    for (key, value) in object_entries(map) {
                        self.add_member(owner, key, value);
                    }
                }
            }
            // webpack 5's compact form: `n.d(exports, ["A", 0, a, "B", getter, ...])`: a zero flag is followed
            // by the value, anything else is the getter.
            (_, [target, Expression::ArrayExpression(list)]) => {
                if let Some(owner) = self.target_owner(node, target) {
                    for (key, value) in webpack_export_list(list) {
                        self.add_member(owner, key, value);
                    }
                }
            }
            _ => {}
        }
    }

    fn define(&mut self, owner: Owner, def: Def<'a>) {
        if matches!(def, Def::Enum { .. }) && !self.defs.contains_key(&owner) {
            self.enum_order.push(owner);
        }
        self.defs.entry(owner).or_insert(def);
    }

    fn on_object(&mut self, _node: NodeId, object: &'a ObjectExpression<'a>) {
        let entries: Vec<(&'a str, &'a Expression<'a>)> = object_entries(object).collect();
        let has = |name: &str| entries.iter().any(|(k, _)| *k == name);
        if has("typeName") && has("methods") {
            self.services.push(object);
        }
        // A webpack module table: `{66(e, t, n) {...}, 617(e, t, n) {...}}`; the second parameter is the
        // module's `exports`.
        for property in &object.properties {
            let ObjectPropertyKind::ObjectProperty(property) = property else {
                continue;
            };
            let oxc_ast::ast::PropertyKey::NumericLiteral(key) = &property.key else {
                continue;
            };
            let params = match &property.value {
                Expression::FunctionExpression(f) => &f.params,
                Expression::ArrowFunctionExpression(f) => &f.params,
                _ => continue,
            };
            if let Some(BindingPattern::BindingIdentifier(exports)) =
                params.items.get(1).map(|p| &p.pattern)
                && let Some(symbol) = exports.symbol_id.get()
            {
                self.modules.insert(number_key(key.value), symbol);
            }
        }
    }

    /// Every owner with a string `typeName` and a `fields` member is a message class.
    fn find_message_defs(&mut self) {
        let mut found = Vec::new();
        for (owner, members) in &self.members {
            if let (Some(Expression::StringLiteral(name)), Some(fields)) =
                (members.get("typeName"), members.get("fields"))
            {
                found.push((
                    *owner,
                    Def::Message {
                        name: name.value.as_str(),
                        fields,
                        runtime: members.get("runtime").copied(),
                    },
                ));
            }
        }
        for (owner, def) in found {
            self.defs.entry(owner).or_insert(def);
        }
    }

    /// Follows an expression to every owner it may stand for, nearest first.
    fn owners(&self, expr: &'a Expression<'a>) -> Vec<Owner> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        self.follow(expr, 0, &mut seen, &mut out);
        out
    }

    fn follow(
        &self,
        expr: &'a Expression<'a>,
        depth: u32,
        seen: &mut HashSet<SymbolId>,
        out: &mut Vec<Owner>,
    ) {
        if depth > MAX_DEPTH {
            return;
        }
        match expr.without_parentheses() {
            Expression::Identifier(id) => {
                let Some(symbol) = self.symbol_of(id) else {
                    return;
                };
                if !seen.insert(symbol) {
                    return;
                }
                out.push(Owner::Symbol(symbol));
                if let Some(class) = self.class_of_binding.get(&symbol) {
                    out.push(Owner::Class(*class));
                }
                for value in self.values.get(&symbol).into_iter().flatten() {
                    self.follow(value, depth + 1, seen, out);
                }
            }
            Expression::ClassExpression(class) => {
                out.push(Owner::Class(class.span.start));
            }
            Expression::StaticMemberExpression(member) => {
                self.follow_member(
                    &member.object,
                    member.property.name.as_str(),
                    depth,
                    seen,
                    out,
                );
            }
            Expression::ComputedMemberExpression(member) => {
                if let Expression::StringLiteral(key) = &member.expression {
                    self.follow_member(&member.object, key.value.as_str(), depth, seen, out);
                }
            }
            Expression::CallExpression(call) => {
                let args: Vec<&'a Expression<'a>> = call
                    .arguments
                    .iter()
                    .filter_map(Argument::as_expression)
                    .collect();
                match (callee_property(call), args.as_slice()) {
                    (Some("getEnumType"), [inner]) => self.follow(inner, depth + 1, seen, out),
                    (_, [Expression::NumericLiteral(id)]) => {
                        if let Some(exports) = self.modules.get(&number_key(id.value)) {
                            out.push(Owner::Symbol(*exports));
                        }
                    }
                    _ => {
                        let owner = Owner::Call(call.span.start);
                        if self.defs.contains_key(&owner) {
                            out.push(owner);
                        }
                    }
                }
            }
            Expression::ArrowFunctionExpression(arrow) if arrow.params.items.is_empty() => {
                if let Some(body) = arrow_result(arrow) {
                    self.follow(body, depth + 1, seen, out);
                }
            }
            Expression::SequenceExpression(seq) => {
                if let Some(last) = seq.expressions.last() {
                    self.follow(last, depth + 1, seen, out);
                }
            }
            Expression::LogicalExpression(logical) => {
                self.follow(&logical.left, depth + 1, seen, out);
            }
            Expression::AssignmentExpression(assign) => {
                self.follow(&assign.right, depth + 1, seen, out);
            }
            _ => {}
        }
    }

    fn follow_member(
        &self,
        object: &'a Expression<'a>,
        property: &str,
        depth: u32,
        seen: &mut HashSet<SymbolId>,
        out: &mut Vec<Owner>,
    ) {
        let mut inner_seen = seen.clone();
        for owner in self.owners_from(object, depth + 1, &mut inner_seen) {
            if let Some(value) = self.member(owner, property) {
                self.follow(value, depth + 1, seen, out);
            }
        }
    }

    fn owners_from(
        &self,
        expr: &'a Expression<'a>,
        depth: u32,
        seen: &mut HashSet<SymbolId>,
    ) -> Vec<Owner> {
        let mut out = Vec::new();
        self.follow(expr, depth, seen, &mut out);
        out
    }

    /// The full name of the message or enum an expression refers to.
    fn type_name(&self, expr: &'a Expression<'a>) -> Option<&'a str> {
        self.owners(expr)
            .into_iter()
            .find_map(|owner| match self.defs.get(&owner)? {
                Def::Message { name, .. } | Def::Enum { name, .. } => Some(*name),
            })
    }

    /// `proto2` or `proto3`, from the runtime a class names (`X.runtime = proto3`), which was made by
    /// `makeProtoRuntime("proto3", ...)`.
    fn syntax(&self, runtime: Option<&'a Expression<'a>>) -> Option<Syntax> {
        let runtime = runtime?;
        for owner in self.owners(runtime) {
            let Owner::Symbol(symbol) = owner else {
                continue;
            };
            for value in self.values.get(&symbol).into_iter().flatten() {
                if let Expression::CallExpression(call) = value.without_parentheses()
                    && let Some(Expression::StringLiteral(kind)) =
                        call.arguments.first().and_then(Argument::as_expression)
                {
                    match kind.value.as_str() {
                        "proto3" => return Some(Syntax::Proto3),
                        "proto2" => return Some(Syntax::Proto2),
                        _ => {}
                    }
                }
            }
        }
        None
    }

    fn snippet(&self, expr: &Expression<'_>) -> String {
        let span = expr.span();
        let text = self
            .source
            .get(span.start as usize..span.end as usize)
            .unwrap_or("?");
        let mut short: String = text.chars().take(60).collect();
        if short.len() < text.len() {
            short.push('…');
        }
        short
    }

    fn into_bundle(self) -> Bundle {
        let mut bundle = Bundle::default();
        let mut owners: Vec<(&Owner, &Def<'a>)> = self.defs.iter().collect();
        // Source order, so output and problems are deterministic.
        owners.sort_by_key(|(owner, _)| self.order_key(**owner));
        for (_, def) in owners {
            match def {
                Def::Message {
                    name,
                    fields,
                    runtime,
                } => {
                    let message = self.read_message(name, fields, *runtime, &mut bundle.problems);
                    bundle.messages.push(message);
                }
                Def::Enum { name, values } => {
                    bundle.enums.push(RawEnum {
                        full_name: (*name).to_owned(),
                        values: read_enum_values(values),
                    });
                }
            }
        }
        for object in &self.services {
            if let Some(service) = self.read_service(object, &mut bundle.problems) {
                bundle.services.push(service);
            }
        }
        bundle
    }

    fn order_key(&self, owner: Owner) -> u32 {
        match owner {
            Owner::Class(start) | Owner::Call(start) => start,
            Owner::Symbol(symbol) => self.scoping.symbol_span(symbol).start,
        }
    }

    fn read_message(
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
        };
        let Some(list) = field_array(fields) else {
            problems.push(Problem {
                owner: name.to_owned(),
                member: String::new(),
                reason: format!("its field list could not be read: {}", self.snippet(fields)),
            });
            return message;
        };
        for element in &list.elements {
            let Some(Expression::ObjectExpression(object)) = element.as_expression() else {
                problems.push(Problem {
                    owner: name.to_owned(),
                    member: String::new(),
                    reason: "a field entry is not an object literal".to_owned(),
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
            _ => return Err((String::new(), "a field entry has no name".to_owned())),
        };
        let fail = |reason: String| (name.clone(), reason);
        let number = match props.get("no").and_then(|e| literal(e)) {
            Some(Lit::Num(n)) if n.fract() == 0.0 && n >= 1.0 && n <= f64::from(i32::MAX) => {
                n as i32
            }
            _ => return Err(fail("no field number (`no`)".to_owned())),
        };
        let kind_name = match props.get("kind").and_then(|e| literal(e)) {
            Some(Lit::Str(kind)) => kind,
            _ => return Err(fail("no `kind`".to_owned())),
        };
        let t = props.get("T").copied();
        let kind = match kind_name {
            "scalar" => FieldKind::Scalar(
                t.and_then(scalar_type)
                    .ok_or_else(|| fail(self.unreadable("scalar type", t)))?,
            ),
            "message" => FieldKind::Message(self.resolve(t).map_err(fail)?),
            "enum" => FieldKind::Enum(self.resolve(t).map_err(fail)?),
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
                    Some(Lit::Str("message")) => MapValue::Message(self.resolve(vt).map_err(fail)?),
                    Some(Lit::Str("enum")) => MapValue::Enum(self.resolve(vt).map_err(fail)?),
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

    fn resolve(&self, t: Option<&'a Expression<'a>>) -> Result<String, String> {
        let Some(t) = t else {
            return Err("no type (`T`)".to_owned());
        };
        self.type_name(t).map(str::to_owned).ok_or_else(|| {
            format!(
                "type reference `{}` does not resolve to a message or enum",
                self.snippet(t)
            )
        })
    }

    fn unreadable(&self, what: &str, expr: Option<&'a Expression<'a>>) -> String {
        match expr {
            Some(expr) => format!("unreadable {what} `{}`", self.snippet(expr)),
            None => format!("no {what}"),
        }
    }

    fn read_service(
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
        };
        for (local, method) in object_entries(methods) {
            let Expression::ObjectExpression(method) = method.without_parentheses() else {
                continue;
            };
            match self.read_method(method) {
                Ok(method) => service.methods.push(method),
                Err(reason) => problems.push(Problem {
                    owner: full_name.to_owned(),
                    member: local.to_owned(),
                    reason,
                }),
            }
        }
        Some(service)
    }

    fn read_method(&self, method: &'a ObjectExpression<'a>) -> Result<RawMethod, String> {
        let props: HashMap<&str, &'a Expression<'a>> = object_entries(method).collect();
        let Some(Lit::Str(name)) = props.get("name").and_then(|e| literal(e)) else {
            return Err("a method without a name".to_owned());
        };
        let input = self.resolve(props.get("I").copied())?;
        let output = self.resolve(props.get("O").copied())?;
        let kind = match props.get("kind").map(|k| method_kind(k)) {
            Some(Some(kind)) => kind,
            _ => return Err(format!("method {name}: unreadable `kind`")),
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
enum Lit<'a> {
    Num(f64),
    Str(&'a str),
    Bool(bool),
    Undefined,
}

fn literal<'a>(expr: &'a Expression<'a>) -> Option<Lit<'a>> {
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
fn scalar_type(expr: &Expression<'_>) -> Option<i32> {
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

fn method_kind(expr: &Expression<'_>) -> Option<MethodKind> {
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

fn static_property_name<'a>(expr: &'a Expression<'a>) -> Option<&'a str> {
    expr.without_parentheses()
        .as_member_expression()
        .and_then(|m| m.static_property_name())
}

fn callee_property<'a>(call: &'a CallExpression<'a>) -> Option<&'a str> {
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

fn key_name<'a>(key: &'a oxc_ast::ast::PropertyKey<'a>) -> Option<&'a str> {
    match key {
        oxc_ast::ast::PropertyKey::StaticIdentifier(id) => Some(id.name.as_str()),
        oxc_ast::ast::PropertyKey::StringLiteral(s) => Some(s.value.as_str()),
        _ => None,
    }
}

fn number_key(value: f64) -> String {
    format_number(value)
}

fn format_number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        value.to_string()
    }
}

/// `key: value` pairs of an object literal with plain keys (methods and shorthands included).
fn object_entries<'a>(
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
fn descriptor_value<'a>(expr: &'a Expression<'a>) -> Option<&'a Expression<'a>> {
    let Expression::ObjectExpression(object) = expr.without_parentheses() else {
        return None;
    };
    object_entries(object)
        .find_map(|(key, value)| (key == "value" || key == "get").then_some(value))
}

fn webpack_export_list<'a>(list: &'a ArrayExpression<'a>) -> Vec<(&'a str, &'a Expression<'a>)> {
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
fn arrow_result<'a>(
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
fn field_array<'a>(expr: &'a Expression<'a>) -> Option<&'a ArrayExpression<'a>> {
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

fn read_enum_values<'a>(values: &'a Expression<'a>) -> Vec<(i32, String)> {
    let Expression::ArrayExpression(list) = values.without_parentheses() else {
        return Vec::new();
    };
    list.elements
        .iter()
        .filter_map(|element| {
            let Expression::ObjectExpression(object) = element.as_expression()? else {
                return None;
            };
            let props: HashMap<&str, &'a Expression<'a>> = object_entries(object).collect();
            let number = match literal(props.get("no")?)? {
                Lit::Num(n) => n as i32,
                _ => return None,
            };
            let name = match literal(props.get("name")?)? {
                Lit::Str(name) => name.to_owned(),
                _ => return None,
            };
            Some((number, name))
        })
        .collect()
}

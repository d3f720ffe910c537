//! Reading protobuf-es metadata out of one JavaScript bundle: v1's generated classes, and v2's embedded
//! descriptors (found here, decoded in `js/v2.rs`).
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
//!
//! This file holds the collector and the resolution of references; `js/read.rs` reads the metadata once its owner
//! is known (field, enum value and method entries, literals, the scalar and method-kind tables), and
//! `js/nesting.rs` refuses text nested deeper than the parser can take before it is parsed. Parsing runs on a
//! thread with a large stack of its own, so no input can overflow the caller's.

use std::collections::{HashMap, HashSet};

use oxc_allocator::Allocator;
use oxc_ast::AstKind;
use oxc_ast::ast::{
    Argument, AssignmentOperator, AssignmentTarget, BindingPattern, CallExpression, Expression,
    ObjectExpression, ObjectPropertyKind,
};
use oxc_parser::Parser;
use oxc_semantic::{AstNodes, Scoping, SemanticBuilder};
use oxc_span::{GetSpan, SourceType};
use oxc_syntax::node::NodeId;
use oxc_syntax::symbol::SymbolId;

use nesting::{line_column, panic_text};
use read::{
    arrow_result, callee_property, callee_runtime, descriptor_value, key_name, number_key,
    object_entries, webpack_export_list,
};

mod nesting;
mod read;
mod v2;

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
    /// The `.proto` files embedded as protobuf-es v2 descriptors (`fileDesc("…")`), by name.
    pub v2_files: Vec<String>,
}

/// Where a declaration was read: its byte offset in the text parsed (to tell which file of several gave it)
/// and whether it came from protobuf-es v2's embedded descriptors or v1's generated classes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Site {
    pub at: u32,
    pub v2: bool,
    /// Which of the files read together it came from (an index into them; set by `extract/merge.rs`).
    pub file: usize,
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
    pub site: Site,
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
    /// The syntax of the file that declares it, when known (v2 descriptors; v1 enums made by a runtime whose
    /// syntax is readable). A top-level enum's file is chosen by it.
    pub syntax: Option<Syntax>,
    pub site: Site,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawService {
    pub full_name: String,
    pub methods: Vec<RawMethod>,
    pub site: Site,
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
    /// The field, enum value or method (empty for the type itself).
    pub member: String,
    pub reason: String,
}

/// Why a bundle could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadFailure {
    /// The text is not JavaScript: where the parser stopped, and whether the text looks cut short (the parser
    /// stopped at its end, or it ends inside a bracket, string or comment).
    Syntax {
        line: usize,
        column: usize,
        message: String,
        cut_short: bool,
    },
    /// Nested deeper than [`MAX_NESTING`] (estimated before parsing, see `js/nesting.rs`).
    TooDeep {
        line: usize,
        column: usize,
        limit: usize,
    },
    /// The reader itself failed (a bug, or no thread could be started for it).
    Internal(String),
}

/// The deepest nesting read (estimated by `js/nesting.rs`); generated bundles stay far below it.
pub(crate) const MAX_NESTING: usize = 10_000;

/// The reader's stack: oxc takes up to about 4 KiB per level of nesting in a debug build (less than 2 KiB in
/// release), so this holds [`MAX_NESTING`] several times over. Only the part used is ever touched.
const READER_STACK: usize = 256 << 20;

/// Parses `source` and reads every protobuf-es declaration in it.
///
/// Text nested deeper than [`MAX_NESTING`] is refused before parsing, and parsing runs on a thread of its own
/// with a [`READER_STACK`]-sized stack, so no input overflows the caller's stack.
pub(crate) fn read_bundle(source: &str) -> Result<Bundle, ReadFailure> {
    let shape = nesting::check(source, MAX_NESTING).map_err(|deep| {
        let (line, column) = line_column(source, deep.offset);
        ReadFailure::TooDeep {
            line,
            column,
            limit: MAX_NESTING,
        }
    })?;
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("cursor-proto-reader".to_owned())
            .stack_size(READER_STACK)
            .spawn_scoped(scope, || read_here(source, shape))
            .map_err(|e| ReadFailure::Internal(format!("no thread for the reader: {e}")))?;
        reader
            .join()
            .unwrap_or_else(|panic| Err(ReadFailure::Internal(panic_text(panic.as_ref()))))
    })
}

fn read_here(source: &str, shape: nesting::Shape) -> Result<Bundle, ReadFailure> {
    let allocator = Allocator::default();
    let parsed = parse(&allocator, source, shape)?;
    let semantic = SemanticBuilder::new().with_build_nodes(true).build(parsed);
    let semantic = semantic.semantic;
    let mut collector = Collector::new(source, semantic.scoping(), semantic.nodes());
    collector.collect();
    Ok(collector.into_bundle())
}

fn parse<'a>(
    allocator: &'a Allocator,
    source: &'a str,
    shape: nesting::Shape,
) -> Result<&'a oxc_ast::ast::Program<'a>, ReadFailure> {
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
                        let offset = e.labels.first().map_or(0, |label| label.offset() as usize);
                        (e.message.to_string(), offset)
                    })
                    .unwrap_or_else(|| ("the parser gave up".to_owned(), 0));
                let (line, column) = line_column(source, offset);
                first_failure = Some(ReadFailure::Syntax {
                    line,
                    column,
                    message,
                    cut_short: shape.open_at_end || offset >= source.trim_end().len(),
                });
            }
            continue;
        }
        return Ok(allocator.alloc(ret.program));
    }
    Err(first_failure.unwrap_or(ReadFailure::Syntax {
        line: 1,
        column: 1,
        message: "not JavaScript".to_owned(),
        cut_short: false,
    }))
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
        /// The runtime the enum was made with (`proto2.util.setEnumType`, `proto3.makeEnum`).
        runtime: Option<&'a Expression<'a>>,
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
    /// protobuf-es v2 embedded files, in source order; `embedded_at` finds one by the start of its call.
    embedded: Vec<v2::EmbeddedFile<'a>>,
    embedded_at: HashMap<u32, usize>,
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
            embedded: Vec::new(),
            embedded_at: HashMap::new(),
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
        if self.on_embedded(call, &args) {
            return;
        }
        let callee_name = callee_property(call);
        match (callee_name, args.as_slice()) {
            (Some("setEnumType"), [target, Expression::StringLiteral(name), values, ..]) => {
                if let Some(owner) = self.target_owner(node, target) {
                    self.define(
                        owner,
                        Def::Enum {
                            name: name.value.as_str(),
                            values,
                            runtime: callee_runtime(call),
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
                        runtime: callee_runtime(call),
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
                        if self.defs.contains_key(&owner)
                            || self.embedded_at.contains_key(&call.span.start)
                        {
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
        for (owner, def) in owners {
            let site = Site {
                at: self.order_key(*owner),
                ..Site::default()
            };
            match def {
                Def::Message {
                    name,
                    fields,
                    runtime,
                } => {
                    let mut message =
                        self.read_message(name, fields, *runtime, &mut bundle.problems);
                    message.site = site;
                    bundle.messages.push(message);
                }
                Def::Enum {
                    name,
                    values,
                    runtime,
                } => {
                    let mut value = self.read_enum(name, values, &mut bundle.problems);
                    value.syntax = self.syntax(*runtime);
                    value.site = site;
                    bundle.enums.push(value);
                }
            }
        }
        for object in &self.services {
            if let Some(mut service) = self.read_service(object, &mut bundle.problems) {
                service.site = Site {
                    at: object.span.start,
                    ..Site::default()
                };
                bundle.services.push(service);
            }
        }
        self.read_embedded(&mut bundle);
        bundle
    }

    fn order_key(&self, owner: Owner) -> u32 {
        match owner {
            Owner::Class(start) | Owner::Call(start) => start,
            Owner::Symbol(symbol) => self.scoping.symbol_span(symbol).start,
        }
    }
}

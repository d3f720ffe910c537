//! A depth guard run before parsing, so that no input can overflow the stack.
//!
//! oxc's parser and the semantic pass recurse once per level of nesting: brackets, but also prefix operators
//! (`!!!!x`), right-nested chains (`a?b:c?d:…`, `a=b=c`, `x=>y=>z`, `else if`) and left-nested ones (`f()()`,
//! `a.b.c`, `1+1+1`). A pathological input such as 100,000 `[` would abort the process. This module estimates
//! the nesting of the text with a single pass over its tokens, without parsing, and [`check`] refuses text whose
//! estimate passes a limit. The estimate is meant to be high rather than low: every opening bracket and every
//! operator counts one level until the statement or list item ends (`;`, `,`, or a `}` that ends a block), and a
//! call or index `)`/`]` counts one level for the chain it continues. Generated bundles stay far below the limit
//! (the reference bundles reach about 60); the reader also runs on a thread with a large stack (see
//! `read_bundle` in `js.rs`), which holds many times the limit, for what the estimate misjudges.

/// Where the estimate first passed the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooDeep {
    /// Byte offset in the text.
    pub offset: usize,
}

/// An open bracket: what closes it, and the depth before it opened.
#[derive(Debug, Clone, Copy)]
struct Frame {
    /// `)`, `]`, `}`, or `$` for a template literal's `${…}`.
    closer: u8,
    outer: usize,
}

/// Keywords after which an operand follows (and so one more level of nesting).
const PREFIX_WORDS: &[&[u8]] = &[
    b"new",
    b"typeof",
    b"void",
    b"delete",
    b"await",
    b"yield",
    b"in",
    b"instanceof",
    b"else",
];

/// Keywords after which a `/` starts a regular expression rather than a division.
const REGEX_AFTER: &[&[u8]] = &[b"return", b"throw", b"case", b"do"];

/// What the scan saw of a text that is not too deep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The text ends inside a bracket, string, template or comment: it was likely cut short.
    pub open_at_end: bool,
}

/// Refuses `source` when its estimated nesting passes `limit`.
pub(crate) fn check(source: &str, limit: usize) -> Result<Shape, TooDeep> {
    let mut scanner = Scanner {
        bytes: source.as_bytes(),
        at: 0,
        depth: 0,
        frames: Vec::new(),
        after_value: false,
        unterminated: false,
        limit,
    };
    scanner.run()?;
    Ok(Shape {
        open_at_end: scanner.unterminated || !scanner.frames.is_empty(),
    })
}

struct Scanner<'s> {
    bytes: &'s [u8],
    at: usize,
    depth: usize,
    frames: Vec<Frame>,
    /// The previous token ends a value (an identifier, literal, `)` or `]`): a `/` is a division.
    after_value: bool,
    /// The text ended inside a string, template or comment.
    unterminated: bool,
    limit: usize,
}

impl Scanner<'_> {
    fn run(&mut self) -> Result<(), TooDeep> {
        if self.bytes.starts_with(b"#!") {
            self.skip_line();
        }
        while let Some(&byte) = self.bytes.get(self.at) {
            match byte {
                b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => self.at += 1,
                b'/' if self.peek(1) == Some(b'/') => self.skip_line(),
                b'/' if self.peek(1) == Some(b'*') => self.skip_block_comment(),
                b'/' if !self.after_value && self.skip_regex() => self.after_value = true,
                b'\'' | b'"' => {
                    self.skip_string(byte);
                    self.after_value = true;
                }
                b'`' => {
                    self.at += 1;
                    self.template()?;
                }
                b'(' | b'[' | b'{' => {
                    let closer = match byte {
                        b'(' => b')',
                        b'[' => b']',
                        _ => b'}',
                    };
                    self.at += 1;
                    self.open(closer)?;
                }
                b')' | b']' => {
                    self.at += 1;
                    // A call or an index continues a chain: one level more than before the bracket.
                    let outer = self.close();
                    self.depth = outer;
                    self.deeper()?;
                    self.after_value = true;
                }
                b'}' => {
                    self.at += 1;
                    let frame = self.frames.pop();
                    if let Some(Frame {
                        closer: b'$',
                        outer,
                    }) = frame
                    {
                        self.depth = outer;
                        self.template()?;
                        continue;
                    }
                    let outer = frame.map_or(0, |f| f.outer);
                    // A `}` that ends a block, a function or a class member ends its statement; one inside an
                    // expression (`{}.x`, `a?{}:b`, `f({})`) does not.
                    self.depth = if self.expression_continues() {
                        outer
                    } else {
                        self.base()
                    };
                    self.after_value = false;
                }
                b';' | b',' => {
                    self.at += 1;
                    self.depth = self.base();
                    self.after_value = false;
                }
                b'0'..=b'9' => {
                    self.skip_word();
                    self.after_value = true;
                }
                b'.' if self.peek(1).is_some_and(|b| b.is_ascii_digit()) => {
                    self.at += 1;
                    self.skip_word();
                    self.after_value = true;
                }
                b'+' | b'-' | b'*' | b'/' | b'%' | b'<' | b'>' | b'=' | b'&' | b'|' | b'^'
                | b'!' | b'~' | b'?' | b':' | b'.' => {
                    self.at += 1;
                    self.deeper()?;
                    self.after_value = false;
                }
                byte if is_word_byte(byte) => {
                    let start = self.at;
                    self.skip_word();
                    let word = &self.bytes[start..self.at];
                    if PREFIX_WORDS.contains(&word) {
                        self.deeper()?;
                        self.after_value = false;
                    } else {
                        self.after_value = !REGEX_AFTER.contains(&word);
                    }
                }
                _ => self.at += 1,
            }
        }
        Ok(())
    }

    fn peek(&self, ahead: usize) -> Option<u8> {
        self.bytes.get(self.at + ahead).copied()
    }

    /// The depth at the start of a statement or list item in the innermost open bracket.
    fn base(&self) -> usize {
        self.frames.last().map_or(0, |frame| frame.outer + 1)
    }

    fn deeper(&mut self) -> Result<(), TooDeep> {
        self.depth += 1;
        if self.depth > self.limit {
            return Err(TooDeep {
                offset: self.at.saturating_sub(1),
            });
        }
        Ok(())
    }

    fn open(&mut self, closer: u8) -> Result<(), TooDeep> {
        self.frames.push(Frame {
            closer,
            outer: self.depth,
        });
        self.after_value = false;
        self.deeper()
    }

    /// Pops the innermost bracket (a stray closer pops nothing) and gives the depth before it.
    fn close(&mut self) -> usize {
        match self.frames.last() {
            Some(frame) if frame.closer != b'$' => self.frames.pop().map_or(0, |f| f.outer),
            _ => self.depth,
        }
    }

    /// After a `}`: does an expression go on (an operator, `)`, `]`, `,`, `.`, `else`)?
    fn expression_continues(&self) -> bool {
        let rest = &self.bytes[self.at..];
        let Some(start) = rest.iter().position(|b| !b.is_ascii_whitespace()) else {
            return false;
        };
        let rest = &rest[start..];
        match rest[0] {
            b';' | b'{' | b'}' | b'(' | b'[' | b'\'' | b'"' | b'`' | b'#' => false,
            b'/' => matches!(rest.get(1), Some(b'/' | b'*')),
            byte if is_word_byte(byte) => {
                let word = rest
                    .iter()
                    .position(|b| !is_word_byte(*b))
                    .map_or(rest, |end| &rest[..end]);
                matches!(word, b"else" | b"in" | b"instanceof")
            }
            _ => true,
        }
    }

    /// The body of a template literal, from after its opening backtick or a `${…}`'s closing brace, up to and
    /// including its closing backtick, or up to a `${` (which opens a bracket).
    fn template(&mut self) -> Result<(), TooDeep> {
        while let Some(&byte) = self.bytes.get(self.at) {
            match byte {
                b'\\' => self.at += 2,
                b'`' => {
                    self.at += 1;
                    self.after_value = true;
                    return Ok(());
                }
                b'$' if self.peek(1) == Some(b'{') => {
                    self.at += 2;
                    return self.open(b'$');
                }
                _ => self.at += 1,
            }
        }
        self.unterminated = true;
        Ok(())
    }

    fn skip_line(&mut self) {
        while let Some(&byte) = self.bytes.get(self.at) {
            if byte == b'\n' || byte == b'\r' {
                return;
            }
            self.at += 1;
        }
    }

    fn skip_block_comment(&mut self) {
        self.at += 2;
        while self.at < self.bytes.len() {
            if self.bytes[self.at..].starts_with(b"*/") {
                self.at += 2;
                return;
            }
            self.at += 1;
        }
        self.unterminated = true;
    }

    /// A quoted string, escapes included; an unterminated one ends at the line's end.
    fn skip_string(&mut self, quote: u8) {
        self.at += 1;
        while let Some(&byte) = self.bytes.get(self.at) {
            match byte {
                b'\\' => self.at += 2,
                b'\n' | b'\r' => return,
                _ if byte == quote => {
                    self.at += 1;
                    return;
                }
                _ => self.at += 1,
            }
        }
        self.unterminated = true;
    }

    /// A regular expression literal, flags included, when one closes on this line; otherwise nothing is
    /// skipped and the `/` is an operator.
    fn skip_regex(&mut self) -> bool {
        let mut at = self.at + 1;
        let mut in_class = false;
        while let Some(&byte) = self.bytes.get(at) {
            match byte {
                b'\\' => at += 2,
                b'\n' | b'\r' => return false,
                b'[' => {
                    in_class = true;
                    at += 1;
                }
                b']' => {
                    in_class = false;
                    at += 1;
                }
                b'/' if !in_class => {
                    self.at = at + 1;
                    while self.peek(0).is_some_and(|b| b.is_ascii_alphabetic()) {
                        self.at += 1;
                    }
                    return true;
                }
                _ => at += 1,
            }
        }
        false
    }

    /// An identifier, keyword or number (`0x1f`, `1e-5` is two tokens here, which only adds a level).
    fn skip_word(&mut self) {
        while self
            .peek(0)
            .is_some_and(|b| is_word_byte(b) || b == b'.' && self.is_number_dot())
        {
            self.at += 1;
        }
    }

    /// A `.` inside a number (`1.5`), not a member access.
    fn is_number_dot(&self) -> bool {
        self.at > 0 && self.bytes[self.at - 1].is_ascii_digit() && {
            let start = self.bytes[..self.at]
                .iter()
                .rposition(|b| !is_word_byte(*b))
                .map_or(0, |p| p + 1);
            self.bytes[start].is_ascii_digit()
        }
    }
}

fn is_word_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'$' || byte == b'\\' || byte >= 0x80
}

/// The deepest estimate `source` reaches (for tests and for choosing the limit).
/// 1-based line and column (in characters) of a byte offset; an offset inside a character counts as that
/// character.
pub(super) fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let before = &source[..source.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

pub(super) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    format!("the reader panicked: {text}")
}

#[cfg(test)]
pub(crate) fn estimate(source: &str) -> usize {
    let (mut low, mut high) = (0, source.len() + 1);
    while low < high {
        let mid = (low + high) / 2;
        if check(source, mid).is_ok() {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_prefix_operators_and_chains_all_count() {
        for (name, text) in [
            (
                "arrays",
                format!("var a={}{};", "[".repeat(5000), "]".repeat(5000)),
            ),
            (
                "parens",
                format!("var a={}1{};", "(".repeat(5000), ")".repeat(5000)),
            ),
            (
                "objects",
                format!("var a={}1{};", "{a:".repeat(5000), "}".repeat(5000)),
            ),
            ("not", format!("var a={}1;", "!".repeat(5000))),
            ("ternary", format!("var a={}1;", "b?c:".repeat(5000))),
            ("calls", format!("var a=f{};", "()".repeat(5000))),
            ("members", format!("var a=f{};", ".a".repeat(5000))),
            ("plus", format!("var a={}1;", "1+".repeat(5000))),
            ("new", format!("var a={}X;", "new ".repeat(5000))),
            (
                "templates",
                format!("var a={}1{};", "`${".repeat(5000), "}`".repeat(5000)),
            ),
            (
                "else if",
                format!("if(a){{}}{}", "else if(a){}".repeat(5000)),
            ),
            (
                "functions",
                format!("{}{}", "function f(){".repeat(5000), "}".repeat(5000)),
            ),
        ] {
            assert!(estimate(&text) >= 5000, "{name}: {}", estimate(&text));
            assert!(check(&text, 4000).is_err(), "{name}");
        }
    }

    #[test]
    fn statements_items_and_declarations_do_not_add_up() {
        let many = |item: &str, n: usize| item.repeat(n);
        for (name, text) in [
            ("statements", many("a=!b+c(d)[e];", 10_000)),
            ("items", format!("var a=[{}];", many("!0,", 10_000))),
            ("object", format!("var a={{{}}};", many("a:b?c:d,", 10_000))),
            ("functions", many("function f(a){return a+1}", 10_000)),
            (
                "class",
                format!("class A{{{}}}", many("m(a){this.x=a.b.c}", 10_000)),
            ),
            ("ifs", many("if(a){b()}", 10_000)),
            (
                "webpack table",
                format!("({{{}}})", many("1(e,t,n){n.d(t,{a:()=>b})},", 10_000)),
            ),
        ] {
            assert!(estimate(&text) < 20, "{name}: {}", estimate(&text));
        }
    }

    #[test]
    fn strings_comments_and_regexes_hide_their_brackets() {
        let text = format!(
            "var a=\"{0}\",b='{0}',c=`{0}`;// {0}\n/* {0} */var d=/[(]{{2}}\\((/g,e=a/2/1;",
            "(".repeat(10_000)
        );
        assert!(estimate(&text) < 20, "{}", estimate(&text));
    }

    #[test]
    fn the_offset_points_into_the_deep_part() {
        let text = format!("var a=1;\nvar b={}", "[".repeat(100));
        let deep = check(&text, 50).expect_err("too deep");
        assert!(deep.offset > 9 && deep.offset < text.len(), "{deep:?}");
    }

    #[test]
    fn text_that_ends_inside_a_bracket_string_or_comment_looks_cut_short() {
        for (text, open) in [
            ("var a=[1,2];", false),
            ("var a=f(1,", true),
            ("var a=\"abc", true),
            ("var a=`x${1}", true),
            ("var a=1;/* note", true),
            ("def f():\n  return [1]\n", false),
        ] {
            let shape = check(text, 100).expect("shallow");
            assert_eq!(shape.open_at_end, open, "{text:?}");
        }
    }

    #[test]
    fn the_reference_bundles_stay_far_below_the_limit() {
        const BUNDLES: &str = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/reference/bundles"
        );
        for shape in ["legacy", "modern", "static-blocks", "webpack"] {
            let path = format!("{BUNDLES}/{shape}/main.js");
            let text = std::fs::read_to_string(&path).expect("reference bundle");
            let seen = check(&text, 200).map_err(|deep| deep.offset);
            assert_eq!(seen.map(|s| s.open_at_end), Ok(false), "{path}");
        }
    }
}

//! HTML escaping for pages built on the server (cursor-server's console and its templates, cursor-backend's
//! UI). It lives with the wire mechanics only because both crates need exactly this and nothing else
//! of the kind; a crate of its own for five replacements would cost more than it separates.

use std::fmt;

/// `&`, `<`, `>`, `"` and `'` as entities: safe in element text and in quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let _ = write_escaped(&mut out, text);
    out
}

/// `escape`'s rules written into `dest` without an intermediate string: what a template engine's
/// escaper calls for every value it shows.
pub fn write_escaped<W: fmt::Write>(mut dest: W, text: &str) -> fmt::Result {
    let mut rest = text;
    while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
        dest.write_str(&rest[..at])?;
        dest.write_str(match rest.as_bytes()[at] {
            b'&' => "&amp;",
            b'<' => "&lt;",
            b'>' => "&gt;",
            b'"' => "&quot;",
            _ => "&#39;",
        })?;
        rest = &rest[at + 1..];
    }
    dest.write_str(rest)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn the_five_markup_characters_become_entities_and_nothing_else_changes() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(escape("plain ünïcode 123"), "plain ünïcode 123");
        assert_eq!(escape("&amp;"), "&amp;amp;");
        assert_eq!(escape(""), "");
    }
}

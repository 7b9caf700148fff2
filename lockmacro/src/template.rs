//! Key templates: `"stock:{id}"`, `"stock:<id>"`, `"{order.id}"`, `"{self.tenant}"`, with
//! `{{`, `}}` and `<<` for literal `{`, `}` and `<`.
//!
//! Rendering must be injective (two argument tuples never name the same lock), so each
//! placeholder records the character that follows it: the expansion percent-encodes that
//! character and `%` inside the value, and the end of every value can be found again. Two
//! placeholders with nothing between them, or a `%` right after one, would defeat that and are
//! refused here.

use std::ops::Range;

/// One piece of a template.
#[derive(Debug, PartialEq)]
pub(crate) enum Part {
    /// Text copied into the key as is.
    Text(String),
    /// A placeholder: a binding name followed by field names or tuple indices.
    Hole(Hole),
}

/// `{order.id}`: `path = ["order", "id"]`; `range` is where it sits in the template (bytes);
/// `followed_by` is the first character of the text after it, `None` at the end.
#[derive(Debug, PartialEq)]
pub(crate) struct Hole {
    pub(crate) path: Vec<String>,
    pub(crate) range: Range<usize>,
    pub(crate) followed_by: Option<char>,
}

/// A template mistake and the bytes of the template it is about.
#[derive(Debug, PartialEq)]
pub(crate) struct TemplateError {
    pub(crate) message: String,
    pub(crate) range: Range<usize>,
}

/// Splits a template into text and placeholders, each placeholder told what follows it.
pub(crate) fn parse(template: &str) -> Result<Vec<Part>, TemplateError> {
    let mut parts = split(template)?;
    for i in 0..parts.len() {
        let Part::Hole(hole) = &parts[i] else {
            continue;
        };
        let next = match parts.get(i + 1) {
            Some(Part::Text(text)) => text.chars().next(),
            Some(Part::Hole(next)) => return Err(touching(hole, next, template)),
            None => None,
        };
        if next == Some('%') {
            return Err(TemplateError {
                message: format!(
                    "`%` right after placeholder `{}` in key template: `%` escapes characters \
                     inside values, so the value's end would be ambiguous; start the text after \
                     it with another character, e.g. `:`",
                    &template[hole.range.clone()]
                ),
                range: hole.range.end..hole.range.end + 1,
            });
        }
        if let Part::Hole(hole) = &mut parts[i] {
            hole.followed_by = next;
        }
    }
    Ok(parts)
}

/// Two placeholders with nothing between them: `("ab", "c")` and `("a", "bc")` would render
/// alike.
fn touching(first: &Hole, second: &Hole, template: &str) -> TemplateError {
    let (a, b) = (
        &template[first.range.clone()],
        &template[second.range.clone()],
    );
    TemplateError {
        message: format!(
            "placeholders `{a}` and `{b}` touch in key template: put a separator between them, \
             e.g. `{a}:{b}`, so that two different values can't render the same key"
        ),
        range: first.range.start..second.range.end,
    }
}

fn split(template: &str) -> Result<Vec<Part>, TemplateError> {
    let bytes = template.as_bytes();
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match (c, bytes.get(i + 1).copied()) {
            (b'{', Some(b'{')) | (b'}', Some(b'}')) | (b'<', Some(b'<')) => {
                text.push(c as char);
                i += 2;
            }
            (b'{', _) | (b'<', Some(b'a'..=b'z' | b'A'..=b'Z' | b'_')) => {
                let hole = hole_at(template, i)?;
                i = hole.range.end;
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Hole(hole));
            }
            (b'}', _) => {
                return Err(TemplateError {
                    message: "unbalanced `}` in key template: write `}}` for a literal `}`"
                        .to_owned(),
                    range: i..i + 1,
                });
            }
            _ => {
                // Copy one whole UTF-8 character.
                let ch = template[i..]
                    .chars()
                    .next()
                    .expect("i is on a char boundary");
                text.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

/// The placeholder opening with the `{` or `<` at byte `start`.
fn hole_at(template: &str, start: usize) -> Result<Hole, TemplateError> {
    let open = template[start..]
        .chars()
        .next()
        .expect("start is on `{` or `<`");
    let close = if open == '{' { '}' } else { '>' };
    let Some(len) = template[start + 1..].find(close) else {
        return Err(TemplateError {
            message: format!(
                "unbalanced `{open}` in key template: close the placeholder with `{close}`, or \
                 write `{open}{open}` for a literal `{open}`"
            ),
            range: start..template.len(),
        });
    };
    let range = start..start + len + 2;
    let path =
        parse_path(&template[start + 1..range.end - 1]).map_err(|message| TemplateError {
            message,
            range: range.clone(),
        })?;
    Ok(Hole {
        path,
        range,
        followed_by: None,
    })
}

fn parse_path(inner: &str) -> Result<Vec<String>, String> {
    let trimmed = inner.trim();
    if trimmed.is_empty() {
        return Err("empty placeholder in key template: name a parameter, e.g. `{id}`".to_owned());
    }
    let segments: Vec<&str> = trimmed.split('.').map(str::trim).collect();
    for (n, seg) in segments.iter().enumerate() {
        let ident = !seg.is_empty()
            && seg.chars().all(|c| c == '_' || c.is_alphanumeric())
            && !seg.starts_with(|c: char| c.is_ascii_digit());
        let index = n > 0 && !seg.is_empty() && seg.chars().all(|c| c.is_ascii_digit());
        if !(ident || index) || *seg == "_" {
            return Err(format!(
                "`{inner}` in key template is not a parameter name or field path: write e.g. \
                 `{{id}}`, `{{order.id}}` or `{{self.tenant}}`"
            ));
        }
    }
    Ok(segments.into_iter().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holes(t: &str) -> Vec<Vec<String>> {
        parse(t)
            .unwrap()
            .into_iter()
            .filter_map(|p| match p {
                Part::Hole(h) => Some(h.path),
                Part::Text(_) => None,
            })
            .collect()
    }

    #[test]
    fn both_placeholder_forms_and_paths() {
        assert_eq!(holes("stock:{id}"), vec![vec!["id"]]);
        assert_eq!(holes("stock:<id>"), vec![vec!["id"]]);
        assert_eq!(
            holes("{self.tenant}:{order.id}"),
            vec![vec!["self", "tenant"], vec!["order", "id"]]
        );
        assert_eq!(holes("{pair.0}"), vec![vec!["pair", "0"]]);
    }

    #[test]
    fn escapes_are_literal() {
        assert_eq!(
            parse("a{{b}}<<c>d").unwrap(),
            vec![Part::Text("a{b}<c>d".into())]
        );
        assert_eq!(parse("x < 3").unwrap(), vec![Part::Text("x < 3".into())]);
        assert_eq!(parse("é:{id}").unwrap()[0], Part::Text("é:".into()));
    }

    #[test]
    fn mistakes_name_their_place() {
        assert_eq!(parse("stock:{id").unwrap_err().range, 6..9);
        assert_eq!(parse("stock:id}").unwrap_err().range, 8..9);
        assert_eq!(parse("stock:<id").unwrap_err().range, 6..9);
        assert!(parse("{}").is_err());
        assert!(parse("{a-b}").is_err());
        assert!(parse("{0}").is_err());
        assert!(parse("{a.}").is_err());
    }

    #[test]
    fn placeholders_know_what_follows_them() {
        let next: Vec<_> = parse("o:{a}:{b}-x{c}")
            .unwrap()
            .into_iter()
            .filter_map(|p| match p {
                Part::Hole(h) => Some(h.followed_by),
                Part::Text(_) => None,
            })
            .collect();
        assert_eq!(next, [Some(':'), Some('-'), None]);
        let after_escape = parse("{a}{{b").unwrap();
        assert!(matches!(&after_escape[0], Part::Hole(h) if h.followed_by == Some('{')));
    }

    #[test]
    fn touching_placeholders_and_percent_after_one_are_refused() {
        let e = parse("o:{a}{b}").unwrap_err();
        assert_eq!(e.range, 2..8);
        assert!(e.message.contains("`{a}:{b}`"), "{}", e.message);
        assert_eq!(parse("<a><b>").unwrap_err().range, 0..6);
        assert_eq!(parse("{a}%{b}").unwrap_err().range, 3..4);
        assert!(parse("{a}:%{b}").is_ok());
    }
}

//! Key templates: `"stock:{id}"`, `"stock:<id>"`, `"{order.id}"`, `"{self.tenant}"`, with
//! `{{`, `}}` and `<<` for literal `{`, `}` and `<`.

use std::ops::Range;

/// One piece of a template.
#[derive(Debug, PartialEq)]
pub(crate) enum Part {
    /// Text copied into the key as is.
    Text(String),
    /// A placeholder: a binding name followed by field names or tuple indices.
    Hole(Hole),
}

/// `{order.id}`: `path = ["order", "id"]`; `range` is where it sits in the template (bytes).
#[derive(Debug, PartialEq)]
pub(crate) struct Hole {
    pub(crate) path: Vec<String>,
    pub(crate) range: Range<usize>,
}

/// A template mistake and the bytes of the template it is about.
#[derive(Debug, PartialEq)]
pub(crate) struct TemplateError {
    pub(crate) message: String,
    pub(crate) range: Range<usize>,
}

/// Splits a template into text and placeholders.
pub(crate) fn parse(template: &str) -> Result<Vec<Part>, TemplateError> {
    let bytes = template.as_bytes();
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        match (c, next) {
            (b'{', Some(b'{')) | (b'}', Some(b'}')) | (b'<', Some(b'<')) => {
                text.push(c as char);
                i += 2;
            }
            (b'{', _) | (b'<', Some(b'a'..=b'z' | b'A'..=b'Z' | b'_')) => {
                let close = if c == b'{' { '}' } else { '>' };
                let Some(len) = template[i + 1..].find(close) else {
                    let escape = if c == b'{' { "{{" } else { "<<" };
                    return Err(TemplateError {
                        message: format!(
                            "unbalanced `{}` in key template: close the placeholder with `{close}`, \
                             or write `{escape}` for a literal `{}`",
                            c as char, c as char
                        ),
                        range: i..template.len(),
                    });
                };
                let end = i + 1 + len;
                let path = parse_path(&template[i + 1..end]).map_err(|message| TemplateError {
                    message,
                    range: i..end + 1,
                })?;
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Hole(Hole {
                    path,
                    range: i..end + 1,
                }));
                i = end + 1;
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
}

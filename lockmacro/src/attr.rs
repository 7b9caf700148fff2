//! Parsing the attribute's arguments. Every value is checked here, so a mistake is reported on
//! the token that holds it and the expansion only sees valid input.
//!
//! [`ARGS`] is the one list of arguments: the parser looks names up in it, and the "did you
//! mean" suggestions and the examples in error messages come from it.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

/// The runtime clamps shorter leases up to this; refusing them here avoids a silent surprise.
const MIN_TTL: Duration = Duration::from_millis(30);

/// Redis keeps expiries in signed 64-bit milliseconds; a year is already absurd for a lock.
const MAX_MILLIS: u128 = 366 * 24 * 3600 * 1000;

/// One argument: its name, how its value is written, and how it is parsed into [`Found`].
struct ArgSpec {
    name: &'static str,
    /// What to write, shown when the value is missing or has the wrong form.
    example: &'static str,
    parse: fn(&ArgSpec, ParseStream<'_>, &mut Found) -> syn::Result<()>,
}

/// Every argument the attribute takes.
const ARGS: &[ArgSpec] = &[
    ArgSpec {
        name: "key",
        example: "key = \"stock:{id}\"",
        parse: |spec, input, found| {
            found.key = Some(key(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "keys",
        example: "keys = [\"acct:{from}\", \"acct:{to}\"]",
        parse: |spec, input, found| {
            found.keys = Some(keys(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "ttl",
        example: "ttl = \"30s\", or a `Duration` expression such as ttl = TTL",
        parse: |spec, input, found| {
            found.options.ttl = Some(ttl(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "wait",
        example: "wait = \"5s\", wait = \"forever\", or a `Duration` expression such as \
                  wait = WAIT",
        parse: |spec, input, found| {
            found.options.wait = Some(wait(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "max_hold",
        example: "max_hold = \"10m\", or a `Duration` expression such as max_hold = MAX_HOLD",
        parse: |spec, input, found| {
            found.options.max_hold = Some(nonzero_duration(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "min_hold",
        example: "min_hold = \"1s\", or a `Duration` expression such as min_hold = TICK",
        parse: |spec, input, found| {
            found.options.min_hold = Some(nonzero_duration(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "locker",
        example: "locker = self.locker",
        parse: |_, input, found| {
            found.options.locker = Some(input.parse()?);
            Ok(())
        },
    },
    ArgSpec {
        name: "watchdog",
        example: "watchdog = true or watchdog = false",
        parse: |spec, input, found| {
            found.options.watchdog = Some(bool_value(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "on_lost",
        example: "on_lost = \"cancel\" (drop the body and return `Lost`) or on_lost = \
                  \"continue\" (log and let the body finish)",
        parse: |spec, input, found| {
            found.options.on_lost = Some(on_lost(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "crate",
        example: "crate = ::lockrt",
        parse: |_, input, found| {
            found.options.krate = Some(input.call(Path::parse_mod_style)?);
            Ok(())
        },
    },
];

/// The attribute's arguments, validated.
pub(crate) struct Args {
    pub(crate) key: Keys,
    pub(crate) options: Options,
}

/// `key = "..."`, or `keys = [...]` (all of them or none, `Locker::run_all`).
pub(crate) enum Keys {
    One(LitStr),
    All(Vec<LitStr>),
}

/// Everything but the key; `None` = not given (the locker's default applies).
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) wait: Option<WaitArg>,
    pub(crate) max_hold: Option<DurationArg>,
    pub(crate) min_hold: Option<DurationArg>,
    pub(crate) locker: Option<Expr>,
    pub(crate) watchdog: Option<bool>,
    pub(crate) on_lost: Option<OnLostArg>,
    pub(crate) krate: Option<Path>,
}

/// A duration: a string literal checked here, or an expression of type `Duration` evaluated
/// inside the fn.
pub(crate) enum DurationArg {
    Millis(u64),
    Expr(Box<Expr>),
}

/// `wait = ...`.
pub(crate) enum WaitArg {
    For(DurationArg),
    Forever,
}

/// `on_lost = "..."`.
#[derive(Clone, Copy)]
pub(crate) enum OnLostArg {
    Cancel,
    Continue,
}

/// What the arguments said so far.
#[derive(Default)]
struct Found {
    key: Option<LitStr>,
    keys: Option<Vec<LitStr>>,
    options: Options,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut found = Found::default();
        let mut seen: Vec<&'static str> = Vec::new();
        while !input.is_empty() {
            let name = input.call(Ident::parse_any)?;
            let spec = lookup(&name)?;
            if seen.contains(&spec.name) {
                return Err(syn::Error::new(
                    name.span(),
                    format!(
                        "duplicate argument `{}`: give each argument once",
                        spec.name
                    ),
                ));
            }
            seen.push(spec.name);
            if !input.peek(Token![=]) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("`{}` needs a value: {}", spec.name, spec.example),
                ));
            }
            input.parse::<Token![=]>()?;
            (spec.parse)(spec, input, &mut found)?;
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        let key = match (found.key, found.keys) {
            (Some(key), None) => Keys::One(key),
            (None, Some(keys)) => Keys::All(keys),
            (Some(key), Some(_)) => {
                return Err(syn::Error::new(
                    key.span(),
                    "give `key` or `keys`, not both: `keys = [\"a:{x}\", \"b:{y}\"]` locks \
                     all of them",
                ));
            }
            (None, None) => {
                return Err(syn::Error::new(
                    Span::call_site(),
                    "missing `key`: say what the lock protects, e.g. \
                     #[distributed_lock(key = \"stock:{id}\")]",
                ));
            }
        };
        Ok(Args {
            key,
            options: found.options,
        })
    }
}

fn lookup(name: &Ident) -> syn::Result<&'static ArgSpec> {
    let text = name.unraw().to_string();
    if let Some(spec) = ARGS.iter().find(|spec| spec.name == text) {
        return Ok(spec);
    }
    let names: Vec<&str> = ARGS.iter().map(|spec| spec.name).collect();
    let (last, rest) = names.split_last().expect("ARGS is not empty");
    let hint = closest(&text, names.iter().copied())
        .map(|n| format!("; did you mean `{n}`?"))
        .unwrap_or_default();
    Err(syn::Error::new(
        name.span(),
        format!(
            "unknown argument `{text}`: expected {} or {last}{hint}",
            rest.join(", ")
        ),
    ))
}

/// The candidate at most two edits away from `text`, if any.
fn closest<'a>(text: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| (strsim::levenshtein(c, text), c))
        .min()
        .filter(|(d, _)| *d <= 2)
        .map(|(_, c)| c)
}

fn key(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<LitStr> {
    let lit = string_value(spec, input)?;
    if lit.value().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            "empty key template: name what the lock protects, e.g. key = \"stock:{id}\"",
        ));
    }
    Ok(lit)
}

/// `["a:{x}", "b:{y}"]`: one or more key templates.
fn keys(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<Vec<LitStr>> {
    if !input.peek(syn::token::Bracket) {
        return Err(syn::Error::new(
            input.span(),
            format!("`keys` takes a list in brackets: {}", spec.example),
        ));
    }
    let content;
    let bracket = syn::bracketed!(content in input);
    let mut keys = Vec::new();
    while !content.is_empty() {
        keys.push(key(spec, &content)?);
        if !content.is_empty() {
            content.parse::<Token![,]>()?;
        }
    }
    if keys.is_empty() {
        return Err(syn::Error::new(
            bracket.span.join(),
            format!("`keys` needs at least one key template: {}", spec.example),
        ));
    }
    Ok(keys)
}

fn ttl(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<DurationArg> {
    duration_arg(spec, input, |lit, d| {
        let d = nonzero(spec, lit, d)?;
        if d < MIN_TTL {
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`ttl` must be at least 30ms (got {}): a lease that short expires before it \
                     can be renewed",
                    lit.value()
                ),
            ));
        }
        Ok(d)
    })
}

fn wait(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<WaitArg> {
    if input.peek(LitStr) && input.fork().parse::<LitStr>()?.value().trim() == "forever" {
        input.parse::<LitStr>()?;
        return Ok(WaitArg::Forever);
    }
    // Zero is meaningful here: one attempt, no waiting.
    duration_arg(spec, input, |_, d| Ok(d)).map(WaitArg::For)
}

fn nonzero_duration(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<DurationArg> {
    duration_arg(spec, input, |lit, d| nonzero(spec, lit, d))
}

fn nonzero(spec: &ArgSpec, lit: &LitStr, d: Duration) -> syn::Result<Duration> {
    if d.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`{}` must be greater than zero: write e.g. \"30s\"",
                spec.name
            ),
        ));
    }
    Ok(d)
}

/// A string literal, parsed and handed to `check`, or any other expression, passed on as is
/// (rustc checks that it is a `Duration`). Other literals are refused here, where the mistake
/// is plainest.
fn duration_arg(
    spec: &ArgSpec,
    input: ParseStream<'_>,
    check: impl FnOnce(&LitStr, Duration) -> syn::Result<Duration>,
) -> syn::Result<DurationArg> {
    match input.parse::<Expr>()? {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => {
            let d = check(&lit, parse_duration(spec, &lit)?)?;
            Ok(DurationArg::Millis(millis(&lit, d)?))
        }
        Expr::Lit(other) => Err(syn::Error::new(
            other.span(),
            format!("`{}` takes a duration: {}", spec.name, spec.example),
        )),
        expr => Ok(DurationArg::Expr(Box::new(expr))),
    }
}

fn parse_duration(spec: &ArgSpec, lit: &LitStr) -> syn::Result<Duration> {
    let text = lit.value();
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!(
                "`{}` = \"{text}\" is not a duration ({e}): write e.g. \"30s\", \"500ms\" or \
                 \"1m30s\"",
                spec.name
            ),
        )
    })?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`{}` = \"{text}\": lock durations are whole milliseconds",
                spec.name
            ),
        ));
    }
    Ok(d)
}

fn millis(lit: &LitStr, d: Duration) -> syn::Result<u64> {
    let ms = d.as_millis();
    if ms > MAX_MILLIS {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "\"{}\" is longer than a year: too long for a lock",
                lit.value()
            ),
        ));
    }
    Ok(ms as u64)
}

fn on_lost(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<OnLostArg> {
    const POLICIES: [(&str, OnLostArg); 2] = [
        ("cancel", OnLostArg::Cancel),
        ("continue", OnLostArg::Continue),
    ];
    let lit = string_value(spec, input)?;
    let text = lit.value();
    if let Some((_, policy)) = POLICIES.iter().find(|(name, _)| *name == text) {
        return Ok(*policy);
    }
    let hint = closest(&text, POLICIES.iter().map(|(name, _)| *name))
        .map(|n| format!("did you mean \"{n}\"? "))
        .unwrap_or_default();
    Err(syn::Error::new(
        lit.span(),
        format!(
            "unknown `on_lost` policy \"{text}\": {hint}expected {}",
            spec.example
        ),
    ))
}

fn string_value(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<LitStr> {
    let wrong = |span| {
        syn::Error::new(
            span,
            format!("`{}` takes a string literal: {}", spec.name, spec.example),
        )
    };
    match input.parse::<Lit>() {
        Ok(Lit::Str(s)) => Ok(s),
        Ok(other) => Err(wrong(other.span())),
        Err(e) => Err(wrong(e.span())),
    }
}

fn bool_value(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<bool> {
    let wrong = |span| {
        syn::Error::new(
            span,
            format!(
                "`{}` takes a bool, not a string: {}",
                spec.name, spec.example
            ),
        )
    };
    match input.parse::<Lit>() {
        Ok(Lit::Bool(b)) => Ok(b.value),
        Ok(other) => Err(wrong(other.span())),
        Err(e) => Err(wrong(e.span())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(tokens: proc_macro2::TokenStream) -> String {
        match syn::parse2::<Args>(tokens) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_argument_parses() {
        let args: Args = syn::parse_quote!(
            key = "k",
            ttl = "1m30s",
            wait = "forever",
            max_hold = "10m",
            locker = l,
            watchdog = false,
            on_lost = "continue",
            crate = ::lockrt
        );
        let o = args.options;
        assert!(matches!(o.ttl, Some(DurationArg::Millis(90_000))));
        assert!(matches!(o.wait, Some(WaitArg::Forever)));
        assert!(matches!(o.max_hold, Some(DurationArg::Millis(600_000))));
        assert_eq!(o.watchdog, Some(false));
        assert!(matches!(o.on_lost, Some(OnLostArg::Continue)));
        assert!(o.locker.is_some() && o.krate.is_some());
    }

    #[test]
    fn durations_may_be_expressions() {
        let args: Args = syn::parse_quote!(key = "k", ttl = TTL, wait = cfg.wait(), max_hold = M);
        let o = args.options;
        assert!(matches!(o.ttl, Some(DurationArg::Expr(_))));
        assert!(matches!(o.wait, Some(WaitArg::For(DurationArg::Expr(_)))));
        assert!(matches!(o.max_hold, Some(DurationArg::Expr(_))));
        let args: Args = syn::parse_quote!(key = "k", wait = "0s");
        assert!(matches!(
            args.options.wait,
            Some(WaitArg::For(DurationArg::Millis(0)))
        ));
    }

    #[test]
    fn mistakes_say_what_to_write() {
        assert!(error(quote::quote!(key = "k", max_hold = "0s")).contains("greater than zero"));
        assert!(error(quote::quote!(key = "k", ttl = 30)).contains("ttl = \"30s\""));
        assert!(error(quote::quote!(key = "k", max_hld = "1s")).contains("`max_hold`?"));
        assert!(error(quote::quote!(key = "k", on_lost = "contine")).contains("\"continue\"?"));
        assert!(error(quote::quote!(key = "k", wait)).contains("wait = \"forever\""));
        assert!(error(quote::quote!(ttl = "1s")).contains("missing `key`"));
    }
}

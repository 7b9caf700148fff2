//! Parsing the attribute's arguments. Every value is checked here (the value parsers are in
//! `value`), so a mistake is reported on the token that holds it and the expansion only sees
//! valid input.
//!
//! [`ARGS`] is the one list of arguments: the parser looks names up in it, and the "did you
//! mean" suggestions and the examples in error messages come from it.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitStr, Path, Token};

use crate::value::{self, bool_value, closest, nonzero_duration, string_value};

/// One argument: its name, how its value is written, and how it is parsed into [`Found`].
pub(crate) struct ArgSpec {
    pub(crate) name: &'static str,
    /// What to write, shown when the value is missing or has the wrong form.
    pub(crate) example: &'static str,
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
            found.options.ttl = Some(value::ttl(spec, input)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "wait",
        example: "wait = \"5s\", wait = \"forever\", or a `Duration` expression such as \
                  wait = WAIT",
        parse: |spec, input, found| {
            found.options.wait = Some(value::wait(spec, input)?);
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
            let policies = [
                ("cancel", OnLostArg::Cancel),
                ("continue", OnLostArg::Continue),
            ];
            found.options.on_lost =
                Some(value::choice(spec, input, "`on_lost` policy", &policies)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "mode",
        example: "mode = \"read\" (shared with other readers) or mode = \"write\" (exclusive, \
                  the default)",
        parse: |spec, input, found| {
            let modes = [("read", KindArg::Read), ("write", KindArg::Write)];
            found.options.kind = Some(value::choice(spec, input, "`mode`", &modes)?);
            Ok(())
        },
    },
    ArgSpec {
        name: "permits",
        example: "permits = 3 (a semaphore: at most 3 holders at once)",
        parse: |spec, input, found| {
            found.options.kind = Some(KindArg::Permits(value::permits(spec, input)?));
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
    pub(crate) kind: Option<KindArg>,
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

/// `mode = "..."` or `permits = N`: which `LockOptions` kind method to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KindArg {
    Read,
    Write,
    Permits(u32),
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
            check_given(spec, &name, &seen)?;
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

/// Pairs of arguments that can't be given together, and why: refused here, on the token, rather
/// than left to the builder (where the last kind method called would silently win) or to the
/// first call.
const CONFLICTS: &[(&str, &str, &str)] = &[
    ("mode", "permits", "a semaphore has no read/write mode"),
    ("keys", "mode", "multi-key locks are exclusive"),
    ("keys", "permits", "multi-key locks are exclusive"),
];

/// Refuses `spec` (written as `name`) when it was given already, or conflicts with an argument
/// given before it: the error is on the second one, as rustc reports a duplicate definition.
fn check_given(spec: &ArgSpec, name: &Ident, seen: &[&str]) -> syn::Result<()> {
    let this = spec.name;
    if seen.contains(&this) {
        return Err(syn::Error::new(
            name.span(),
            format!("duplicate argument `{this}`: give each argument once"),
        ));
    }
    for &(a, b, why) in CONFLICTS {
        let other = if this == a { b } else { a };
        if (this != a && this != b) || !seen.contains(&other) {
            continue;
        }
        let fix = if a == "keys" {
            format!(
                "`{b}` takes a single key: key = \"stock:{{id}}\", {}",
                example(b)
            )
        } else {
            format!("write either {}, or {}", example(a), example(b))
        };
        return Err(syn::Error::new(
            name.span(),
            format!("`{this}` can't be combined with `{other}`: {why}; {fix}"),
        ));
    }
    Ok(())
}

/// The example of the argument called `name`.
fn example(name: &str) -> &'static str {
    ARGS.iter()
        .find(|spec| spec.name == name)
        .map_or("", |spec| spec.example)
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

    #[test]
    fn lock_kinds_parse() {
        let kind = |tokens| syn::parse2::<Args>(tokens).unwrap().options.kind;
        assert_eq!(kind(quote::quote!(key = "k")), None);
        assert_eq!(
            kind(quote::quote!(key = "k", mode = "read")),
            Some(KindArg::Read)
        );
        assert_eq!(
            kind(quote::quote!(mode = "write", key = "k")),
            Some(KindArg::Write)
        );
        assert_eq!(
            kind(quote::quote!(key = "k", permits = 3)),
            Some(KindArg::Permits(3))
        );
        assert_eq!(
            kind(quote::quote!(key = "k", permits = 4294967295u32)),
            Some(KindArg::Permits(u32::MAX))
        );
    }

    #[test]
    fn lock_kind_mistakes_say_what_to_write() {
        let both = error(quote::quote!(key = "k", mode = "read", permits = 2));
        assert!(
            both.starts_with("`permits` can't be combined with `mode`"),
            "{both}"
        );
        let both = error(quote::quote!(key = "k", permits = 2, mode = "read"));
        assert!(
            both.starts_with("`mode` can't be combined with `permits`"),
            "{both}"
        );
        assert!(both.contains("no read/write mode"), "{both}");
        let keys = error(quote::quote!(keys = ["a", "b"], mode = "read"));
        assert!(keys.contains("multi-key locks are exclusive"), "{keys}");
        let keys = error(quote::quote!(permits = 2, keys = ["a", "b"]));
        assert!(
            keys.starts_with("`keys` can't be combined with `permits`"),
            "{keys}"
        );
        let mode = error(quote::quote!(key = "k", mode = "upgradable"));
        assert!(
            mode.starts_with("unknown `mode` \"upgradable\": expected"),
            "{mode}"
        );
        assert!(
            mode.contains("\"read\"") && mode.contains("\"write\""),
            "{mode}"
        );
        assert!(error(quote::quote!(key = "k", mode = "raed")).contains("\"read\"? "));
        assert!(error(quote::quote!(key = "k", mode = read)).contains("string literal"));
        for zero in [quote::quote!(permits = 0), quote::quote!(permits = -2)] {
            let e = error(quote::quote!(key = "k", #zero));
            assert!(e.contains("needs at least 1 permit"), "{e}");
        }
        let big = error(quote::quote!(key = "k", permits = 4294967296));
        assert!(big.contains("too large"), "{big}");
        for wrong in [
            quote::quote!(permits = "3"),
            quote::quote!(permits = 3.0),
            quote::quote!(permits = N),
        ] {
            let e = error(quote::quote!(key = "k", #wrong));
            assert!(e.contains("takes an integer literal"), "{e}");
        }
        assert!(error(quote::quote!(key = "k", permits = 3u8)).contains("`u8` suffix"));
    }
}

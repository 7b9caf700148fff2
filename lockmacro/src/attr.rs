//! Parsing the attribute's arguments. Every value is checked here, so a mistake is reported on
//! the literal that holds it and the expansion only sees valid input.

use std::time::Duration;

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, Lit, LitBool, LitStr, Path, Token};

/// The runtime clamps shorter leases up to this; refusing them here avoids a silent surprise.
const MIN_TTL: Duration = Duration::from_millis(30);

const NAMES: &[&str] = &[
    "key", "ttl", "wait", "locker", "watchdog", "on_lost", "crate",
];

/// The attribute's arguments, validated.
pub(crate) struct Args {
    pub(crate) key: LitStr,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) wait: Option<WaitArg>,
    pub(crate) locker: Option<Expr>,
    pub(crate) watchdog: bool,
    pub(crate) on_lost_continue: bool,
    pub(crate) krate: Option<Path>,
}

/// `wait = "..."`.
#[derive(Clone, Copy)]
pub(crate) enum WaitArg {
    Millis(u64),
    Forever,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut key = None;
        let mut ttl_ms = None;
        let mut wait = None;
        let mut locker = None;
        let mut watchdog = None;
        let mut on_lost = None;
        let mut krate = None;
        let mut seen: Vec<String> = Vec::new();

        while !input.is_empty() {
            let name = input.call(Ident::parse_any)?;
            let text = name.to_string();
            if !NAMES.contains(&text.as_str()) {
                return Err(unknown_argument(&name));
            }
            if seen.contains(&text) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("duplicate argument `{text}`: give each argument once"),
                ));
            }
            seen.push(text.clone());
            if !input.peek(Token![=]) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("`{text}` needs a value: {}", example(&text)),
                ));
            }
            input.parse::<Token![=]>()?;
            match text.as_str() {
                "key" => {
                    let lit = string_value(input, &text)?;
                    if lit.value().is_empty() {
                        return Err(syn::Error::new(
                            lit.span(),
                            "empty key template: name what the lock protects, e.g. \
                             key = \"stock:{id}\"",
                        ));
                    }
                    key = Some(lit);
                }
                "ttl" => {
                    let lit = string_value(input, &text)?;
                    let d = duration(&lit, "ttl")?;
                    if d < MIN_TTL {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "`ttl` must be at least 30ms (got {}): a lease that short \
                                 expires before it can be renewed",
                                lit.value()
                            ),
                        ));
                    }
                    ttl_ms = Some(millis(&lit, d)?);
                }
                "wait" => {
                    let lit = string_value(input, &text)?;
                    wait = Some(if lit.value().trim() == "forever" {
                        WaitArg::Forever
                    } else {
                        WaitArg::Millis(millis(&lit, duration_allow_zero(&lit, "wait")?)?)
                    });
                }
                "locker" => locker = Some(input.parse::<Expr>()?),
                "watchdog" => watchdog = Some(bool_value(input)?),
                "on_lost" => {
                    let lit = string_value(input, &text)?;
                    on_lost = Some(match lit.value().as_str() {
                        "cancel" => false,
                        "continue" => true,
                        other => {
                            return Err(syn::Error::new(
                                lit.span(),
                                format!(
                                    "unknown `on_lost` policy \"{other}\": expected \"cancel\" \
                                     (drop the body and return `Lost`) or \"continue\" (log and \
                                     let the body finish)"
                                ),
                            ));
                        }
                    });
                }
                "crate" => krate = Some(input.call(Path::parse_mod_style)?),
                _ => unreachable!("checked against NAMES above"),
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }

        let Some(key) = key else {
            return Err(syn::Error::new(
                Span::call_site(),
                "missing `key`: say what the lock protects, e.g. \
                 #[distributed_lock(key = \"stock:{id}\")]",
            ));
        };
        Ok(Args {
            key,
            ttl_ms,
            wait,
            locker,
            watchdog: watchdog.unwrap_or(true),
            on_lost_continue: on_lost.unwrap_or(false),
            krate,
        })
    }
}

fn unknown_argument(name: &Ident) -> syn::Error {
    let text = name.unraw().to_string();
    let closest = NAMES
        .iter()
        .map(|n| (strsim::levenshtein(n, &text), *n))
        .min()
        .filter(|(d, _)| *d <= 2)
        .map(|(_, n)| format!("; did you mean `{n}`?"))
        .unwrap_or_default();
    syn::Error::new(
        name.span(),
        format!(
            "unknown argument `{text}`: expected key, ttl, wait, locker, watchdog, on_lost or \
             crate{closest}"
        ),
    )
}

fn example(name: &str) -> &'static str {
    match name {
        "key" => "key = \"stock:{id}\"",
        "ttl" => "ttl = \"30s\"",
        "wait" => "wait = \"5s\" or wait = \"forever\"",
        "locker" => "locker = self.locker",
        "watchdog" => "watchdog = true or watchdog = false",
        "on_lost" => "on_lost = \"cancel\" or on_lost = \"continue\"",
        _ => "crate = ::lockrt",
    }
}

fn string_value(input: ParseStream<'_>, name: &str) -> syn::Result<LitStr> {
    match input.parse::<Lit>() {
        Ok(Lit::Str(s)) => Ok(s),
        Ok(other) => Err(syn::Error::new(
            other.span(),
            format!("`{name}` takes a string literal: {}", example(name)),
        )),
        Err(e) => Err(syn::Error::new(
            e.span(),
            format!("`{name}` takes a string literal: {}", example(name)),
        )),
    }
}

fn bool_value(input: ParseStream<'_>) -> syn::Result<bool> {
    match input.parse::<Lit>() {
        Ok(Lit::Bool(LitBool { value, .. })) => Ok(value),
        Ok(other) => Err(syn::Error::new(
            other.span(),
            "`watchdog` takes `true` or `false` (a bool, not a string)",
        )),
        Err(e) => Err(syn::Error::new(
            e.span(),
            "`watchdog` takes `true` or `false` (a bool, not a string)",
        )),
    }
}

fn duration_allow_zero(lit: &LitStr, name: &str) -> syn::Result<Duration> {
    let text = lit.value();
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        syn::Error::new(
            lit.span(),
            format!(
                "`{name}` = \"{text}\" is not a duration ({e}): write e.g. \"30s\", \"500ms\" or \
                 \"1m30s\""
            ),
        )
    })?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{name}` = \"{text}\": lock durations are whole milliseconds"),
        ));
    }
    Ok(d)
}

fn duration(lit: &LitStr, name: &str) -> syn::Result<Duration> {
    let d = duration_allow_zero(lit, name)?;
    if d.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{name}` must be greater than zero: write e.g. \"30s\""),
        ));
    }
    Ok(d)
}

fn millis(lit: &LitStr, d: Duration) -> syn::Result<u64> {
    // Redis keeps expiries in signed 64-bit milliseconds; a year is already absurd for a lock.
    const MAX: u128 = 366 * 24 * 3600 * 1000;
    let ms = d.as_millis();
    if ms > MAX {
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

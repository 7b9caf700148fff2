//! Parsing and checking one argument's value: durations, strings, bools, a choice among named
//! values, a permit count. Apart from `attr`'s argument list so that file stays readable; every
//! error names the argument and shows its example (`ArgSpec::example`), on the value's token.

use std::time::Duration;

use syn::parse::ParseStream;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, LitStr};

use crate::attr::{ArgSpec, DurationArg, WaitArg};

/// The runtime clamps shorter leases up to this; refusing them here avoids a silent surprise.
const MIN_TTL: Duration = Duration::from_millis(30);

/// Redis keeps expiries in signed 64-bit milliseconds; a year is already absurd for a lock.
const MAX_MILLIS: u128 = 366 * 24 * 3600 * 1000;

/// The candidate at most two edits away from `text`, if any.
pub(crate) fn closest<'a>(
    text: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|c| (strsim::levenshtein(c, text), c))
        .min()
        .filter(|(d, _)| *d <= 2)
        .map(|(_, c)| c)
}

pub(crate) fn ttl(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<DurationArg> {
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

pub(crate) fn wait(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<WaitArg> {
    if input.peek(LitStr) && input.fork().parse::<LitStr>()?.value().trim() == "forever" {
        input.parse::<LitStr>()?;
        return Ok(WaitArg::Forever);
    }
    // Zero is meaningful here: one attempt, no waiting.
    duration_arg(spec, input, |_, d| Ok(d)).map(WaitArg::For)
}

pub(crate) fn nonzero_duration(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<DurationArg> {
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

/// A string literal naming one of `choices`. An unknown name is an error on the literal that
/// suggests the nearest valid one and shows the example; `what` says what the name is of
/// ("`on_lost` policy").
pub(crate) fn choice<T: Copy>(
    spec: &ArgSpec,
    input: ParseStream<'_>,
    what: &str,
    choices: &[(&str, T)],
) -> syn::Result<T> {
    let lit = string_value(spec, input)?;
    let text = lit.value();
    if let Some((_, value)) = choices.iter().find(|(name, _)| *name == text) {
        return Ok(*value);
    }
    let hint = closest(&text, choices.iter().map(|(name, _)| *name))
        .map(|n| format!("did you mean \"{n}\"? "))
        .unwrap_or_default();
    Err(syn::Error::new(
        lit.span(),
        format!("unknown {what} \"{text}\": {hint}expected {}", spec.example),
    ))
}

/// `permits = N`: a `u32` literal (what `LockOptions::permits` takes), at least 1: a
/// semaphore of no permits could never be taken, so it is refused here rather than at the
/// first acquisition.
pub(crate) fn permits(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<u32> {
    let wrong = |span| {
        syn::Error::new(
            span,
            format!("`{}` takes an integer literal: {}", spec.name, spec.example),
        )
    };
    let lit = match input.parse::<Lit>() {
        Ok(Lit::Int(lit)) => lit,
        Ok(other) => return Err(wrong(other.span())),
        Err(e) => return Err(wrong(e.span())),
    };
    let error = |message: String| Err(syn::Error::new(lit.span(), message));
    if !matches!(lit.suffix(), "" | "u32") {
        return error(format!(
            "`{}` is a u32: drop the `{}` suffix, e.g. {}",
            spec.name,
            lit.suffix(),
            spec.example
        ));
    }
    let digits = lit.base10_digits();
    match lit.base10_parse::<u32>() {
        Ok(0) => error(format!(
            "`{} = 0`: a semaphore needs at least 1 permit, e.g. {}",
            spec.name, spec.example
        )),
        Ok(n) => Ok(n),
        Err(_) if digits.starts_with('-') => error(format!(
            "`{} = {digits}`: a semaphore needs at least 1 permit, e.g. {}",
            spec.name, spec.example
        )),
        Err(_) => error(format!(
            "`{} = {digits}` is too large: a permit count is a u32, at most {}",
            spec.name,
            u32::MAX
        )),
    }
}

pub(crate) fn string_value(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<LitStr> {
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

pub(crate) fn bool_value(spec: &ArgSpec, input: ParseStream<'_>) -> syn::Result<bool> {
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

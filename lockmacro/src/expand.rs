//! Turning a checked `async fn` into its locked form.
//!
//! ```text
//! #[distributed_lock(key = "stock:{id}", ttl = "30s")]
//! async fn deduct(id: u64) -> Result<u32, AppError> { BODY }
//! ```
//! becomes
//! ```text
//! async fn deduct(id: u64) -> Result<u32, AppError> {
//!     let __lockrt_locker = ::lockrt::__private::default_locker();
//!     let __lockrt_key = ::std::format!("stock:{}", &id);
//!     ::lockrt::__private::run(
//!         __lockrt_locker, __lockrt_key,
//!         ::lockrt::__private::options(Some(30000), None, false, true, false),
//!         async move { BODY },
//!     ).await
//! }
//! ```
//! The locker and key are evaluated before the body takes the parameters by move, so they may
//! borrow them (`self.locker`, `order.id`). `return` and `?` in `BODY` leave the async block, whose
//! value `run` hands back unchanged once the lock is released.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Signature};

use crate::attr::{Args, WaitArg};
use crate::template::{self, Part};

/// The locked fn, or the error to report next to the untouched original.
pub(crate) fn expand(args: Args, func: &ItemFn) -> syn::Result<TokenStream> {
    check_shape(&func.sig)?;
    let krate = match &args.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::lockrt),
    };
    let key = key_expr(&args.key, &func.sig)?;

    let locker = match &args.locker {
        Some(expr) => {
            // Spanned on the user's expression so a wrong type is reported there.
            quote_spanned! {expr.span()=>
                ::core::result::Result::Ok(#krate::__private::locker_of(&(#expr)))
            }
        }
        None => quote!(#krate::__private::default_locker()),
    };
    let some_ms = |ms: Option<u64>| match ms {
        Some(ms) => quote!(::core::option::Option::Some(#ms)),
        None => quote!(::core::option::Option::None),
    };
    let ttl = some_ms(args.ttl_ms);
    let (wait, forever) = match args.wait {
        Some(WaitArg::Millis(ms)) => (some_ms(Some(ms)), false),
        Some(WaitArg::Forever) => (some_ms(None), true),
        None => (some_ms(None), false),
    };
    let watchdog = args.watchdog;
    let on_lost_continue = args.on_lost_continue;

    // The `run` call carries the return type's span: a type that can't carry a lock failure is
    // reported on the `-> Type` the user wrote.
    let ret_span = match &func.sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => func.sig.ident.span(),
    };

    let block = &func.block;
    let run = quote_spanned! {ret_span=>
        #krate::__private::run(__lockrt_locker, __lockrt_key, __lockrt_options, __lockrt_body)
            .await
    };

    let ItemFn {
        attrs,
        vis,
        sig,
        block: _,
    } = func;
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            let __lockrt_locker: ::core::result::Result<
                #krate::__private::Locker,
                #krate::__private::LockError,
            > = #locker;
            let __lockrt_key: ::std::string::String = #key;
            let __lockrt_options = #krate::__private::options(
                #ttl, #wait, #forever, #watchdog, #on_lost_continue,
            );
            let __lockrt_body = async move #block;
            #run
        }
    })
}

fn check_shape(sig: &Signature) -> syn::Result<()> {
    if sig.asyncness.is_some() {
        return Ok(());
    }
    let ret = sig.output.to_token_stream().to_string();
    if ret.contains("'async_trait") || (ret.contains("Pin") && ret.contains("Future")) {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "#[distributed_lock] can't wrap an `#[async_trait]` method (it sees the boxed \
             future async_trait made): use a native `async fn` in the trait (Rust 1.75+), or call \
             `locker.run(key, opts, async { ... })` inside the method",
        ));
    }
    Err(syn::Error::new(
        sig.fn_token.span,
        "#[distributed_lock] works on `async fn` only: the lock is held across the body's \
         `.await`s; make this fn `async`, or use `Locker::acquire` in sync code",
    ))
}

/// `format!` over the template, with each placeholder borrowed from the fn's bindings.
fn key_expr(lit: &LitStr, sig: &Signature) -> syn::Result<TokenStream> {
    let value = lit.value();
    let parts =
        template::parse(&value).map_err(|e| syn::Error::new(span_in(lit, &e.range), e.message))?;
    let bindings = bindings(sig);
    let mut fmt = String::new();
    let mut values = Vec::new();
    for part in parts {
        match part {
            Part::Text(text) => fmt.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Part::Hole(hole) => {
                let span = span_in(lit, &hole.range);
                let root = &hole.path[0];
                if !bindings.iter().any(|b| b == root) {
                    return Err(syn::Error::new(span, unknown_name(root, &bindings, sig)));
                }
                let root = if root == "self" {
                    quote_spanned!(span=> self)
                } else {
                    Ident::new(root, span).into_token_stream()
                };
                let fields = hole.path[1..].iter().map(|f| match f.parse::<u32>() {
                    Ok(index) => syn::Index { index, span }.into_token_stream(),
                    Err(_) => Ident::new(f, span).into_token_stream(),
                });
                values.push(quote_spanned!(span=> &(#root #(.#fields)*)));
                fmt.push_str("{}");
            }
        }
    }
    let fmt = LitStr::new(&fmt, lit.span());
    Ok(quote!(::std::format!(#fmt #(, #values)*)))
}

fn unknown_name(name: &str, bindings: &[String], sig: &Signature) -> String {
    let fn_name = &sig.ident;
    if bindings.is_empty() {
        return format!(
            "key template names `{name}`, but `{fn_name}` has no parameters: use a fixed key or \
             add the parameter"
        );
    }
    let available = bindings
        .iter()
        .map(|b| format!("`{b}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let closest = bindings
        .iter()
        .map(|b| (strsim::levenshtein(b, name), b))
        .min()
        .filter(|(d, b)| *d <= (b.len().max(name.len()) / 2).max(1))
        .map(|(_, b)| format!("; did you mean `{b}`?"))
        .unwrap_or_default();
    format!(
        "key template names `{name}`, which is not a parameter of `{fn_name}`; available: \
         {available}{closest}"
    )
}

/// Names a template may use: `self` and every binding in the parameters' patterns.
fn bindings(sig: &Signature) -> Vec<String> {
    let mut out = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(_) => out.push("self".to_owned()),
            FnArg::Typed(pt) => collect(&pt.pat, &mut out),
        }
    }
    out
}

fn collect(pat: &Pat, out: &mut Vec<String>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.to_string());
            if let Some((_, sub)) = &p.subpat {
                collect(sub, out);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| collect(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| collect(e, out)),
        Pat::Reference(p) => collect(&p.pat, out),
        Pat::Paren(p) => collect(&p.pat, out),
        Pat::Type(p) => collect(&p.pat, out),
        Pat::Or(p) => {
            if let Some(first) = p.cases.first() {
                collect(first, out);
            }
        }
        _ => {}
    }
}

/// The part of the string literal at `range`, where the compiler can point into literals
/// (nightly); the whole literal otherwise.
fn span_in(lit: &LitStr, range: &std::ops::Range<usize>) -> Span {
    let token = lit.token();
    // Offsets only line up when the source is the plain `"..."` form of the value.
    if token.to_string() == format!("\"{}\"", lit.value())
        && let Some(span) = token.subspan(range.start + 1..range.end + 1)
    {
        return span;
    }
    lit.span()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expansion shown in `lockrt::distributed_lock`'s docs; printed with `--nocapture`.
    #[test]
    fn expansion_of_the_documented_example() {
        let args: Args = syn::parse_quote!(key = "stock:{id}", ttl = "30s");
        let func: ItemFn = syn::parse_quote! {
            /// Docs stay.
            pub async fn deduct(id: u64) -> Result<u32, AppError> { BODY }
        };
        let out = expand(args, &func).unwrap();
        let pretty = prettyplease::unparse(&syn::parse2(out).unwrap());
        println!("{pretty}");
        for needle in [
            "/// Docs stay.",
            "pub async fn deduct(id: u64) -> Result<u32, AppError> {",
            "::lockrt::__private::default_locker()",
            "::std::format!(\"stock:{}\", & (id))",
            "::core::option::Option::Some(30000u64)",
            "let __lockrt_body = async move { BODY };",
            "::lockrt::__private::run(",
        ] {
            assert!(pretty.contains(needle), "missing {needle:?} in\n{pretty}");
        }
    }
}

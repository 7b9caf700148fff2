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
//!     let __lockrt_key = ::std::format!("stock:{}", ::lockrt::__private::KeyPart(&id, '%'));
//!     let __lockrt_options = ::lockrt::__private::LockOptions::new()
//!         .site(::core::concat!(::core::module_path!(), "::", "deduct"))
//!         .ttl(::core::time::Duration::from_millis(30000u64));
//!     let __lockrt_body = async move { /* fake return */ BODY };
//!     ::lockrt::__private::run(
//!         __lockrt_locker, __lockrt_key, __lockrt_options, { __lockrt_body },
//!         ::lockrt::__private::FromLockError::from_lock_error,
//!     )
//!     .await
//! }
//! ```
//! (`-> impl IntoResponse`: the body is `respond(__lockrt_body)`, an axum `Response`, and the
//! conversion `from_lock_error_response`.)
//! The locker, key and options are evaluated before the body takes the parameters by move, so
//! they may borrow them (`self.locker`, `order.id`, `cfg.ttl()`). `return` and `?` in `BODY`
//! leave the async block, whose value `run` hands back unchanged once the lock is released.
//! Every local is `Span::mixed_site()`: the body can't see them, and a parameter may share
//! their names.

use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, LitStr, Pat, ReturnType, Signature, Type};

use crate::attr::{Args, DurationArg, Keys, KindArg, OnLostArg, Options, WaitArg};
use crate::item::MaybeItemFn;
use crate::template::{self, Hole, Part};

/// The locked fn, or the error to report next to the untouched original.
pub(crate) fn expand(args: Args, func: &MaybeItemFn) -> syn::Result<TokenStream> {
    check_shape(&func.sig)?;
    let krate = match &args.options.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::lockrt),
    };
    // The `run` call carries the return type's span: a type that can't carry a lock failure is
    // reported on the `-> Type` the user wrote. The body future is passed in braces of that
    // span too: as a bare `mixed_site` ident it would make rustc repeat the error once more.
    let ret_span = return_span(&func.sig);
    let local = |name: &str| Ident::new(name, Span::mixed_site().located_at(ret_span));
    let (locker, key, options, body) = (
        local("__lockrt_locker"),
        local("__lockrt_key"),
        local("__lockrt_options"),
        local("__lockrt_body"),
    );
    let locker_expr = locker_expr(&args.options, &krate);
    let (key_type, key_expr, run_fn) = match &args.key {
        Keys::One(lit) => (
            quote!(::std::string::String),
            key_expr(lit, &func.sig, &krate)?,
            quote!(run),
        ),
        Keys::All(lits) => {
            let exprs = lits
                .iter()
                .map(|lit| key_expr(lit, &func.sig, &krate))
                .collect::<syn::Result<Vec<_>>>()?;
            (
                quote!(::std::vec::Vec<::std::string::String>),
                quote!(::std::vec![#(#exprs),*]),
                quote!(run_all),
            )
        }
    };
    let options_expr = options_expr(&args.options, &krate, &func.sig.ident);
    let fake_return = fake_return(&func.sig);
    // A body behind `impl IntoResponse` has a type no lock failure can become: it is turned
    // into an axum `Response` first (feature `axum`; without it the conversion names the fix).
    // The conversion is where a return type that can't carry a lock failure is reported:
    // every token of it on the `-> Type`, so that is what the error points at.
    let (body_expr, convert) = if returns_into_response(&func.sig) {
        (
            quote_spanned!(ret_span=> #krate::__private::respond(#body)),
            quote!(#krate::__private::from_lock_error_response),
        )
    } else {
        (
            quote_spanned!(ret_span=> { #body }),
            quote!(#krate::__private::FromLockError::from_lock_error),
        )
    };
    let convert = respan(convert, ret_span);
    let run = quote_spanned! {ret_span=>
        #krate::__private::#run_fn(#locker, #key, #options, #body_expr, #convert).await
    };
    let MaybeItemFn {
        outer_attrs,
        vis,
        sig,
        inner_attrs,
        brace,
        body: stmts,
    } = func;
    let mut block = TokenStream::new();
    brace.surround(&mut block, |block| {
        fake_return.to_tokens(block);
        stmts.to_tokens(block);
    });
    Ok(quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            let #locker: ::core::result::Result<
                #krate::__private::Locker,
                #krate::__private::LockError,
            > = #locker_expr;
            let #key: #key_type = #key_expr;
            let #options: #krate::__private::LockOptions = #options_expr;
            let #body = async move #block;
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

fn return_span(sig: &Signature) -> Span {
    match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => sig.ident.span(),
    }
}

/// `tokens` with every span set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut inner = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                inner.set_span(span);
                tt = inner.into();
            }
            tt.set_span(span);
            tt
        })
        .collect()
}

/// `-> impl IntoResponse` (axum's trait, by its name: a macro sees no types), with any other
/// bounds.
fn returns_into_response(sig: &Signature) -> bool {
    let ReturnType::Type(_, ty) = &sig.output else {
        return false;
    };
    let Type::ImplTrait(it) = &**ty else {
        return false;
    };
    it.bounds.iter().any(|b| {
        matches!(b, syn::TypeParamBound::Trait(t)
            if t.path.segments.last().is_some_and(|s| s.ident == "IntoResponse"))
    })
}

/// A never-taken `return` of the declared type, first in the async block, so the block is
/// type-checked against the fn's return type (as the fn body would be) rather than inferred
/// from its tail: `Ok(Box::new(id))` then coerces to `Box<dyn Display>`. `impl Trait` can't be
/// named in a `let`, so it becomes `_` (tracing-attributes does the same).
fn fake_return(sig: &Signature) -> TokenStream {
    let ty = match &sig.output {
        ReturnType::Type(_, ty) => {
            let mut ty = (**ty).clone();
            erase_impl_trait(&mut ty);
            ty.into_token_stream()
        }
        ReturnType::Default => quote!(()),
    };
    let ret = Ident::new(
        "__lockrt_return",
        Span::mixed_site().located_at(return_span(sig)),
    );
    quote_spanned! {return_span(sig)=>
        #[allow(
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::needless_return
        )]
        if false {
            let #ret: #ty = loop {};
            return #ret;
        }
    }
}

/// Replaces every `impl Trait` in `ty` with `_`.
fn erase_impl_trait(ty: &mut Type) {
    match ty {
        Type::ImplTrait(it) => {
            *ty = Type::Infer(syn::TypeInfer {
                underscore_token: syn::Token![_](it.span()),
            });
        }
        Type::Array(t) => erase_impl_trait(&mut t.elem),
        Type::Group(t) => erase_impl_trait(&mut t.elem),
        Type::Paren(t) => erase_impl_trait(&mut t.elem),
        Type::Ptr(t) => erase_impl_trait(&mut t.elem),
        Type::Reference(t) => erase_impl_trait(&mut t.elem),
        Type::Slice(t) => erase_impl_trait(&mut t.elem),
        Type::Tuple(t) => t.elems.iter_mut().for_each(erase_impl_trait),
        Type::Path(t) => {
            for segment in &mut t.path.segments {
                if let syn::PathArguments::AngleBracketed(args) = &mut segment.arguments {
                    for arg in &mut args.args {
                        if let syn::GenericArgument::Type(t) = arg {
                            erase_impl_trait(t);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

fn locker_expr(options: &Options, krate: &TokenStream) -> TokenStream {
    match &options.locker {
        // Spanned on the user's expression so a wrong type is reported there.
        Some(expr) => quote_spanned! {expr.span()=>
            ::core::result::Result::Ok(#krate::__private::locker_of(&(#expr)))
        },
        None => quote!(#krate::__private::default_locker()),
    }
}

/// The public `LockOptions` builder with one call per argument given; the rest stays at the
/// locker's defaults.
fn options_expr(options: &Options, krate: &TokenStream, name: &Ident) -> TokenStream {
    // The metrics label of this lock site: the fn's path, a fixed set of names.
    let name = name.to_string();
    let name = name.trim_start_matches("r#");
    let mut chain = quote!(#krate::__private::LockOptions::new().site(::core::concat!(
        ::core::module_path!(),
        "::",
        #name
    )));
    if let Some(ttl) = &options.ttl {
        let ttl = duration(ttl);
        chain.extend(quote!(.ttl(#ttl)));
    }
    match &options.wait {
        Some(WaitArg::For(wait)) => {
            let wait = duration(wait);
            chain.extend(quote!(.wait(#wait)));
        }
        Some(WaitArg::Forever) => chain.extend(quote!(.wait_forever())),
        None => {}
    }
    if let Some(max_hold) = &options.max_hold {
        let max_hold = duration(max_hold);
        chain.extend(quote!(.max_hold(#max_hold)));
    }
    if let Some(min_hold) = &options.min_hold {
        let min_hold = duration(min_hold);
        chain.extend(quote!(.min_hold(#min_hold)));
    }
    if let Some(on) = options.watchdog {
        chain.extend(quote!(.watchdog(#on)));
    }
    if let Some(policy) = options.on_lost {
        let policy = match policy {
            OnLostArg::Cancel => quote!(Cancel),
            OnLostArg::Continue => quote!(Continue),
        };
        chain.extend(quote!(.on_lost(#krate::__private::OnLost::#policy)));
    }
    match options.kind {
        Some(KindArg::Read) => chain.extend(quote!(.read())),
        Some(KindArg::Write) => chain.extend(quote!(.write())),
        Some(KindArg::Permits(n)) => chain.extend(quote!(.permits(#n))),
        None => {}
    }
    chain
}

fn duration(d: &DurationArg) -> TokenStream {
    match d {
        DurationArg::Millis(ms) => quote!(::core::time::Duration::from_millis(#ms)),
        // The user's tokens, so a type mismatch is reported on them.
        DurationArg::Expr(expr) => expr.to_token_stream(),
    }
}

/// `format!` over the template, each placeholder's value borrowed from the fn's bindings and
/// wrapped in `KeyPart`, which escapes `%` and the character that follows the placeholder.
fn key_expr(lit: &LitStr, sig: &Signature, krate: &TokenStream) -> syn::Result<TokenStream> {
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
                values.push(placeholder_value(lit, &hole, &bindings, sig, krate)?);
                fmt.push_str("{}");
            }
        }
    }
    let fmt = LitStr::new(&fmt, lit.span());
    Ok(quote!(::std::format!(#fmt #(, #values)*)))
}

/// `KeyPart(&order.id, ':')`, spanned on the placeholder so a missing `Display` or an
/// unknown field is reported inside the key string.
fn placeholder_value(
    lit: &LitStr,
    hole: &Hole,
    bindings: &[String],
    sig: &Signature,
    krate: &TokenStream,
) -> syn::Result<TokenStream> {
    let span = span_in(lit, &hole.range);
    let root = &hole.path[0];
    if !bindings.iter().any(|b| b == root) {
        return Err(syn::Error::new(span, unknown_name(root, bindings, sig)));
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
    // At the end of the template only `%` needs escaping: nothing follows to be confused with.
    let mut escaped = Literal::character(hole.followed_by.unwrap_or('%'));
    escaped.set_span(span);
    Ok(quote_spanned!(span=> #krate::__private::KeyPart(&#root #(.#fields)*, #escaped)))
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

    fn pretty(args: Args, func: MaybeItemFn) -> String {
        let out = expand(args, &func).unwrap();
        prettyplease::unparse(&syn::parse2(out).unwrap())
    }

    /// `needle` occurs in `haystack`, whitespace aside (prettyplease decides the line breaks).
    fn contains(haystack: &str, needle: &str) -> bool {
        let squash = |s: &str| s.split_whitespace().collect::<String>();
        squash(haystack).contains(&squash(needle))
    }

    /// The "What it expands to" section of `lockrt::distributed_lock`'s docs is this test's
    /// output, verbatim: change one, and this fails until the other agrees.
    #[test]
    fn expansion_of_the_documented_example() {
        let pretty = pretty(
            syn::parse_quote!(key = "stock:{id}", ttl = "30s"),
            syn::parse_quote! {
                async fn deduct(id: u64) -> Result<u32, AppError> { BODY }
            },
        );
        println!("{pretty}");
        let docs = include_str!("../../lockrt/src/lib.rs");
        let section = &docs[docs
            .find("/// # What it expands to")
            .expect("the docs section")..];
        let documented: String = section
            .lines()
            .skip_while(|line| !line.starts_with("/// ```text"))
            .skip(1)
            .take_while(|line| !line.starts_with("/// ```"))
            .map(|line| format!("{}\n", line.strip_prefix("/// ").unwrap_or("")))
            .collect();
        assert_eq!(documented, pretty, "update the docs in lockrt/src/lib.rs");
    }

    #[test]
    fn signature_attributes_and_docs_stay() {
        let pretty = pretty(
            syn::parse_quote!(key = "k"),
            syn::parse_quote! {
                /// Docs stay.
                #[must_use]
                pub(crate) async fn f<T: Send>(t: T) -> Result<T, E> where T: Sync { Ok(t) }
            },
        );
        let head =
            "/// Docs stay.\n#[must_use]\npub(crate) async fn f<T: Send>(t: T) -> Result<T, E>\n";
        assert!(pretty.starts_with(head), "{pretty}");
    }

    #[test]
    fn every_option_becomes_a_builder_call() {
        let pretty = pretty(
            syn::parse_quote!(
                key = "k",
                ttl = TTL,
                wait = "forever",
                max_hold = "10m",
                watchdog = false,
                on_lost = "continue",
                crate = ::my::lockrt
            ),
            syn::parse_quote!(
                async fn f() {}
            ),
        );
        let chain = "::my::lockrt::__private::LockOptions::new()
            .site(::core::concat!(::core::module_path!(), \"::\", \"f\")).ttl(TTL).wait_forever()
            .max_hold(::core::time::Duration::from_millis(600000u64)).watchdog(false)
            .on_lost(::my::lockrt::__private::OnLost::Continue);";
        assert!(contains(&pretty, chain), "{pretty}");
        assert!(
            contains(&pretty, "let __lockrt_return: () = loop {};"),
            "{pretty}"
        );
    }

    #[test]
    fn mode_and_permits_become_kind_calls() {
        let f = || -> MaybeItemFn {
            syn::parse_quote!(
                async fn f() {}
            )
        };
        let read = pretty(syn::parse_quote!(key = "k", mode = "read"), f());
        let site = r#".site(::core::concat!(::core::module_path!(), "::", "f"))"#;
        let chain = format!("::lockrt::__private::LockOptions::new(){site}.read();");
        assert!(contains(&read, &chain), "{read}");
        let write = pretty(syn::parse_quote!(key = "k", mode = "write"), f());
        let chain = format!("LockOptions::new(){site}.write();");
        assert!(contains(&write, &chain), "{write}");
        let permits = pretty(syn::parse_quote!(key = "k", ttl = "1s", permits = 3), f());
        let chain = format!(
            "LockOptions::new(){site}.ttl(::core::time::Duration::from_millis(1000u64))
            .permits(3u32);"
        );
        assert!(contains(&permits, &chain), "{permits}");
    }

    #[test]
    fn inner_attributes_open_the_new_body_and_impl_trait_is_erased() {
        let pretty = pretty(
            syn::parse_quote!(key = "o:{a}:{b}"),
            syn::parse_quote! {
                async fn f(a: u8, b: u8) -> Result<impl Display, E> { #![allow(unused)] Ok(a) }
            },
        );
        assert!(
            contains(&pretty, "{ #![allow(unused)] let __lockrt_locker"),
            "{pretty}"
        );
        assert!(
            contains(&pretty, "let __lockrt_return: Result<_, E> = loop {};"),
            "{pretty}"
        );
        let key = "\"o:{}:{}\", ::lockrt::__private::KeyPart(&a, ':'),
            ::lockrt::__private::KeyPart(&b, '%')";
        assert!(contains(&pretty, key), "{pretty}");
    }
}

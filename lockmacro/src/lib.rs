//! The `#[distributed_lock]` attribute. Use it through the `lockrt` crate, which re-exports it
//! and documents it in full.
//!
//! Split like `tracing-attributes`: `item` parses the fn (leniently: the body stays tokens),
//! `attr` parses and checks the arguments (`value` each argument's value), `template` the key
//! template, `expand` writes the locked fn. On any mistake the original fn is emitted unchanged
//! next to the error, so one typo doesn't bury the user in follow-up errors.

use proc_macro::TokenStream;

mod attr;
mod expand;
mod item;
mod template;
mod value;

/// (Implemented by the `lockmacro` crate; use it as `lockrt::distributed_lock`.)
///
/// # Lock kinds
///
/// By default the lock is exclusive. Two arguments take another kind of lock on the key, each
/// one call on `LockOptions` (at most one of them, and only with a single `key`: a multi-key
/// lock is exclusive):
///
/// - `mode = "read"`: the read side of the key's read-write lock, shared with other readers
///   (`.read()`), e.g. `#[distributed_lock(key = "catalogue:{shop}", mode = "read")]`.
/// - `mode = "write"`: the write side, which is the exclusive lock (`.write()`), e.g.
///   `#[distributed_lock(key = "catalogue:{shop}", mode = "write")]`.
/// - `permits = N`: a semaphore of `N` permits, a `u32` of at least 1 checked at compile time
///   (`.permits(N)`), e.g. `#[distributed_lock(key = "export:{tenant}", permits = 3)]`.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    let func = match syn::parse2::<item::MaybeItemFn>(item.clone()) {
        Ok(func) => func,
        Err(e) => {
            let e = not_a_fn(&item, e);
            return with_error(item, e).into();
        }
    };
    match syn::parse::<attr::Args>(args).and_then(|args| expand::expand(args, &func)) {
        Ok(tokens) => tokens.into(),
        Err(e) => with_error(item, e).into(),
    }
}

fn with_error(item: proc_macro2::TokenStream, e: syn::Error) -> proc_macro2::TokenStream {
    let error = e.to_compile_error();
    quote::quote!(#item #error)
}

/// Why `item` is not a fn the attribute can wrap. `parse_error` is syn's complaint, kept when
/// the item is no valid Rust at all (a broken signature): it names the token that is wrong.
fn not_a_fn(item: &proc_macro2::TokenStream, parse_error: syn::Error) -> syn::Error {
    // A trait method without a default body parses as a signature followed by `;`.
    let message = if syn::parse2::<syn::TraitItemFn>(item.clone()).is_ok() {
        "#[distributed_lock] needs a fn body to wrap: put it on the method in the `impl`, not on \
         its declaration in the trait"
    } else if syn::parse2::<syn::Item>(item.clone()).is_ok() {
        "#[distributed_lock] goes on an `async fn`"
    } else {
        return parse_error;
    };
    syn::Error::new_spanned(item, message)
}

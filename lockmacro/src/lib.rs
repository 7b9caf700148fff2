//! The `#[distributed_lock]` attribute. Use it through the `lockrt` crate, which re-exports it
//! and documents it in full.
//!
//! Split like `tracing-attributes`: `attr` parses and checks the arguments, `template` the
//! key template, `expand` writes the locked fn. On any mistake the original fn is emitted
//! unchanged next to the error, so one typo doesn't bury the user in follow-up errors.

use proc_macro::TokenStream;
use quote::ToTokens;

mod attr;
mod expand;
mod template;

/// (Implemented by the `lockmacro` crate; use it as `lockrt::distributed_lock`.)
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let item2 = proc_macro2::TokenStream::from(item);
    let func = match syn::parse2::<syn::ItemFn>(item2.clone()) {
        Ok(func) => func,
        Err(_) => {
            let e = not_a_fn(&item2);
            return with_error(item2, e).into();
        }
    };
    let args = match syn::parse::<attr::Args>(args) {
        Ok(args) => args,
        Err(e) => return with_error(func.into_token_stream(), e).into(),
    };
    match expand::expand(args, &func) {
        Ok(tokens) => tokens.into(),
        Err(e) => with_error(func.into_token_stream(), e).into(),
    }
}

fn with_error(item: proc_macro2::TokenStream, e: syn::Error) -> proc_macro2::TokenStream {
    let error = e.to_compile_error();
    quote::quote!(#item #error)
}

fn not_a_fn(item: &proc_macro2::TokenStream) -> syn::Error {
    // A trait method without a default body parses as a signature followed by `;`.
    let message = if syn::parse2::<syn::TraitItemFn>(item.clone()).is_ok() {
        "#[distributed_lock] needs a fn body to wrap: put it on the method in the `impl`, not on \
         its declaration in the trait"
    } else {
        "#[distributed_lock] goes on an `async fn`"
    };
    syn::Error::new_spanned(item, message)
}

//! The `#[distributed_lock]` attribute. Use it through the `lockrt` crate, which re-exports it
//! and documents it in full.

use proc_macro::TokenStream;

/// Placeholder: the real expansion lands with the macro work.
#[proc_macro_attribute]
pub fn distributed_lock(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}

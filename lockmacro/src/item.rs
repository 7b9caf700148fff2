//! The annotated fn, parsed leniently: attributes, visibility and signature are parsed; the body
//! is kept as tokens (like tracing's `MaybeItemFn` and tokio's `ItemFn`). A half-typed body
//! still expands, so rustc reports the typo once, where it is, and an IDE keeps working.

use proc_macro2::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::token::Brace;
use syn::{Attribute, Signature, Visibility, braced};

/// `#[outer] vis sig { #![inner] body }`.
pub(crate) struct MaybeItemFn {
    pub(crate) outer_attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// `#![...]` at the top of the body: they must stay first in the body the expansion writes.
    pub(crate) inner_attrs: Vec<Attribute>,
    /// The body's braces: the async block that replaces the body reuses them, so diagnostics
    /// about the block point where the body is.
    pub(crate) brace: Brace,
    /// The body's statements, unparsed.
    pub(crate) body: TokenStream,
}

impl Parse for MaybeItemFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let outer_attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        let content;
        let brace = braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let body = content.parse()?;
        Ok(MaybeItemFn {
            outer_attrs,
            vis,
            sig,
            inner_attrs,
            brace,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_a_typo_still_parses() {
        let f: MaybeItemFn = syn::parse_quote! {
            /// Docs.
            pub async fn f(id: u64) -> u64 { let x = id +; x }
        };
        assert_eq!(f.sig.ident, "f");
        assert_eq!(f.outer_attrs.len(), 1);
        assert_eq!(f.body.to_string(), "let x = id + ; x");
    }

    #[test]
    fn inner_attributes_are_taken_out_of_the_body() {
        let f: MaybeItemFn = syn::parse_quote! {
            async fn f() { #![allow(unused_variables)] let a = 1; }
        };
        assert!(f.outer_attrs.is_empty());
        assert_eq!(f.inner_attrs.len(), 1);
        assert_eq!(f.body.to_string(), "let a = 1 ;");
    }

    #[test]
    fn a_declaration_without_body_does_not_parse() {
        assert!(syn::parse_str::<MaybeItemFn>("async fn f(&self);").is_err());
        assert!(syn::parse_str::<MaybeItemFn>("struct S;").is_err());
    }
}

//! `#[requires(...)]`: the one way to gate a test on a host capability (see bulkhead-testkit).
//!
//! ```text
//! #[bulkhead_testkit::requires(Root, Tun, "a reachable Debian mirror")]
//! #[tokio::test]
//! async fn network_link_works() { ... }
//! ```
//!
//! expands to `#[ignore = "requires root (namespaces, mounts, cgroups), /dev/net/tun, a
//! reachable Debian mirror"]` on the test and a first statement
//! `bulkhead_testkit::require(&[Capability::Root, Capability::Tun])`. So plain `cargo test`
//! reports the test as ignored with the reason, and `cargo test -- --include-ignored` (what
//! `scripts/test.sh` runs) runs it and fails it, naming the remedy, when the host lacks a
//! capability: never a silent pass. Identifiers are `Capability` variants, checked at run time;
//! string literals name needs the test checks itself (it fails when they are missing).

use proc_macro::TokenStream;
use quote::{format_ident, quote};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ItemFn, Lit, Token, parse_macro_input};

include!("capabilities.rs");

/// Gates a test on host capabilities; put it above `#[test]` / `#[tokio::test]`.
#[proc_macro_attribute]
pub fn requires(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = parse_macro_input!(args with Punctuated::<Expr, Token![,]>::parse_terminated);
    let func = parse_macro_input!(item as ItemFn);
    match expand(args, func) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(
    args: Punctuated<Expr, Token![,]>,
    func: ItemFn,
) -> syn::Result<proc_macro2::TokenStream> {
    let mut needs = Vec::new();
    let mut caps = Vec::new();
    for arg in &args {
        match arg {
            Expr::Path(p) if p.path.get_ident().is_some() => {
                let ident = p.path.get_ident().expect("checked above");
                let name = ident.to_string();
                let Some((_, what)) = CAPABILITIES.iter().find(|(n, _)| *n == name) else {
                    let known: Vec<&str> = CAPABILITIES.iter().map(|(n, _)| *n).collect();
                    return Err(syn::Error::new(
                        ident.span(),
                        format!("Unknown capability `{name}`; known: {}", known.join(", ")),
                    ));
                };
                needs.push((*what).to_owned());
                caps.push(format_ident!("{}", name, span = ident.span()));
            }
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => needs.push(s.value()),
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "Expected a capability (e.g. `Root`) or a string naming what else the test needs",
                ));
            }
        }
    }
    if needs.is_empty() {
        return Err(syn::Error::new(
            proc_macro2::Span::call_site(),
            "Name at least one capability, e.g. `#[requires(Root)]`",
        ));
    }
    // The ignore flag must be there when `#[test]` expands, so this attribute has to run first.
    let is_test = |a: &syn::Attribute| a.path().segments.last().is_some_and(|s| s.ident == "test");
    if !func.attrs.iter().any(is_test) {
        return Err(syn::Error::new(
            func.sig.ident.span(),
            "Put `#[requires(...)]` above `#[test]` or `#[tokio::test]` (attributes expand top down)",
        ));
    }
    if let Some(a) = func.attrs.iter().find(|a| a.path().is_ident("ignore")) {
        return Err(syn::Error::new(
            a.span(),
            "`#[requires(...)]` writes the `#[ignore]` reason itself; remove this one",
        ));
    }
    let reason = format!("requires {}", needs.join(", "));
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let stmts = &block.stmts;
    Ok(quote! {
        #[ignore = #reason]
        #(#attrs)*
        #vis #sig {
            ::bulkhead_testkit::require(&[#(::bulkhead_testkit::Capability::#caps),*]);
            #(#stmts)*
        }
    })
}

//! `#[func]`: a helper that kernels call by name; it takes the builder first and returns
//! `Result<_>`, so it inlines into the calling kernel.

use std::collections::HashMap;

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Pat, Type};

use crate::body::{b, Name, Translator};
use crate::kernel::type_head;

pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errs = Vec::new();
    if !attr.is_empty() {
        errs.push(syn::Error::new(attr.span(), "#[func] takes no arguments"));
    }
    let f: ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let k = crate::krate();
    // Parameters typed `Scalar<T>` or `Var<T>` are read where their names are used, as in a
    // kernel; `Var<T>` ones can be assigned.
    let mut names = HashMap::new();
    for arg in &f.sig.inputs {
        let FnArg::Typed(pt) = arg else {
            errs.push(syn::Error::new(
                arg.span(),
                "a #[func] helper is a free function",
            ));
            continue;
        };
        if let (Pat::Ident(pi), Some((head, _))) = (&*pt.pat, type_head(&pt.ty)) {
            let what = match head.as_str() {
                "Scalar" => Name::Scalar,
                "Var" => Name::Var,
                _ => Name::Plain,
            };
            names.insert(pi.ident.to_string(), what);
        }
    }
    let mut t = Translator::new(k.clone(), names);
    let body = t.valued(&f.block);
    errs.extend(t.errors);
    if !errs.is_empty() {
        return crate::errors(errs);
    }
    let b = b();
    let (attrs, vis, name) = (&f.attrs, &f.vis, &f.sig.ident);
    let generics = &f.sig.generics;
    let where_clause = &f.sig.generics.where_clause;
    let inputs = &f.sig.inputs;
    let out: Type = match &f.sig.output {
        syn::ReturnType::Default => syn::parse_quote!(()),
        syn::ReturnType::Type(_, ty) => (**ty).clone(),
    };
    quote! {
        #(#attrs)*
        #[allow(clippy::too_many_arguments)]
        #vis fn #name #generics (#b: &mut #k::KernelBuilder, #inputs) -> #k::Result<#out> #where_clause {
            #body
        }
    }
}

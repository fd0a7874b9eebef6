//! `#[kernel]`: the signature (configuration, scalar and buffer parameters), the generated
//! signature and argument types, and the builder function.

use std::collections::HashMap;

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, Lit, MetaNameValue, Pat, Token, Type};

use crate::body::{b, Name, Translator};

/// One kernel parameter, in order.
struct Param {
    ident: Ident,
    ty: Type,
    /// `#[when(cond)]`: declared only when the build-time `cond` holds (then the name is an
    /// `Option` in the body and in the arguments struct).
    when: Option<Expr>,
    kind: Kind,
}

enum Kind {
    Scalar,
    Buffer {
        shape: Vec<Expr>,
        dtype: Option<Expr>,
    },
}

/// The attribute's arguments.
#[derive(Default)]
struct Options {
    name: Option<Expr>,
    grid: Option<Expr>,
    signature: Option<Ident>,
}

fn options(attr: TokenStream, errors: &mut Vec<syn::Error>) -> Options {
    let mut o = Options::default();
    let parsed = match Punctuated::<MetaNameValue, Token![,]>::parse_terminated.parse2(attr) {
        Ok(p) => p,
        Err(e) => {
            errors.push(e);
            return o;
        }
    };
    for nv in parsed {
        let key = nv
            .path
            .get_ident()
            .map(|i| i.to_string())
            .unwrap_or_default();
        match key.as_str() {
            "name" => o.name = Some(nv.value),
            "grid" => o.grid = Some(nv.value),
            "signature" => match &nv.value {
                Expr::Path(p) if p.path.get_ident().is_some() => {
                    o.signature = p.path.get_ident().cloned()
                }
                v => errors.push(syn::Error::new(v.span(), "`signature = Name` takes a type name")),
            },
            _ => errors.push(syn::Error::new(
                nv.path.span(),
                "unknown #[kernel] argument: expected `name = \"...\"`, `grid = dim` or `signature = Name`",
            )),
        }
    }
    o
}

/// The last path segment's name of a type, and its one generic argument if any.
pub fn type_head(ty: &Type) -> Option<(String, Option<&Type>)> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    let arg = match &last.arguments {
        syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        },
        _ => None,
    };
    Some((last.ident.to_string(), arg))
}

fn is_buffer(ty: &Type) -> bool {
    matches!(type_head(ty), Some((h, _)) if ["In", "Out", "InOut"].contains(&h.as_str()))
}

/// `dequantize_4bit` -> `Dequantize4bit`.
fn camel(name: &str) -> String {
    name.split('_')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut c = s.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errs = Vec::new();
    let o = options(attr, &mut errs);
    let f: ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let k = crate::krate();
    if !f.sig.generics.params.is_empty() {
        errs.push(syn::Error::new(
            f.sig.generics.span(),
            "a kernel takes no generics: configuration (dtype, blocksize, ...) is a value; mark \
             it `#[config]`",
        ));
    }
    if let syn::ReturnType::Type(_, ty) = &f.sig.output {
        errs.push(syn::Error::new(
            ty.span(),
            "a kernel returns nothing: it stores into its `Out<_>` buffers",
        ));
    }
    let mut config = Vec::new();
    let mut params = Vec::new();
    let mut names = HashMap::new();
    for arg in &f.sig.inputs {
        let FnArg::Typed(pt) = arg else {
            errs.push(syn::Error::new(
                arg.span(),
                "a kernel is a free function, not a method",
            ));
            continue;
        };
        let (mut is_config, mut shape, mut dtype, mut when) = (false, None, None, None);
        for a in &pt.attrs {
            if a.path().is_ident("config") {
                is_config = true;
            } else if a.path().is_ident("shape") {
                match a.parse_args_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
                    Ok(dims) => shape = Some(dims.into_iter().collect::<Vec<_>>()),
                    Err(e) => errs.push(e),
                }
            } else if a.path().is_ident("dtype") {
                match a.parse_args::<Expr>() {
                    Ok(d) => dtype = Some(d),
                    Err(e) => errs.push(e),
                }
            } else if a.path().is_ident("when") {
                match a.parse_args::<Expr>() {
                    Ok(c) => when = Some(c),
                    Err(e) => errs.push(e),
                }
            } else {
                errs.push(syn::Error::new(
                    a.span(),
                    "a kernel parameter takes `#[config]`, `#[shape(...)]`, `#[dtype(...)]` or \
                     `#[when(condition)]`",
                ));
            }
        }
        if is_config {
            let (pat, ty) = (&pt.pat, &pt.ty);
            config.push(quote!(#pat: #ty));
            continue;
        }
        let ident = match &*pt.pat {
            Pat::Ident(pi) if pi.mutability.is_none() => pi.ident.clone(),
            p => {
                errs.push(syn::Error::new(
                    p.span(),
                    "a kernel parameter is a plain name",
                ));
                continue;
            }
        };
        let ty = (*pt.ty).clone();
        if is_buffer(&ty) {
            let Some(shape) = shape else {
                errs.push(syn::Error::new(
                    ident.span(),
                    format!("buffer `{ident}` needs its shape: `#[shape(n)]` (dims are u32 scalar parameters or sizes)"),
                ));
                continue;
            };
            match (holds_float(&ty), &dtype) {
                (true, None) => errs.push(syn::Error::new(
                    ident.span(),
                    format!(
                        "`Float` buffer `{ident}` needs its dtype: `#[dtype(expr)]` (f32, f16 or \
                         bf16, chosen when the kernel is built)"
                    ),
                )),
                (false, Some(d)) => errs.push(syn::Error::new(
                    d.span(),
                    format!(
                        "`#[dtype(...)]` is only for `Float` buffers; `{ident}`'s element type \
                         is its dtype"
                    ),
                )),
                _ => {}
            }
            names.insert(ident.to_string(), Name::Plain);
            params.push(Param {
                ident,
                ty,
                when,
                kind: Kind::Buffer { shape, dtype },
            });
        } else if crate::body::is_kind(&ty)
            && !matches!(&ty, Type::Path(p) if p.path.is_ident("bool"))
        {
            if let Some(s) = shape {
                errs.push(syn::Error::new(
                    s[0].span(),
                    "a scalar parameter has no shape",
                ));
            }
            // An optional scalar is an `Option<Scalar<T>>`: read it with `read(s)` once matched.
            let name = if when.is_some() {
                Name::Plain
            } else {
                Name::Scalar
            };
            names.insert(ident.to_string(), name);
            params.push(Param {
                ident,
                ty,
                when,
                kind: Kind::Scalar,
            });
        } else {
            errs.push(syn::Error::new(
                ty.span(),
                "a kernel parameter is a scalar (`u32`, `i32`, `f32`) or a buffer (`In<E>`, \
                 `Out<E>`, `InOut<E>` with E = f32, u32, i32, u8, i8, F16, BF16 or Float); mark \
                 build-time configuration `#[config]`",
            ));
        }
    }

    let mut t = Translator::new(k.clone(), names);
    let body = t.statements(&f.block);
    errs.extend(t.errors);
    if !errs.is_empty() {
        return crate::errors(errs);
    }

    let fn_name = &f.sig.ident;
    let vis = &f.vis;
    let attrs = &f.attrs;
    let sig_name = o
        .signature
        .unwrap_or_else(|| Ident::new(&camel(&fn_name.to_string()), fn_name.span()));
    let args_name = format_ident!("{}Args", sig_name);
    let kernel_name = match &o.name {
        Some(Expr::Lit(syn::ExprLit {
            lit: Lit::Str(s), ..
        })) => quote!(::std::format!(#s)),
        Some(e) => quote!(::std::string::ToString::to_string(&(#e))),
        None => {
            let s = fn_name.to_string();
            quote!(::std::string::String::from(#s))
        }
    };
    let b = b();
    let decls: Vec<TokenStream> = params
        .iter()
        .map(|p| {
            let (ident, ty) = (&p.ident, &p.ty);
            let name = ident.to_string();
            let decl = match &p.kind {
                Kind::Scalar => quote!(#k::dsl::scalar_param::<#ty>(#b, #name)),
                Kind::Buffer { shape, dtype } => {
                    let dtype = match dtype {
                        Some(d) => quote!(::core::option::Option::Some(#d)),
                        None => quote!(::core::option::Option::None),
                    };
                    quote! {
                        #k::dsl::buffer_param::<#ty>(
                            #b, #name, #dtype, &[#(#k::dsl::IntoDim::dim(#shape)),*],
                        )?
                    }
                }
            };
            match &p.when {
                None => quote!(let #ident = #decl;),
                Some(cond) => quote! {
                    let #ident = if #cond {
                        ::core::option::Option::Some(#decl)
                    } else {
                        ::core::option::Option::None
                    };
                },
            }
        })
        .collect();
    let grid = o
        .grid
        .map(|g| quote!(#b.set_grid(#k::dsl::IntoDim::dim(#g));));
    let has_buffers = params.iter().any(|p| matches!(p.kind, Kind::Buffer { .. }));
    let life = has_buffers.then(|| quote!(<'a>));
    let fields: Vec<TokenStream> = params
        .iter()
        .map(|p| {
            let (ident, ty) = (&p.ident, &p.ty);
            let mut doc = match &p.kind {
                Kind::Scalar => format!("Scalar parameter `{ident}`."),
                Kind::Buffer { shape, .. } => format!(
                    "Buffer `{ident}`, shape [{}].",
                    shape
                        .iter()
                        .map(|d| quote!(#d).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let lt = if has_buffers {
                quote!('a)
            } else {
                quote!('static)
            };
            let field = quote!(<#ty as #k::dsl::ArgType>::Field<#lt>);
            let field = match &p.when {
                None => field,
                Some(cond) => {
                    doc += &format!(" Present (`Some`) exactly when `{}`.", quote!(#cond));
                    quote!(::core::option::Option<#field>)
                }
            };
            quote!(#[doc = #doc] pub #ident: #field,)
        })
        .collect();
    let conversions: Vec<TokenStream> = params
        .iter()
        .map(|p| {
            let (ident, ty) = (&p.ident, &p.ty);
            let name = ident.to_string();
            match p.when {
                None => quote!(__qf_out.push(<#ty as #k::dsl::ArgType>::arg(&mut self.#ident, #name, kernel)?);),
                Some(_) => quote!(#k::dsl::optional_arg::<#ty>(&mut self.#ident, #name, kernel, &mut __qf_out)?;),
            }
        })
        .collect();
    let args_doc =
        format!("The named launch arguments of [`{fn_name}`] (one field per parameter).");
    let sig_doc = format!("The typed signature of the kernels [`{fn_name}`] builds.");
    let impl_life = if has_buffers {
        quote!(impl<'a>)
    } else {
        quote!(impl)
    };
    quote! {
        #[doc = #sig_doc]
        #[derive(Clone, Copy, Debug)]
        #vis struct #sig_name;

        #[doc = #args_doc]
        #[derive(Debug)]
        #vis struct #args_name #life {
            #(#fields)*
        }

        impl #k::dsl::Signature for #sig_name {
            type Args<'a> = #args_name #life;
        }

        #impl_life #k::dsl::KernelArgs for #args_name #life {
            fn to_args(&mut self, kernel: &#k::Kernel) -> #k::Result<::std::vec::Vec<#k::Arg<'_>>> {
                let mut __qf_out = ::std::vec::Vec::new();
                #(#conversions)*
                ::core::result::Result::Ok(__qf_out)
            }
        }

        #(#attrs)*
        #vis fn #fn_name(#(#config),*) -> #k::Result<#k::dsl::TypedKernel<#sig_name>> {
            let mut __qf_kernel = #k::KernelBuilder::new(&#kernel_name);
            {
                let #b = &mut __qf_kernel;
                #(#decls)*
                #grid
                #body
            }
            #k::dsl::TypedKernel::finish(__qf_kernel)
        }
    }
}

/// Whether a buffer type (`In<Float>`, `Out<Float>`, ...) holds `Float` elements, whose dtype is
/// chosen when the kernel is built.
fn holds_float(ty: &Type) -> bool {
    let Type::Path(p) = ty else { return false };
    let Some(seg) = p.path.segments.last() else {
        return false;
    };
    let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
        return false;
    };
    matches!(args.args.first(), Some(syn::GenericArgument::Type(Type::Path(e))) if e.path.is_ident("Float"))
}

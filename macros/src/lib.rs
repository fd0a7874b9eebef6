//! `#[qforge::kernel]` and `#[qforge::func]`: Rust functions written in a documented subset
//! become kernels built through the public `KernelBuilder` (through `qforge_ir::dsl`), with a
//! typed argument struct per kernel.
//!
//! The accepted language, each construct's IR meaning and the error messages are documented in
//! `docs/custom-ops.md`. In short: `let` binds a value (an IR value or a build-time Rust value),
//! `let mut` declares an IR variable, operators take two operands of one type with the IR's
//! semantics, `if` on a `bool` picks a branch when the kernel is built and on a `Val<bool>`
//! becomes an IR `if`, `for` over build-time bounds unrolls and over IR bounds loops,
//! `#[accumulate(order)]` loops are the IR's ordered sums, `buf[i]` loads and `buf[i] = v`
//! stores, `table[i]` looks up; anything else is a compile error at its span that says what to
//! write instead, all errors of a kernel at once.

mod body;
#[cfg(test)]
mod expansion_tests;
mod func;
mod kernel;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::quote;

/// Turns a function into a kernel builder with a typed signature.
///
/// ```ignore
/// #[qforge::kernel(name = "scale_{dtype}", grid = n)]
/// pub fn scale(
///     #[config] dtype: DType,
///     n: u32,
///     factor: f32,
///     #[shape(n)] #[dtype(dtype)] x: In<Float>,
///     #[shape(n)] #[dtype(dtype)] y: Out<Float>,
/// ) {
///     let i = work_item();
///     store_rounded(y, i, x[i] * factor, Rounding::NearestEven);
/// }
/// ```
///
/// generates `pub fn scale(dtype: DType) -> Result<TypedKernel<Scale>>`, the signature `Scale`
/// and `ScaleArgs<'a> { n: u32, factor: f32, x: FloatIn<'a>, y: FloatOut<'a> }`.
///
/// Attribute arguments: `name = "format {config}"` (default: the function's name),
/// `grid = dim` (a `u32` scalar parameter or a build-time size; default 1), `signature = Name`
/// (default: the function's name in CamelCase).
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel::expand(attr.into(), item.into()).into()
}

/// Turns a function into a helper that kernels call by name and that inlines into them (the IR
/// has no calls). Its parameters are IR values (`Val<T>`), buffers (`Buf<In<f32>>`, ...), tables,
/// variables (`Var<T>`), scalar parameters (`Scalar<T>`) or build-time values.
#[proc_macro_attribute]
pub fn func(attr: TokenStream, item: TokenStream) -> TokenStream {
    func::expand(attr.into(), item.into()).into()
}

/// The path of `qforge_ir` in the crate being compiled: `::qforge_ir` when it depends on
/// qforge-ir (or is qforge-ir), else `::qforge::ir` through the facade.
fn krate() -> TokenStream2 {
    use proc_macro_crate::{crate_name, FoundCrate};
    match crate_name("qforge-ir") {
        Ok(FoundCrate::Itself) => quote!(::qforge_ir),
        Ok(FoundCrate::Name(name)) => {
            let ident = proc_macro2::Ident::new(&name, proc_macro2::Span::call_site());
            quote!(::#ident)
        }
        Err(_) => match crate_name("qforge") {
            Ok(FoundCrate::Name(name)) => {
                let ident = proc_macro2::Ident::new(&name, proc_macro2::Span::call_site());
                quote!(::#ident::ir)
            }
            _ => quote!(::qforge::ir),
        },
    }
}

/// All of `errors` as `compile_error!`s (none when empty).
fn errors(errors: Vec<syn::Error>) -> TokenStream2 {
    errors.into_iter().map(|e| e.to_compile_error()).collect()
}

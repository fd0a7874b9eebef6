//! insta snapshots of what `#[kernel]` and `#[func]` expand to (formatted), for a few kernels.

use quote::quote;

fn pretty(tokens: proc_macro2::TokenStream) -> String {
    let file: syn::File = syn::parse2(tokens).expect("the expansion parses as items");
    prettyplease::unparse(&file)
}

#[test]
fn scale_kernel() {
    let out = crate::kernel::expand(
        quote!(name = "scale_{dtype}", grid = n),
        quote! {
            /// `y = x * factor` in the dtype.
            pub fn scale(
                #[config] dtype: DType,
                n: u32,
                factor: f32,
                #[shape(n)] #[dtype(dtype)] x: In<Float>,
                #[shape(n)] #[dtype(dtype)] y: Out<Float>,
            ) {
                let i = work_item();
                store_rounded(y, i, x[i] * factor, Rounding::NearestEven);
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn dot_kernel_with_accumulate_and_optional_bias() {
    let out = crate::kernel::expand(
        quote!(grid = rows),
        quote! {
            fn dot(
                #[config] k: u32,
                #[config] with_bias: bool,
                rows: u32,
                #[shape(rows, k)] a: In<f32>,
                #[shape(k)] w: In<f32>,
                #[when(with_bias)] #[shape(rows)] bias: In<f32>,
                #[shape(rows)] y: Out<f32>,
            ) {
                let r = work_item();
                let mut s: f32;
                #[accumulate(ReduceOrder::Strided(8))]
                for j in 0..k {
                    s = sum(a[r * k + j] * w[j]);
                }
                let mut out = s;
                match bias {
                    Some(b) => out += b[r],
                    None => {}
                }
                y[r] = out;
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn func_helper() {
    let out = crate::func::expand(
        quote!(),
        quote! {
            fn nf4_code(v: Val<f32>, midpoints: Table<f32>) -> Val<u32> {
                #[comptime]
                let mut pos = val(0u32);
                for step in [8u32, 4, 2, 1] {
                    let take = !(v <= midpoints[pos + (step - 1)]);
                    pos = select(take, pos + step, pos);
                }
                pos
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

//! Translation of a kernel body (the accepted subset of Rust) into calls of `qforge_ir::dsl`,
//! collecting every error with its span.

use std::collections::HashMap;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{BinOp, Block, Expr, Ident, Pat, RangeLimits, Stmt, UnOp};

/// Builtin functions of the kernel language (called as `name(args)`, expanded to
/// `qforge_ir::dsl::name(builder, args)`).
pub const BUILTINS: &[&str] = &[
    "var",
    "read",
    "read_option",
    "fma",
    "min",
    "max",
    "select",
    "abs",
    "sqrt",
    "mul_hi",
    "work_item",
    "val",
    "search_sorted",
    "reduce_sum",
    "reduce_absmax",
    "store_rounded",
    "table_f32",
    "table_u32",
    "from_bits",
];

/// Methods of the kernel language (`x.name(args)`, expanded to `qforge_ir::dsl::name(builder,
/// x, args)`). Any other method is a plain Rust call on a build-time value.
pub const METHODS: &[&str] = &[
    "to_f32", "to_u32", "to_i32", "to_bits", "as_u32", "as_i32", "abs", "sqrt", "min", "max",
    "mul_hi",
];

/// What a name in scope stands for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Name {
    /// A scalar parameter: read (an IR `param` op) where it is used; not assignable.
    Scalar,
    /// A `let mut` variable: read where it is used; assignable.
    Var,
    /// Anything else (a `Val`, a buffer, a table, a build-time value): used as it is.
    Plain,
    /// A `#[comptime] let mut` Rust variable: used as it is, assigned by Rust.
    RustMut,
}

/// The translator of one kernel or helper body.
pub struct Translator {
    /// Path of the `qforge_ir` crate in the user's crate.
    pub krate: TokenStream,
    scopes: Vec<HashMap<String, Name>>,
    /// Every error found, in source order.
    pub errors: Vec<syn::Error>,
}

/// `{ let a0 = arg0; ...; f(builder, a0, ...) suffix }`: the arguments are evaluated (and their
/// IR emitted) first, left to right, then the call borrows the builder (a nested
/// `f(builder, g(builder, x))` would borrow it twice).
pub fn apply(
    span: Span,
    f: TokenStream,
    args: Vec<TokenStream>,
    suffix: TokenStream,
) -> TokenStream {
    let b = b();
    // The call carries the user's span, so a type error in it points at the user's code.
    let f = respan(f, span);
    let names: Vec<Ident> = (0..args.len())
        .map(|i| format_ident!("__qf_a{}", i, span = span))
        .collect();
    quote_spanned!(span=> { #(let #names = #args;)* #f(#b, #(#names),*) #suffix })
}

/// `ts` with every token (and group) at `span`.
fn respan(ts: TokenStream, span: Span) -> TokenStream {
    ts.into_iter()
        .map(|tt| match tt {
            proc_macro2::TokenTree::Group(g) => {
                let mut ng = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                ng.set_span(span);
                proc_macro2::TokenTree::Group(ng)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

/// The builder's name in the generated code.
pub fn b() -> Ident {
    Ident::new("__qf_b", Span::call_site())
}

impl Translator {
    /// A translator with `names` in scope (the parameters).
    pub fn new(krate: TokenStream, names: HashMap<String, Name>) -> Self {
        Translator {
            krate,
            scopes: vec![names],
            errors: Vec::new(),
        }
    }

    fn error(&mut self, span: Span, message: impl std::fmt::Display) -> TokenStream {
        self.errors.push(syn::Error::new(span, message));
        quote!(())
    }

    fn lookup(&self, name: &str) -> Name {
        self.scopes
            .iter()
            .rev()
            .find_map(|s| s.get(name).copied())
            .unwrap_or(Name::Plain)
    }

    fn bind(&mut self, name: String, what: Name) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name, what);
        }
    }

    fn scoped<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        self.scopes.push(HashMap::new());
        let out = f(self);
        self.scopes.pop();
        out
    }

    /// The statements of `block` in a new scope; a tail expression is a statement too (a
    /// kernel body and a branch have no value).
    pub fn statements(&mut self, block: &Block) -> TokenStream {
        self.scoped(|t| {
            let mut out = TokenStream::new();
            for s in &block.stmts {
                out.extend(t.stmt(s));
            }
            out
        })
    }

    /// `{ statements tail }`: the block as a Rust block expression whose value is its tail
    /// expression (or `()`), in a new scope.
    pub fn block_value(&mut self, block: &Block) -> TokenStream {
        self.scoped(|t| {
            let mut out = TokenStream::new();
            let n = block.stmts.len();
            let mut tail = TokenStream::new();
            for (i, s) in block.stmts.iter().enumerate() {
                match s {
                    Stmt::Expr(e, None) if i + 1 == n && !is_statement_like(e) => {
                        out.extend(t.locate(e.span()));
                        tail = t.expr(e);
                    }
                    s => out.extend(t.stmt(s)),
                }
            }
            quote!({ #out #tail })
        })
    }

    /// `Ok({ statements tail })`: the body of a closure or helper that returns `Result<_>`.
    pub fn valued(&mut self, block: &Block) -> TokenStream {
        let k = self.krate.clone();
        let value = self.block_value(block);
        quote!(::core::result::Result::<_, #k::Error>::Ok(#value))
    }

    /// Records the source location of the statement at `span`.
    fn locate(&self, span: Span) -> TokenStream {
        let (k, b) = (&self.krate, b());
        quote_spanned!(span=> #k::dsl::at(#b, ::core::file!(), ::core::line!(), ::core::column!());)
    }

    fn stmt(&mut self, s: &Stmt) -> TokenStream {
        let loc = self.locate(s.span());
        let body = match s {
            Stmt::Local(local) => self.local(local),
            Stmt::Item(item) => self.error(
                item.span(),
                "items (fn, struct, use, ...) cannot be declared inside a kernel body; declare \
                 them outside (helpers as `#[qforge::func]`)",
            ),
            Stmt::Macro(m) => self.statement_macro(&m.mac),
            Stmt::Expr(e, _) => self.expr_stmt(e),
        };
        quote!(#loc #body)
    }

    fn statement_macro(&mut self, mac: &syn::Macro) -> TokenStream {
        if mac.path.is_ident("comptime") {
            let tokens = &mac.tokens;
            return quote!(#tokens;);
        }
        self.error(
            mac.span(),
            "only `comptime! { ... }` (plain Rust run when the kernel is built) is accepted as a \
             macro in a kernel body",
        )
    }

    fn local(&mut self, local: &syn::Local) -> TokenStream {
        let (k, b) = (self.krate.clone(), b());
        if let Some(init) = &local.init {
            if let Some((_, diverge)) = &init.diverge {
                return self.error(
                    diverge.span(),
                    "`let ... else` is not in the kernel language",
                );
            }
        }
        let (pat, ty) = match &local.pat {
            Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
            p => (p, None),
        };
        let comptime = local.attrs.iter().any(|a| a.path().is_ident("comptime"));
        if let Some(a) = local.attrs.iter().find(|a| !a.path().is_ident("comptime")) {
            return self.error(
                a.span(),
                "the only attribute of a kernel `let` is `#[comptime]`",
            );
        }
        if comptime {
            // `#[comptime] let mut x = e;`: a Rust variable (it may hold a `Val` handle),
            // rebound by Rust when the kernel is built.
            let (Pat::Ident(pi), Some(init)) = (pat, &local.init) else {
                return self.error(local.span(), "`#[comptime]` takes `let mut name = value;`");
            };
            if pi.mutability.is_none() {
                return self.error(
                    pi.span(),
                    "`#[comptime]` is for `let mut`: a plain `let` is already a Rust binding",
                );
            }
            let e = self.expr(&init.expr);
            let ident = &pi.ident;
            self.bind(ident.to_string(), Name::RustMut);
            let ty = ty.map(|t| quote!(: #t));
            return quote!(#[allow(unused_assignments)] let mut #ident #ty = #e;);
        }
        // `let v = var::<f32>("name");`: a kernel variable with its IR name given.
        if let (Pat::Ident(pi), Some(init)) = (pat, &local.init) {
            if is_builtin_call(&init.expr, "var") {
                let e = self.expr(&init.expr);
                let ident = &pi.ident;
                self.bind(ident.to_string(), Name::Var);
                return quote!(let #ident = #e;);
            }
        }
        if let Pat::Ident(pi) = pat {
            if pi.mutability.is_some() {
                let ident = &pi.ident;
                let name = ident.to_string();
                let decl = match (&local.init, ty) {
                    (None, Some(ty)) => {
                        if !is_kind(ty) {
                            return self.error(
                                ty.span(),
                                "a kernel variable holds `f32`, `u32`, `i32` or `bool`",
                            );
                        }
                        quote!(let #ident = #k::dsl::var::<#ty>(#b, #name);)
                    }
                    (None, None) => {
                        return self.error(
                            pi.span(),
                            "give the variable a type (`let mut x: f32;`) or a first value \
                             (`let mut x = 0.0;`)",
                        )
                    }
                    (Some(init), None) => {
                        let e = self.expr(&init.expr);
                        let init = apply(
                            ident.span(),
                            quote!(#k::dsl::var_init),
                            vec![quote!(#name), e],
                            quote!(),
                        );
                        quote!(let #ident = #init;)
                    }
                    (Some(init), Some(ty)) => {
                        if !is_kind(ty) {
                            return self.error(
                                ty.span(),
                                "a kernel variable holds `f32`, `u32`, `i32` or `bool`",
                            );
                        }
                        let e = self.expr(&init.expr);
                        let set = apply(
                            ident.span(),
                            quote!(#k::dsl::assign),
                            vec![quote!(#ident), e],
                            quote!(),
                        );
                        quote! {
                            let #ident = #k::dsl::var::<#ty>(#b, #name);
                            #set;
                        }
                    }
                };
                self.bind(name, Name::Var);
                return decl;
            }
        }
        let Some(init) = &local.init else {
            return self.error(
                local.span(),
                "a `let` without a value: give it one, or declare a variable (`let mut x: f32;`)",
            );
        };
        let e = self.expr(&init.expr);
        self.bind_pattern(pat);
        let ty = ty.map(|t| quote!(: #t));
        quote!(let #pat #ty = #e;)
    }

    /// Binds every name of an immutable pattern as plain.
    fn bind_pattern(&mut self, pat: &Pat) {
        match pat {
            Pat::Ident(pi) => {
                if pi.mutability.is_some() {
                    self.errors.push(syn::Error::new(
                        pi.span(),
                        "a `mut` binding inside a pattern is not a kernel variable: declare it \
                         on its own (`let mut x = ...;`)",
                    ));
                }
                self.bind(pi.ident.to_string(), Name::Plain);
            }
            Pat::Tuple(t) => t.elems.iter().for_each(|p| self.bind_pattern(p)),
            Pat::Slice(s) => s.elems.iter().for_each(|p| self.bind_pattern(p)),
            Pat::TupleStruct(t) => t.elems.iter().for_each(|p| self.bind_pattern(p)),
            Pat::Struct(s) => s.fields.iter().for_each(|f| self.bind_pattern(&f.pat)),
            Pat::Type(t) => self.bind_pattern(&t.pat),
            Pat::Reference(r) => self.bind_pattern(&r.pat),
            Pat::Paren(p) => self.bind_pattern(&p.pat),
            _ => {}
        }
    }

    /// An expression statement (its value, if any, is dropped: a kernel statement has none).
    fn expr_stmt(&mut self, e: &Expr) -> TokenStream {
        match e {
            Expr::If(i) => self.if_stmt(i),
            Expr::ForLoop(f) => self.for_loop(f),
            Expr::Assign(a) => self.assign(&a.left, &a.right, None),
            Expr::Binary(bin) if compound_op(&bin.op).is_some() => {
                self.assign(&bin.left, &bin.right, compound_op(&bin.op))
            }
            Expr::Block(block) if block.label.is_none() => {
                let inner = self.statements(&block.block);
                quote!({ #inner })
            }
            Expr::Macro(m) => self.statement_macro(&m.mac),
            Expr::Match(m) => self.build_time_match(m, true),
            e => {
                let t = self.expr(e);
                quote!(#t;)
            }
        }
    }

    fn assign(&mut self, left: &Expr, right: &Expr, op: Option<&'static str>) -> TokenStream {
        let (k, b) = (self.krate.clone(), b());
        let combine = |t: &mut Self, current: TokenStream| -> TokenStream {
            let rhs = t.expr(right);
            match op {
                Some(op) => {
                    let f = Ident::new(op, Span::call_site());
                    apply(
                        right.span(),
                        quote!(#k::dsl::#f),
                        vec![current, rhs],
                        quote!(),
                    )
                }
                None => rhs,
            }
        };
        match left {
            Expr::Path(p) if p.path.get_ident().is_some() => {
                let ident = p.path.get_ident().cloned().unwrap_or_else(|| b.clone());
                match self.lookup(&ident.to_string()) {
                    Name::RustMut => {
                        let value = combine(self, quote!(#ident));
                        quote!(#ident = #value;)
                    }
                    Name::Var => {
                        let value = combine(self, quote!(#k::dsl::read(#b, #ident)));
                        let set = apply(
                            left.span(),
                            quote!(#k::dsl::assign),
                            vec![quote!(#ident), value],
                            quote!(),
                        );
                        quote!(#set;)
                    }
                    Name::Scalar => self.error(
                        ident.span(),
                        format!("`{ident}` is a scalar parameter: it cannot be assigned"),
                    ),
                    Name::Plain => self.error(
                        ident.span(),
                        format!(
                            "`{ident}` is not a kernel variable: declare it with `let mut` to \
                             assign it"
                        ),
                    ),
                }
            }
            Expr::Index(ix) => {
                let buf = self.expr(&ix.expr);
                let index = self.expr(&ix.index);
                let value = match op {
                    Some(_) => {
                        let current = quote!(#k::dsl::index(#b, __qf_buf, __qf_i));
                        combine(self, current)
                    }
                    None => self.expr(right),
                };
                quote_spanned!(left.span()=> {
                    let __qf_buf = #buf;
                    let __qf_i = #index;
                    let __qf_i = #k::dsl::val::<u32>(#b, __qf_i);
                    let __qf_v = #value;
                    #k::dsl::store(#b, __qf_buf, __qf_i, __qf_v);
                })
            }
            other => self.error(
                other.span(),
                "only a `let mut` variable (`x = v`) or a buffer element (`buf[i] = v`) can be \
                 assigned in a kernel",
            ),
        }
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> TokenStream {
        let (k, b) = (self.krate.clone(), b());
        let cond = self.expr(&i.cond);
        let then = self.statements(&i.then_branch);
        let otherwise = match &i.else_branch {
            None => quote!(::core::option::Option::None::<
                fn(&mut #k::KernelBuilder) -> #k::Result<()>
            >),
            Some((_, e)) => {
                let inner = match &**e {
                    Expr::If(nested) => self.if_stmt(nested),
                    Expr::Block(block) => self.statements(&block.block),
                    other => self.error(other.span(), "expected a block"),
                };
                quote!(::core::option::Option::Some(|#b: &mut #k::KernelBuilder| {
                    #inner
                    ::core::result::Result::<(), #k::Error>::Ok(())
                }))
            }
        };
        quote_spanned! {i.if_token.span()=> {
            let __qf_c = #cond;
            #k::dsl::if_(#b, __qf_c, |#b: &mut #k::KernelBuilder| {
                #then
                ::core::result::Result::<(), #k::Error>::Ok(())
            }, #otherwise)?;
        }}
    }

    fn for_loop(&mut self, f: &syn::ExprForLoop) -> TokenStream {
        let (k, b) = (self.krate.clone(), b());
        if let Some(label) = &f.label {
            return self.error(label.span(), "loop labels are not in the kernel language");
        }
        let accumulate = f.attrs.iter().find(|a| a.path().is_ident("accumulate"));
        if let Some(a) = f.attrs.iter().find(|a| !a.path().is_ident("accumulate")) {
            return self.error(
                a.span(),
                "the only attribute of a kernel `for` is `#[accumulate(order)]`",
            );
        }
        if !is_range(&f.expr) {
            // Iteration over a build-time collection: a Rust loop, unrolled when the kernel is
            // built.
            if accumulate.is_some() {
                return self.error(f.expr.span(), "an `#[accumulate]` loop runs over `0..len`");
            }
            let iter = self.expr(&f.expr);
            let pat = &f.pat;
            let body = self.scoped(|t| {
                t.bind_pattern(pat);
                t.statements(&f.body)
            });
            return quote!(for #pat in #iter { #body });
        }
        let Some((start, end, step)) = self.range(&f.expr) else {
            return quote!(());
        };
        let index = match &*f.pat {
            Pat::Ident(pi) if pi.mutability.is_none() && pi.subpat.is_none() => pi.ident.clone(),
            Pat::Wild(_) => Ident::new("_", Span::call_site()),
            other => {
                return self.error(other.span(), "a kernel `for` binds one index name (or `_`)")
            }
        };
        if let Some(attr) = accumulate {
            return self.accumulate(attr, f, &index, (start, end, step));
        }
        let body = self.scoped(|t| {
            t.bind(index.to_string(), Name::Plain);
            t.statements(&f.body)
        });
        quote_spanned! {f.for_token.span()=> {
            let __qf_s = #start;
            let __qf_e = #end;
            #k::dsl::for_(#b, __qf_s, __qf_e, #step, |#b: &mut #k::KernelBuilder, #index| {
                #body
                ::core::result::Result::<(), #k::Error>::Ok(())
            })?;
        }}
    }

    /// `a..b` or `(a..b).step_by(k)`: the translated start, end and step.
    fn range(&mut self, e: &Expr) -> Option<(TokenStream, TokenStream, TokenStream)> {
        let bad = "a kernel `for` runs over `start..end` or `(start..end).step_by(k)`";
        match e {
            Expr::Range(r) => {
                if matches!(r.limits, RangeLimits::Closed(_)) {
                    self.error(
                        r.span(),
                        "write the range half-open: `start..end + 1` is `start..=end`",
                    );
                    return None;
                }
                let (Some(s), Some(en)) = (&r.start, &r.end) else {
                    self.error(r.span(), bad);
                    return None;
                };
                Some((self.expr(s), self.expr(en), quote!(1u32)))
            }
            Expr::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => {
                let inner = match &*m.receiver {
                    Expr::Paren(p) => &*p.expr,
                    other => other,
                };
                let (s, en, _) = self.range(inner)?;
                let step = &m.args[0];
                Some((s, en, quote!(#step)))
            }
            Expr::Paren(p) => self.range(&p.expr),
            other => {
                self.error(other.span(), bad);
                None
            }
        }
    }

    fn accumulate(
        &mut self,
        attr: &syn::Attribute,
        f: &syn::ExprForLoop,
        index: &Ident,
        (start, end, _): (TokenStream, TokenStream, TokenStream),
    ) -> TokenStream {
        let (k, b) = (self.krate.clone(), b());
        let order: Expr = match attr.parse_args() {
            Ok(o) => o,
            Err(e) => {
                self.errors.push(e);
                return quote!(());
            }
        };
        if !["0", "0u32"].contains(&start.to_string().as_str()) {
            return self.error(f.expr.span(), "an `#[accumulate]` loop runs over `0..len`");
        }
        // The trailing `acc = sum(a * b);` statements name the accumulators and factors.
        let stmts = &f.body.stmts;
        let mut split = stmts.len();
        while split > 0 && sum_statement(&stmts[split - 1]).is_some() {
            split -= 1;
        }
        if let Some(Stmt::Expr(Expr::Assign(a), _)) = stmts.get(split.wrapping_sub(1)) {
            if let Expr::Call(c) = &*a.right {
                if matches!(&*c.func, Expr::Path(p) if p.path.is_ident("sum")) {
                    return self.error(
                        c.args.span(),
                        "`sum(...)` takes one product `a * b` (the accumulate multiplies and sums)",
                    );
                }
            }
        }
        if split == stmts.len() {
            return self.error(
                f.body.span(),
                "an `#[accumulate]` loop ends with one `acc = sum(a * b);` per accumulator",
            );
        }
        let mut vars = Vec::new();
        let mut factors = Vec::new();
        let body = self.scoped(|t| {
            t.bind(index.to_string(), Name::Plain);
            let mut out = TokenStream::new();
            for s in &stmts[..split] {
                out.extend(t.stmt(s));
            }
            for s in &stmts[split..] {
                let Some((acc, x, y)) = sum_statement(s) else {
                    continue;
                };
                if t.lookup(&acc.to_string()) != Name::Var {
                    t.error(
                        acc.span(),
                        format!("`{acc}` is not a kernel variable (`let mut {acc}: f32;`)"),
                    );
                }
                let (x, y) = (t.expr(x), t.expr(y));
                let i = vars.len();
                let (fx, fy) = (format_ident!("__qf_x{}", i), format_ident!("__qf_y{}", i));
                out.extend(quote!(let #fx = #x; let #fy = #y;));
                vars.push(acc.clone());
                factors.push(quote!((#k::dsl::val::<f32>(#b, #fx), #k::dsl::val::<f32>(#b, #fy))));
            }
            out
        });
        quote_spanned! {f.for_token.span()=> {
            let __qf_n = #end;
            #k::dsl::accumulate(#b, __qf_n, #order, &[#(#vars),*], |#b: &mut #k::KernelBuilder, #index| {
                #body
                ::core::result::Result::<_, #k::Error>::Ok(::std::vec![#(#factors),*])
            })?;
        }}
    }

    /// Translates an expression (a value).
    pub fn expr(&mut self, e: &Expr) -> TokenStream {
        let (k, b) = (self.krate.clone(), b());
        match e {
            Expr::Lit(l) => l.to_token_stream(),
            Expr::Path(p) => {
                if let Some(ident) = p.path.get_ident() {
                    return match self.lookup(&ident.to_string()) {
                        Name::Scalar | Name::Var => quote!(#k::dsl::read(#b, #ident)),
                        Name::Plain | Name::RustMut => quote!(#ident),
                    };
                }
                p.to_token_stream()
            }
            Expr::Paren(p) => {
                let inner = self.expr(&p.expr);
                quote!((#inner))
            }
            Expr::Group(g) => self.expr(&g.expr),
            Expr::Binary(bin) => self.binary(bin),
            Expr::Unary(u) => {
                let inner = self.expr(&u.expr);
                match u.op {
                    UnOp::Neg(_) => apply(u.span(), quote!(#k::dsl::neg), vec![inner], quote!()),
                    UnOp::Not(_) => apply(u.span(), quote!(#k::dsl::not), vec![inner], quote!()),
                    UnOp::Deref(_) => quote!(*#inner),
                    _ => self.error(u.span(), "this operator is not in the kernel language"),
                }
            }
            Expr::Index(ix) => {
                let x = self.expr(&ix.expr);
                let i = self.expr(&ix.index);
                apply(ix.span(), quote!(#k::dsl::index), vec![x, i], quote!())
            }
            Expr::Call(c) => self.call(c),
            Expr::MethodCall(m) => self.method(m),
            Expr::Field(_) | Expr::Repeat(_) => e.to_token_stream(),
            Expr::Reference(r) => {
                let inner = self.expr(&r.expr);
                let m = r.mutability;
                quote!(&#m #inner)
            }
            Expr::Array(a) => {
                let elems: Vec<TokenStream> = a.elems.iter().map(|x| self.expr(x)).collect();
                quote!([#(#elems),*])
            }
            Expr::Tuple(tu) => {
                let elems: Vec<TokenStream> = tu.elems.iter().map(|x| self.expr(x)).collect();
                quote!((#(#elems,)*))
            }
            Expr::Try(t) => {
                let inner = self.expr(&t.expr);
                quote!(#inner?)
            }
            Expr::If(i) => self.if_value(i),
            Expr::Block(bl) if bl.label.is_none() => self.block_value(&bl.block),
            Expr::Match(m) => self.build_time_match(m, false),
            Expr::Struct(st) => {
                let path = &st.path;
                let fields: Vec<TokenStream> = st
                    .fields
                    .iter()
                    .map(|fv| {
                        let member = &fv.member;
                        let v = self.expr(&fv.expr);
                        quote!(#member: #v)
                    })
                    .collect();
                let rest = st.rest.as_ref().map(|r| {
                    let r = self.expr(r);
                    quote!(, ..#r)
                });
                quote!(#path { #(#fields),* #rest })
            }
            Expr::Macro(m) if m.mac.path.is_ident("comptime") => {
                let tokens = &m.mac.tokens;
                quote!((#tokens))
            }
            Expr::Cast(c) => self.error(
                c.as_token.span(),
                "`as` casts are not in the kernel language: convert with `.to_f32()`, \
                 `.to_u32(Rounding::...)`, `.to_i32(Rounding::...)`, `.to_bits()`, \
                 `from_bits(x)`, `.as_u32()` or `.as_i32()` (for a build-time value, wrap the \
                 cast in `comptime!(...)`)",
            ),
            Expr::Closure(c) => self.error(
                c.span(),
                "closures are not in the kernel language: write a `#[qforge::func]` helper",
            ),
            Expr::While(w) => self.error(
                w.while_token.span(),
                "`while` is not in the kernel language: write a counted `for i in start..end` loop",
            ),
            Expr::Loop(l) => self.error(
                l.loop_token.span(),
                "`loop` is not in the kernel language: write a counted `for i in start..end` loop",
            ),
            Expr::Return(r) => self.error(r.span(), "`return` is not in the kernel language"),
            Expr::Break(br) => self.error(br.span(), "`break` is not in the kernel language"),
            Expr::Continue(c) => self.error(
                c.span(),
                "`continue` is not in the kernel language: use `if`",
            ),
            Expr::Range(r) => self.error(
                r.span(),
                "a range is only accepted as the bounds of a `for` loop",
            ),
            Expr::Assign(a) => self.error(
                a.span(),
                "an assignment is a statement in a kernel, not a value",
            ),
            Expr::ForLoop(f) => self.error(
                f.for_token.span(),
                "a `for` loop is a statement in a kernel, not a value",
            ),
            Expr::Macro(m) => self.error(
                m.span(),
                "only `comptime!(...)` (plain Rust evaluated when the kernel is built) is \
                 accepted as a macro in a kernel body",
            ),
            other => self.error(
                other.span(),
                "this expression is not in the kernel language",
            ),
        }
    }

    /// `match` on a build-time value: a Rust `match` whose arms are kernel code, statements
    /// (`statement`: the match is a statement) or values.
    fn build_time_match(&mut self, m: &syn::ExprMatch, statement: bool) -> TokenStream {
        let scrutinee = self.expr(&m.expr);
        let arms: Vec<TokenStream> = m
            .arms
            .iter()
            .map(|arm| {
                self.scoped(|t| {
                    t.bind_pattern(&arm.pat);
                    let pat = &arm.pat;
                    let guard = arm.guard.as_ref().map(|(_, g)| {
                        let g = t.expr(g);
                        quote!(if #g)
                    });
                    let body = match (&*arm.body, statement) {
                        (Expr::Block(bl), true) => t.statements(&bl.block),
                        (e, true) => t.expr_stmt(e),
                        (e, false) => t.expr(e),
                    };
                    quote!(#pat #guard => { #body })
                })
            })
            .collect();
        quote!(match #scrutinee { #(#arms)* })
    }

    fn binary(&mut self, bin: &syn::ExprBinary) -> TokenStream {
        let k = self.krate.clone();
        if compound_op(&bin.op).is_some() {
            return self.error(
                bin.span(),
                "a compound assignment is a statement, not a value",
            );
        }
        let (l, r) = (self.expr(&bin.left), self.expr(&bin.right));
        let span = bin.op.span();
        let cmp = |op: &str| {
            let op = Ident::new(op, Span::call_site());
            apply(
                span,
                quote!(#k::dsl::cmp),
                vec![quote!(#k::CmpOp::#op), l.clone(), r.clone()],
                quote!(),
            )
        };
        let f = match bin.op {
            BinOp::Add(_) => "add",
            BinOp::Sub(_) => "sub",
            BinOp::Mul(_) => "mul",
            BinOp::Div(_) => "div",
            BinOp::Rem(_) => "rem",
            BinOp::BitAnd(_) | BinOp::And(_) => "and",
            BinOp::BitOr(_) | BinOp::Or(_) => "or",
            BinOp::BitXor(_) => "xor",
            BinOp::Shl(_) => "shl",
            BinOp::Shr(_) => "shr",
            BinOp::Eq(_) => return cmp("Eq"),
            BinOp::Ne(_) => return cmp("Ne"),
            BinOp::Lt(_) => return cmp("Lt"),
            BinOp::Le(_) => return cmp("Le"),
            BinOp::Gt(_) => return cmp("Gt"),
            BinOp::Ge(_) => return cmp("Ge"),
            _ => return self.error(span, "this operator is not in the kernel language"),
        };
        let f = Ident::new(f, Span::call_site());
        apply(span, quote!(#k::dsl::#f), vec![l, r], quote!())
    }

    fn call(&mut self, c: &syn::ExprCall) -> TokenStream {
        let (k, b) = (self.krate.clone(), b());
        let Expr::Path(p) = &*c.func else {
            return self.error(c.func.span(), "call a function by its name in a kernel");
        };
        let path = &p.path;
        if p.qself.is_none() && path.leading_colon.is_none() && path.segments.len() == 1 {
            let seg = &path.segments[0];
            let (ident, generics) = (&seg.ident, &seg.arguments);
            let name = ident.to_string();
            let args: Vec<TokenStream> = c.args.iter().map(|a| self.expr(a)).collect();
            if BUILTINS.contains(&name.as_str()) {
                return apply(c.span(), quote!(#k::dsl::#ident #generics), args, quote!());
            }
            if name.starts_with(|c: char| c.is_ascii_uppercase()) {
                // A constructor (`Some(x)`, a tuple struct): Rust, with kernel arguments.
                return quote!(#ident #generics (#(#args),*));
            }
            if name == "sum" {
                return self.error(c.span(), "`sum(a * b)` is only accepted as `acc = sum(a * b);` at the end of an `#[accumulate]` loop");
            }
            // A `#[qforge::func]` helper: a bare scalar parameter or variable name is passed as
            // its handle, which `dsl::pass` reads when the helper wants a `Val` instead.
            let args = c
                .args
                .iter()
                .zip(args)
                .map(|(a, t)| match a {
                    Expr::Path(p)
                        if p.path.get_ident().is_some_and(|i| {
                            matches!(self.lookup(&i.to_string()), Name::Scalar | Name::Var)
                        }) =>
                    {
                        let i = p.path.get_ident();
                        quote!(#k::dsl::pass(#b, #i))
                    }
                    _ => t,
                })
                .collect();
            return apply(c.span(), quote!(#ident #generics), args, quote!(?));
        }
        let first = path
            .segments
            .first()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        if ["f32", "u32", "i32", "f64", "bool", "std", "core"].contains(&first.as_str()) {
            let last = path
                .segments
                .last()
                .map(|s| s.ident.to_string())
                .unwrap_or_default();
            let shown = quote!(#path).to_string().replace(' ', "");
            let hint = if BUILTINS.contains(&last.as_str()) {
                format!("write the kernel builtin `{last}(...)` (the IR's semantics)")
            } else if METHODS.contains(&last.as_str()) {
                format!("write the kernel method `x.{last}(...)`")
            } else {
                "wrap build-time Rust in `comptime!(...)`".to_string()
            };
            return self.error(
                path.span(),
                format!("`{shown}` is Rust's own function, not the kernel's: {hint}"),
            );
        }
        // A plain Rust call (an enum variant, a constructor, a library function on build-time
        // values): left as it is.
        c.to_token_stream()
    }

    fn method(&mut self, m: &syn::ExprMethodCall) -> TokenStream {
        let k = self.krate.clone();
        let name = m.method.to_string();
        if !METHODS.contains(&name.as_str()) {
            // A Rust method on a build-time value.
            let receiver = self.expr(&m.receiver);
            let (method, turbofish, args) = (&m.method, &m.turbofish, &m.args);
            return quote!(#receiver.#method #turbofish (#args));
        }
        let receiver = self.expr(&m.receiver);
        let args: Vec<TokenStream> = m.args.iter().map(|a| self.expr(a)).collect();
        let method = &m.method;
        let mut all = vec![receiver];
        all.extend(args);
        apply(m.method.span(), quote!(#k::dsl::#method), all, quote!())
    }

    fn if_value(&mut self, i: &syn::ExprIf) -> TokenStream {
        let (k, b) = (self.krate.clone(), b());
        let cond = self.expr(&i.cond);
        let then = self.valued(&i.then_branch);
        let Some((_, e)) = &i.else_branch else {
            return self.error(i.span(), "an `if` used as a value needs an `else`");
        };
        let otherwise = match &**e {
            Expr::If(nested) => {
                let v = self.if_value(nested);
                quote!(::core::result::Result::<_, #k::Error>::Ok(#v))
            }
            Expr::Block(block) => self.valued(&block.block),
            other => self.error(other.span(), "expected a block"),
        };
        quote_spanned! {i.if_token.span()=> {
            let __qf_c = #cond;
            #k::dsl::if_value(#b, __qf_c, |#b: &mut #k::KernelBuilder| { #then }, |#b: &mut #k::KernelBuilder| { #otherwise })?
        }}
    }
}

/// `x += y` and friends: the operator function.
fn compound_op(op: &BinOp) -> Option<&'static str> {
    Some(match op {
        BinOp::AddAssign(_) => "add",
        BinOp::SubAssign(_) => "sub",
        BinOp::MulAssign(_) => "mul",
        BinOp::DivAssign(_) => "div",
        BinOp::RemAssign(_) => "rem",
        BinOp::BitAndAssign(_) => "and",
        BinOp::BitOrAssign(_) => "or",
        BinOp::BitXorAssign(_) => "xor",
        BinOp::ShlAssign(_) => "shl",
        BinOp::ShrAssign(_) => "shr",
        _ => return None,
    })
}

/// `acc = sum(a * b);`: the accumulator and the two factors.
fn sum_statement(s: &Stmt) -> Option<(&Ident, &Expr, &Expr)> {
    let Stmt::Expr(Expr::Assign(a), _) = s else {
        return None;
    };
    let Expr::Path(p) = &*a.left else { return None };
    let acc = p.path.get_ident()?;
    let Expr::Call(c) = &*a.right else {
        return None;
    };
    let Expr::Path(f) = &*c.func else { return None };
    if !f.path.is_ident("sum") || c.args.len() != 1 {
        return None;
    }
    let Expr::Binary(m) = &c.args[0] else {
        return None;
    };
    matches!(m.op, BinOp::Mul(_)).then_some((acc, &*m.left, &*m.right))
}

/// Whether `e` calls the builtin `name` (with or without a turbofish).
fn is_builtin_call(e: &Expr, name: &str) -> bool {
    matches!(e, Expr::Call(c) if matches!(&*c.func, Expr::Path(p)
        if p.path.segments.len() == 1 && p.path.segments[0].ident == name))
}

/// `a..b`, `(a..b)` or `(a..b).step_by(k)`.
fn is_range(e: &Expr) -> bool {
    match e {
        Expr::Range(_) => true,
        Expr::Paren(p) => is_range(&p.expr),
        Expr::MethodCall(m) => m.method == "step_by" && is_range(&m.receiver),
        _ => false,
    }
}

/// Statements whose value is `()` even in tail position.
fn is_statement_like(e: &Expr) -> bool {
    matches!(
        e,
        Expr::ForLoop(_) | Expr::Assign(_) | Expr::While(_) | Expr::Loop(_)
    ) || matches!(e, Expr::If(i) if i.else_branch.is_none())
        || matches!(e, Expr::Binary(b) if compound_op(&b.op).is_some())
}

/// `f32`, `u32`, `i32` or `bool`.
pub fn is_kind(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(p) if ["f32", "u32", "i32", "bool"].iter().any(|k| p.path.is_ident(k)))
}

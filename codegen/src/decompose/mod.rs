//! The generic decomposition pass: rewrites the ops a backend does not lower itself into ops it
//! does. Today that is [`Op::SearchSorted`], which every backend receives as table lookups and
//! compares, in the form that suits it ([`SearchStrategy`]):
//!
//! * [`SearchStrategy::Buckets`] (PTX, WGSL): a bucket table indexed by the top bits of the
//!   value gives a first candidate, and at most [`buckets::BUCKET_COMPARES`] threshold compares
//!   finish the search (`buckets.rs`): three memory reads from small tables (GPU backends keep
//!   tables in constant memory or per-thread arrays).
//! * [`SearchStrategy::Packed`] (Cranelift, LLVM without AVX-512): a finer bucket table whose
//!   entry packs the bucket's first count with the low bits of the one threshold it may hold,
//!   so one table read and integer arithmetic finish the search (`packed.rs`): for CPUs, which
//!   read a large table one lane at a time from the data cache, where a read costs more than
//!   the arithmetic and a table of a few thousand words is cheap. With LLVM and AVX2, small
//!   tables take levels, whose tables are register permutes there.
//! * [`SearchStrategy::Levels`] (LLVM with AVX-512): the branchless binary search, one small
//!   table per level (`levels.rs`): 1, 2, 4, ... entries, which a backend holding tables in
//!   vector registers reads with one or a few permutes each, where the bucket tables (hundreds
//!   of entries) would cost tens. Independent level searches of a block are interleaved level
//!   by level (`interleave.rs`), so an out-of-order CPU has two chains in flight.
//!
//! All give exactly [`Op::SearchSorted`]'s count: the buckets are proven for every bucket when
//! they are built (a table the packed buckets cannot serve falls back to buckets, one the
//! buckets cannot serve to levels), the levels are the binary search itself. The pass keeps
//! every value's handle (the search's value is redefined as the last op of its replacement),
//! so the rest of the kernel is untouched.

mod buckets;
mod interleave;
mod levels;
mod packed;

use std::borrow::Cow;

use qforge_ir::{Kernel, KernelBuilder, Op, Stmt, TableId, Value};

use interleave::Item;

use crate::error::Result;

pub use buckets::BUCKET_COMPARES;

/// How [`search`] rewrites [`Op::SearchSorted`] (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchStrategy {
    /// Bucket table plus a fixed number of compares (levels when the table does not allow it).
    Buckets,
    /// One read of a packed bucket table (buckets when the table does not allow it); a table of
    /// at most `levels_up_to` counted (non-`+inf`) entries takes the level search instead, for a
    /// backend that reads small tables with register permutes (LLVM with AVX2: `vpermd`).
    Packed {
        /// Largest count of entries searched by levels.
        levels_up_to: usize,
    },
    /// Binary search with one table per level.
    Levels,
}

/// `kernel` with every [`Op::SearchSorted`] rewritten by `strategy` into lookups, compares and
/// integer arithmetic (borrowed unchanged when it has none). The tables the rewrite adds are
/// named after the searched table (`{name}_buckets`, `{name}_level{k}`, ...).
///
/// # Errors
/// [`crate::Error::Ir`] when the kernel does not verify (before or after the rewrite).
pub fn search(kernel: &Kernel, strategy: SearchStrategy) -> Result<Cow<'_, Kernel>> {
    if !has_search(kernel) {
        return Ok(Cow::Borrowed(kernel));
    }
    qforge_ir::verify(kernel)?;
    let out = rewrite(kernel, strategy)?;
    qforge_ir::verify(&out)?;
    Ok(out)
}

/// [`search`] on a kernel known to verify, without verifying (the compile pipeline verifies
/// once, and after each pass in debug builds).
pub(crate) fn rewrite(kernel: &Kernel, strategy: SearchStrategy) -> Result<Cow<'_, Kernel>> {
    if !has_search(kernel) {
        return Ok(Cow::Borrowed(kernel));
    }
    let (mut b, body) = KernelBuilder::edit(kernel.clone());
    let mut pass = Pass {
        strategy,
        declared: Vec::new(),
    };
    let body = pass.block(&mut b, body);
    let mut out = b.finish_with(body);
    drop_unread_tables(&mut out);
    Ok(Cow::Owned(out))
}

/// Whether `kernel` has a [`Op::SearchSorted`] to rewrite.
fn has_search(kernel: &Kernel) -> bool {
    kernel
        .values
        .iter()
        .any(|(_, d)| matches!(d.op, Op::SearchSorted { .. }))
}

/// The entries of the sorted `table` that can count: all but its trailing `+inf` entries (no
/// value is above `+inf`).
fn counted(table: &[f32]) -> &[f32] {
    &table[..table.partition_point(|x| *x < f32::INFINITY)]
}

/// `base`, or `base_2`, `base_3`, ... : the first name no parameter, table or variable of the
/// kernel has (names are unique among those), so a generated table never collides with the
/// user's.
fn fresh_name(b: &KernelBuilder, base: &str) -> String {
    let k = b.kernel();
    let taken = |n: &str| {
        k.params.iter().any(|(_, p)| p.name == n)
            || k.tables.iter().any(|(_, t)| t.name == n)
            || k.vars.iter().any(|(_, v)| v.name == n)
    };
    (1..)
        .map(|i| {
            if i == 1 {
                base.to_string()
            } else {
                format!("{base}_{i}")
            }
        })
        .find(|n| !taken(n))
        .unwrap_or_else(|| base.to_string())
}

/// Removes the tables no op reads any more (a searched table whose searches were all
/// rewritten into reads of its decomposition tables), renumbering the others in order, so that
/// backends neither emit nor pass them (a PTX module's constant bank holds only 64 KiB).
fn drop_unread_tables(k: &mut Kernel) {
    let mut read = vec![false; k.tables.len()];
    for (_, d) in k.values.iter() {
        if let Op::Lookup { table, .. } | Op::SearchSorted { table, .. } = d.op {
            if let Some(r) = read.get_mut(table.index()) {
                *r = true;
            }
        }
    }
    if read.iter().all(|r| *r) {
        return;
    }
    let mut renumber = vec![None; read.len()];
    let mut tables = qforge_ir::Arena::new();
    for (h, t) in k.tables.iter() {
        if read[h.index()] {
            renumber[h.index()] = Some(tables.append(t.clone()));
        }
    }
    k.tables = tables;
    let mut values = qforge_ir::Arena::new();
    for (_, d) in k.values.iter() {
        let mut d = d.clone();
        if let Op::Lookup { table, .. } | Op::SearchSorted { table, .. } = &mut d.op {
            if let Some(Some(n)) = renumber.get(table.index()) {
                *table = *n;
            }
        }
        values.append(d);
    }
    k.values = values;
}

/// The rewrite's state: the tables declared so far, so that searches of one table share them.
struct Pass {
    strategy: SearchStrategy,
    declared: Vec<(TableId, Declared)>,
}

/// The decomposition tables of one searched table.
#[derive(Clone)]
enum Declared {
    Buckets(buckets::BucketTables),
    Packed(packed::PackedTables),
    Levels(levels::LevelTables),
}

impl Pass {
    /// `stmts` with every search rewritten; the level searches of a block interleaved where
    /// they are independent (`interleave.rs`).
    fn block(&mut self, b: &mut KernelBuilder, stmts: Vec<Stmt>) -> Vec<Stmt> {
        let mut out = Vec::with_capacity(stmts.len());
        for stmt in stmts {
            let kept = match stmt {
                Stmt::Let(v) => match b.kernel().values.try_get(v).map(|d| d.op.clone()) {
                    Some(Op::SearchSorted { table, value }) => {
                        let levels = self.rewrite(b, v, table, value);
                        let lets = b.take_block();
                        if levels {
                            out.push(Item::Search(interleave::levels(b.kernel(), lets)));
                        } else {
                            out.extend(lets.into_iter().map(Item::Stmt));
                        }
                        continue;
                    }
                    _ => Stmt::Let(v),
                },
                Stmt::If {
                    cond,
                    then_body,
                    else_body,
                } => Stmt::If {
                    cond,
                    then_body: self.block(b, then_body),
                    else_body: self.block(b, else_body),
                },
                Stmt::For {
                    index,
                    start,
                    end,
                    step,
                    body,
                } => Stmt::For {
                    index,
                    start,
                    end,
                    step,
                    body: self.block(b, body),
                },
                Stmt::Accumulate {
                    index,
                    len,
                    order,
                    body,
                    accs,
                } => Stmt::Accumulate {
                    index,
                    len,
                    order,
                    body: self.block(b, body),
                    accs,
                },
                s @ (Stmt::Store { .. } | Stmt::Assign { .. }) => s,
            };
            out.push(Item::Stmt(kept));
        }
        interleave::schedule(b.kernel(), out)
    }

    /// Emits the replacement of `v = search_sorted table, value`, ending with `v`'s new
    /// definition; whether it is a level search.
    fn rewrite(&mut self, b: &mut KernelBuilder, v: Value, table: TableId, value: Value) -> bool {
        let declared = match self.declared.iter().find(|(t, _)| *t == table) {
            Some((_, d)) => d.clone(),
            None => {
                let t = &b.kernel().tables[table];
                let (name, data) = (t.name.clone(), t.data.clone());
                let sorted: Vec<f32> = data.iter().map(|x| f32::from_bits(*x)).collect();
                let strategy = match self.strategy {
                    SearchStrategy::Packed { levels_up_to }
                        if counted(&sorted).len() <= levels_up_to =>
                    {
                        SearchStrategy::Levels
                    }
                    s => s,
                };
                let packed = match strategy {
                    SearchStrategy::Packed { .. } => packed::Packed::new(&sorted),
                    SearchStrategy::Buckets | SearchStrategy::Levels => None,
                };
                let buckets = match strategy {
                    SearchStrategy::Buckets | SearchStrategy::Packed { .. } if packed.is_none() => {
                        buckets::Buckets::new(&sorted)
                    }
                    _ => None,
                };
                let d = if let Some(pk) = packed {
                    Declared::Packed(packed::declare(b, &name, &pk))
                } else if let Some(bk) = buckets {
                    Declared::Buckets(buckets::declare(b, &name, table, &bk))
                } else {
                    Declared::Levels(levels::declare(b, &name, &sorted))
                };
                self.declared.push((table, d.clone()));
                d
            }
        };
        let (last, levels) = match &declared {
            Declared::Buckets(t) => (buckets::emit(b, value, t), false),
            Declared::Packed(t) => (packed::emit(b, value, t), false),
            Declared::Levels(t) => (levels::emit(b, value, t), true),
        };
        b.define(v, last);
        levels
    }
}

/// The error of a backend handed an [`Op::SearchSorted`] that [`search`] did not rewrite (a
/// qforge bug: every backend runs the pass before lowering).
pub(crate) fn undecomposed(backend: &'static str) -> crate::Error {
    crate::Error::Unsupported {
        backend,
        op: "search_sorted (rewritten by qforge_codegen::decompose::search before lowering)".into(),
    }
}

#[cfg(test)]
mod tests;

//! Interleaving independent level searches, level by level.
//!
//! A level search ([`super::levels`]) is a chain: each level's lookup index is the previous
//! level's count, so one search keeps few instructions in flight and an out-of-order CPU waits on
//! the latency of every permute and compare. Two searches whose inputs do not depend on each other
//! (the 8-bit optimizers' `state1` and `state2` codes) can run side by side: this module emits
//! their levels alternately, level 0 of each, then level 1 of each, and so on. Only `let`s move,
//! and every `let` still comes after the `let`s of its operands, so every value keeps its bits
//! (the 8-bit AdamW step on `cpu-llvm`: 35.5 to 32.5 ms on one thread).
//!
//! A run of searches is gathered within one block: after a search, the `let`s that do not depend
//! on a search of the run move ahead of it (they are pure, and no store or assignment lies between
//! them), and the next search joins the run when its `let`s do not depend on the run either. Any
//! other statement, or a `let` that reads a search of the run, ends the run.

use std::collections::HashSet;

use qforge_ir::{Kernel, Op, Stmt, Value};

/// A block's statements as the pass builds them: statements to keep in place, or the `let`s of
/// one level search, split after each level's `select` (its count so far).
pub(super) enum Item {
    /// A statement kept as it is.
    Stmt(Stmt),
    /// A level search, one group of `let`s per level.
    Search(Vec<Vec<Stmt>>),
}

/// `lets` (a level search's statements, all `let`s) split after each `select`: one group per
/// level (every level of [`super::levels::emit`] ends with the `select` of its count).
pub(super) fn levels(k: &Kernel, lets: Vec<Stmt>) -> Vec<Vec<Stmt>> {
    let mut groups = vec![Vec::new()];
    for s in lets {
        let ends_level = matches!(s, Stmt::Let(v)
            if matches!(k.values.try_get(v).map(|d| &d.op), Some(Op::Select { .. })));
        if let Some(g) = groups.last_mut() {
            g.push(s);
        }
        if ends_level {
            groups.push(Vec::new());
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// The statements of `items` with each run of independent searches interleaved (see the module
/// docs).
pub(super) fn schedule(k: &Kernel, items: Vec<Item>) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut items = items.into_iter().peekable();
    while let Some(item) = items.next() {
        let first = match item {
            Item::Stmt(s) => {
                out.push(s);
                continue;
            }
            Item::Search(groups) => groups,
        };
        let mut defined = HashSet::new();
        record(&first, &mut defined);
        let mut run = vec![first];
        // `let`s between searches of the run, independent of it: they move ahead of the run.
        let mut ahead = Vec::new();
        // `let`s after the last search of the run that wait for a next one.
        let mut pending = Vec::new();
        while let Some(next) = items.peek() {
            match next {
                Item::Stmt(Stmt::Let(v)) if !reads(k, *v, &defined) => {
                    pending.push(Stmt::Let(*v));
                    items.next();
                }
                Item::Search(groups)
                    if groups.iter().flatten().all(|s| match s {
                        Stmt::Let(v) => !reads(k, *v, &defined),
                        _ => false,
                    }) =>
                {
                    if let Some(Item::Search(groups)) = items.next() {
                        record(&groups, &mut defined);
                        run.push(groups);
                        ahead.append(&mut pending);
                    }
                }
                _ => break,
            }
        }
        out.append(&mut ahead);
        let levels = run.iter().map(Vec::len).max().unwrap_or(0);
        let mut run: Vec<_> = run.into_iter().map(Vec::into_iter).collect();
        for _ in 0..levels {
            for search in &mut run {
                out.extend(search.next().into_iter().flatten());
            }
        }
        out.append(&mut pending);
    }
    out
}

/// Adds the values `groups` define to `defined`.
fn record(groups: &[Vec<Stmt>], defined: &mut HashSet<Value>) {
    for s in groups.iter().flatten() {
        if let Stmt::Let(v) = s {
            defined.insert(*v);
        }
    }
}

/// Whether the definition of `v` reads a value of `defined`.
fn reads(k: &Kernel, v: Value, defined: &HashSet<Value>) -> bool {
    k.values
        .try_get(v)
        .is_some_and(|d| d.op.operands().iter().any(|o| defined.contains(o)))
}

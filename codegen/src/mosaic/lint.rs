//! qforge's own lint of a Mosaic module, for what the `tpu` dialect's verifier does not check
//! (a module with these faults parses and verifies, and libtpu rejects it or, worse, reads
//! other memory): the iteration bounds' arity against the grid indices and the dimension
//! semantics; the number of windows against the memref operands; each window's bounds against
//! its memref and its array (the TPU's `(8, 128)` rule: the last two dimensions of a block are
//! multiples of the dtype's tiling or equal the array's); each index map's arity. It reads the
//! printed text, so it checks what is emitted, not what the printer meant.
//!
//! Every module [`super::lower_with`] returns has passed it; `tests.rs` breaks each rule once.

use super::Manifest;

/// The first fault of module `text` against its `manifest`, naming the rule, the window and
/// the numbers; `Ok` where there is none.
pub(super) fn lint(text: &str, manifest: &Manifest) -> Result<(), String> {
    let funcs: Vec<Func<'_>> = text.lines().filter_map(Func::parse).collect();
    let main = funcs
        .iter()
        .find(|f| f.attributes.is_some())
        .ok_or("no kernel function (a `func.func` with attributes)")?;
    let attrs = main.attributes.unwrap_or_default();
    let bounds = int_array(attrs, "iteration_bounds").ok_or("no iteration_bounds")?;
    let semantics = attrs.matches("#tpu.dimension_semantics<").count();
    let grid_params = main
        .params
        .iter()
        .take_while(|p| p.ends_with(": i32"))
        .count();
    let arity = bounds.len();
    if semantics != arity || grid_params != arity || manifest.grid.len() != arity {
        return Err(format!(
            "iteration-bound arity: {arity} iteration bounds, {semantics} dimension semantics, \
             {grid_params} grid index operands, a grid of {} in the manifest",
            manifest.grid.len()
        ));
    }
    if bounds
        .iter()
        .zip(&manifest.grid)
        .any(|(b, g)| *b != u64::from(*g))
    {
        return Err(format!(
            "iteration bounds {bounds:?} where the manifest's grid is {:?}",
            manifest.grid
        ));
    }
    let scratch = attr_int(attrs, "scratch_operands").unwrap_or(0) as usize;
    let memrefs: Vec<&str> = main.params[grid_params..].to_vec();
    let windows = window_params(attrs).ok_or("no window_params")?;
    let arrays: Vec<_> = manifest.inputs.iter().chain(&manifest.outputs).collect();
    if memrefs.len() < scratch
        || windows.len() != memrefs.len() - scratch
        || windows.len() != arrays.len()
    {
        return Err(format!(
            "window count: {} window_params for {} memref operands less {scratch} scratch \
             operands, {} arrays in the manifest",
            windows.len(),
            memrefs.len(),
            arrays.len()
        ));
    }
    for (i, ((map, block), (memref, array))) in
        windows.iter().zip(memrefs.iter().zip(&arrays)).enumerate()
    {
        let name = &array.param;
        let (dims, elt) = memref_type(memref)
            .ok_or_else(|| format!("window {i} ({name}): operand {memref:?} is not a memref"))?;
        if dims != *block {
            return Err(format!(
                "window bounds: window {i} ({name}) has bounds {block:?}, its memref {dims:?}"
            ));
        }
        let shape: Vec<u64> = array.shape.iter().map(|&d| u64::from(d)).collect();
        if shape.len() != block.len() {
            return Err(format!(
                "window bounds: window {i} ({name}) of rank {} over an array of rank {}",
                block.len(),
                shape.len()
            ));
        }
        let f = funcs
            .iter()
            .find(|f| f.name == *map)
            .ok_or_else(|| format!("window {i} ({name}): no index map @{map}"))?;
        if f.params.len() != arity || f.results != block.len() {
            return Err(format!(
                "index map arity: @{map} of window {i} ({name}) takes {} indices and returns \
                 {} (the grid has {arity}, the window rank {})",
                f.params.len(),
                f.results,
                block.len()
            ));
        }
        let rows = sublane_tiling(elt);
        let n = block.len();
        let (lanes_ok, rows_ok) = (
            block[n - 1] % 128 == 0 || block[n - 1] == shape[n - 1],
            n < 2 || block[n - 2] % rows == 0 || block[n - 2] == shape[n - 2],
        );
        if !lanes_ok || !rows_ok {
            return Err(format!(
                "tiling: window {i} ({name}, {elt}) has block {block:?} of array {shape:?}: its \
                 last dimension must be a multiple of 128 and its second-minor of {rows}, or \
                 equal the array's"
            ));
        }
    }
    Ok(())
}

/// A `func.func` line: its name, its operands (`%x: type`), its result count, and its
/// attributes where it has some (the kernel's).
struct Func<'t> {
    name: &'t str,
    params: Vec<&'t str>,
    results: usize,
    attributes: Option<&'t str>,
}

impl<'t> Func<'t> {
    fn parse(line: &'t str) -> Option<Self> {
        let rest = line.trim_start().strip_prefix("func.func @")?;
        let open = rest.find('(')?;
        let close = open + closing(&rest[open..])?;
        let params = split_top(&rest[open + 1..close]);
        let tail = &rest[close + 1..];
        let results = match tail.trim_start().strip_prefix("-> (") {
            Some(r) => split_top(&r[..closing(&format!("({r}"))? - 1]).len(),
            None => 0,
        };
        let attributes = tail
            .trim_start()
            .strip_prefix("attributes {")
            .map(|a| &a[..closing(&format!("{{{a}")).map_or(a.len(), |c| c - 1)]);
        Some(Func {
            name: &rest[..open],
            params,
            results,
            attributes,
        })
    }
}

/// The byte index in `s` of the bracket closing `s`'s first character.
fn closing(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' if !s[..i].ends_with('-') => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `s` split at the commas outside brackets, each piece trimmed (none for an empty `s`).
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' if !s[..i].ends_with('-') => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(s[start..].trim());
    }
    out
}

/// The values of attribute `key = array<i64: a, b, ...>`.
fn int_array(attrs: &str, key: &str) -> Option<Vec<u64>> {
    let at = attrs.find(&format!("{key} = array<i64:"))? + key.len() + " = array<i64:".len();
    let end = at + attrs[at..].find('>')?;
    attrs[at..end]
        .split(',')
        .map(|v| v.trim().parse().ok())
        .collect()
}

/// The value of attribute `key = N : i64`.
fn attr_int(attrs: &str, key: &str) -> Option<u64> {
    let at = attrs.find(&format!("{key} = "))? + key.len() + 3;
    attrs[at..].split(' ').next()?.parse().ok()
}

/// Each window's index map and bounds, from `window_params = [{...}, ...]`.
fn window_params(attrs: &str) -> Option<Vec<(String, Vec<u64>)>> {
    let at = attrs.find("window_params = [")? + "window_params = ".len();
    let end = at + closing(&attrs[at..])?;
    split_top(&attrs[at + 1..end])
        .into_iter()
        .map(|w| {
            let map = w.split("transform_indices = @").nth(1)?;
            let map: String = map
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            Some((map, int_array(w, "window_bounds")?))
        })
        .collect()
}

/// `memref<AxBx...xT, ...>`'s dimensions and element type, from an operand `%x: memref<...>`.
fn memref_type(operand: &str) -> Option<(Vec<u64>, &str)> {
    let ty = operand.split_once(": memref<")?.1;
    let shape = ty.split(',').next()?;
    let mut parts: Vec<&str> = shape.split('x').collect();
    let elt = parts.pop()?;
    let dims = parts
        .iter()
        .map(|d| d.parse().ok())
        .collect::<Option<_>>()?;
    Some((dims, elt))
}

/// Rows of the TPU's native tiling of an array of `elt`: 8 for 32-bit, 16 for 16-bit, 32 for
/// 8-bit elements.
fn sublane_tiling(elt: &str) -> u64 {
    match elt {
        "i8" | "ui8" => 32,
        "bf16" | "f16" | "i16" => 16,
        _ => 8,
    }
}

#[cfg(test)]
#[path = "lint_tests.rs"]
mod tests;

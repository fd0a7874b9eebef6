//! The text form of kernels: [`print()`] writes it, [`parse`] reads it back, and
//! `parse(&print(&k))` rebuilds `k` exactly (value numbering included) for every [`Kernel`], valid
//! or not. The form is meant to be read in snapshot diffs and written by hand in tests.
//!
//! ```text
//! kernel scale(x: f32[n] read, y: bf16[n] write, n: u32)
//! grid n
//! table codes: f32[2] = [
//!   0xbf800000, 0x3f800000  // -1.0, 1.0
//! ]
//! var acc: f32
//! {
//!   %0: u32 = work_item
//!   %1: f32 = load x[%0]
//!   %2: f32 = const 0x40000000  // 2.0
//!   %3: f32 = mul %1, %2
//!   store y[%0] = %3 rne
//!   %4: u32 = const 0
//!   %5: u32 = const 2
//!   for %6 in %4..%5 step 1 {
//!     %7: f32 = lookup codes[%6]
//!     assign acc = %7
//!   }
//! }
//! ```
//!
//! Grammar (whitespace and newlines are insignificant; `//` starts a comment to the end of the
//! line):
//!
//! ```text
//! kernel  := 'kernel' name '(' [param {',' param}] ')' 'grid' dim ['values' int]
//!            {table} {var} block ['unused' '{' {def} '}']
//! param   := name ':' stype                          scalar (f32, u32, i32; bool is rejected
//!                                                      by the verifier)
//!          | name ':' dtype '[' [dim {',' dim}] ']' access
//! dim     := int | ref                               ref names a u32 scalar parameter
//! table   := 'table' name ':' stype '[' int ']' '=' '[' [literal {',' literal}] ']'
//! var     := 'var' name ':' stype
//! block   := '{' {stmt} '}'
//! stmt    := def                                     Stmt::Let with the value's definition
//!          | 'let' value                              Stmt::Let of a value defined elsewhere
//!          | 'store' ref '[' value ']' '=' value [rounding]
//!          | 'assign' ref '=' value
//!          | 'if' value block ['else' block]
//!          | 'for' value 'in' value '..' value 'step' int block
//! def     := value ':' stype '=' op
//! op      := 'work_item' | 'loop_index' | 'param' ref | 'const' [stype] literal
//!          | 'read_var' ref | 'load' ref '[' value ']' | 'lookup' ref '[' value ']'
//!          | unary value | binary value ',' value | 'fma' value ',' value ',' value
//!          | 'cmp' cmpop value ',' value | 'select' value ',' value ',' value
//!          | 'float_to_int' stype rounding value | 'int_to_float' rounding value
//!          | 'bitcast' stype value
//!          | 'reduce' ('sum' | 'absmax' ('propagate' | 'ignore')) order
//!            ref '[' value ',' 'len' value ']'
//! order   := 'sequential' | 'strided' int
//! literal := '0x' hex (f32 bits) | ['-'] int (u32, i32) | 'true' | 'false'
//! value   := '%' digits           ref := name | '#' digits (raw arena index)
//! name    := identifier | '"' escaped string '"'
//! ```
//!
//! `unary`, `binary`, `cmpop`, `rounding`, `stype` (value types) and `dtype` (buffer element
//! types) are the `name()`s of [`crate::UnaryOp`], [`crate::BinaryOp`], [`crate::CmpOp`],
//! [`crate::Rounding`], [`crate::ScalarType`] and [`crate::DType`]; `access` is `read`, `write`
//! or `readwrite`. `docs/semantics.md` has the full grammar and the meaning of every op.
//!
//! Values are numbered by their index in the kernel's value arena, so the numbers need not
//! appear in order (a `for` index is created before its body's values). A `for` index whose
//! definition is the usual `u32 loop_index` is defined by its `for` header; values that no
//! statement defines are listed in the trailing `unused` section. The `values N` header appears
//! only when `N` cannot be inferred (a `for` names a value beyond the arena). Constants and table
//! elements of type `f32` are written as their bit pattern in hex (so `-0.0` and NaN payloads
//! survive), with the decimal value in a comment; `const` names its type only when it differs
//! from the value's. References to parameters, tables and variables use the name when it is
//! unique in its namespace and `#N` otherwise.

mod lexer;
mod parser;
mod printer;

use crate::error::Result;
use crate::kernel::Kernel;

/// Prints `kernel` in the text form. The output is deterministic (it is what
/// [`Kernel::content_hash`] hashes) and total: every kernel prints, including kernels the
/// verifier rejects.
pub fn print(kernel: &Kernel) -> String {
    printer::print(kernel)
}

/// Parses the text form produced by [`print()`] (or written by hand in the same grammar).
/// The result is not verified; run [`crate::verify()`] on it before use.
///
/// ```
/// use qforge_ir::text::{parse, print};
/// let text = "kernel k(n: u32, x: f32[n] write)\ngrid n\n{\n  %0: u32 = work_item\n  \
///             %1: f32 = const 0x80000000  // -0.0\n  store x[%0] = %1\n}\n";
/// let k = parse(text).unwrap();
/// qforge_ir::verify(&k).unwrap();
/// assert_eq!(print(&k), text);
/// ```
///
/// # Errors
/// [`crate::Error::Parse`] with the 1-based line and column of the offending token and a message
/// naming what was expected. Never panics, on any input.
pub fn parse(text: &str) -> Result<Kernel> {
    parser::parse(text).map(|(kernel, _)| kernel)
}

/// [`parse`], also returning the 1-based line of every statement by its verifier path
/// (`body[3]`, `body[3].then[0]`, `body[5].body[2]`: the locations [`crate::verify`] reports).
///
/// # Errors
/// As [`parse`].
pub fn parse_with_lines(text: &str) -> Result<(Kernel, std::collections::HashMap<String, usize>)> {
    parser::parse(text)
}

/// True for `[A-Za-z_][A-Za-z0-9_]*`: names printed without quotes.
fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

//! The parser of the text form (see the grammar in [`super`]). It rebuilds the kernel's arenas
//! exactly: parameters, tables and variables in declaration order, values by their `%N` number.

use std::collections::{HashMap, HashSet};

use super::lexer::{lex, Tok, Token};
use crate::error::{Error, Result};
use crate::handle::{Arena, Handle};
use crate::kernel::{Access, Dim, Kernel, Param, ParamKind, Table, Value, ValueDef, Var};
use crate::ops::Op;
use crate::types::{DType, Rounding, Scalar, ScalarType};

mod stmt;

/// Deepest nesting of `if`/`for` blocks accepted (keeps the recursion bounded on any input).
const MAX_DEPTH: usize = 256;

pub(super) fn parse(text: &str) -> Result<(Kernel, HashMap<String, usize>)> {
    let mut p = Parser {
        toks: lex(text),
        pos: 0,
        depth: 0,
        defs: HashMap::new(),
        for_indices: HashSet::new(),
        first_use: HashMap::new(),
        param_names: Vec::new(),
        table_names: Vec::new(),
        var_names: Vec::new(),
        stmt_lines: HashMap::new(),
    };
    let kernel = p.kernel()?;
    Ok((kernel, p.stmt_lines))
}

/// A reference to a parameter, table or variable before it is resolved.
enum Ref {
    Name(String, usize, usize),
    Index(u32),
}

/// A dim before its parameter name is resolved (dims may name later parameters).
enum RawDim {
    Const(u32),
    Ref(Ref),
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    depth: usize,
    /// Explicit definitions: value number to (definition, line, col).
    defs: HashMap<u32, (ValueDef, usize, usize)>,
    /// Values named by a `for` header.
    for_indices: HashSet<u32>,
    /// Where each value number first appears (for "never defined" errors).
    first_use: HashMap<u32, (usize, usize)>,
    param_names: Vec<String>,
    table_names: Vec<String>,
    var_names: Vec<String>,
    /// The 1-based line of each statement, by verifier path (`body[3].then[0]`).
    stmt_lines: HashMap<String, usize>,
}

impl Parser {
    // ----- token helpers -----

    fn peek(&self) -> &Token {
        // `lex` always ends with Eof or Bad, and `bump` never moves past the last token.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn error_at(line: usize, col: usize, message: impl Into<String>) -> Error {
        Error::Parse {
            line,
            col,
            message: message.into(),
        }
    }

    /// "expected X, found Y" at the next token (or the lexer's message for a bad token).
    fn expected(&self, what: &str) -> Error {
        let t = self.peek();
        let message = match &t.tok {
            Tok::Bad(m) => m.clone(),
            other => format!("expected {what}, found {}", other.describe()),
        };
        Self::error_at(t.line, t.col, message)
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(&self.peek().tok, Tok::Punct(q) if *q == p)
    }

    fn is_keyword(&self, kw: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(s) if s == kw)
    }

    fn punct(&mut self, p: &str, context: &str) -> Result<()> {
        if self.is_punct(p) {
            self.bump();
            Ok(())
        } else {
            Err(self.expected(&format!("'{p}' {context}")))
        }
    }

    fn keyword(&mut self, kw: &str, context: &str) -> Result<()> {
        if self.is_keyword(kw) {
            self.bump();
            Ok(())
        } else {
            Err(self.expected(&format!("'{kw}' {context}")))
        }
    }

    /// Any identifier (a keyword of the grammar at this position).
    fn word(&mut self, what: &str) -> Result<(String, usize, usize)> {
        match &self.peek().tok {
            Tok::Ident(s) => {
                let s = s.clone();
                let t = self.bump();
                Ok((s, t.line, t.col))
            }
            _ => Err(self.expected(what)),
        }
    }

    /// A declared name: an identifier or a quoted string.
    fn name(&mut self, what: &str) -> Result<String> {
        match &self.peek().tok {
            Tok::Ident(s) | Tok::Str(s) => {
                let s = s.clone();
                self.bump();
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn reference(&mut self, what: &str) -> Result<Ref> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Ident(s) | Tok::Str(s) => {
                self.bump();
                Ok(Ref::Name(s, t.line, t.col))
            }
            Tok::Index(n) => {
                self.bump();
                Ok(Ref::Index(n))
            }
            _ => Err(self.expected(&format!("{what} (a name or '#N')"))),
        }
    }

    fn resolve<T>(names: &[String], r: Ref, what: &str) -> Result<Handle<T>> {
        match r {
            Ref::Index(n) => Ok(Handle::from_index(n)),
            Ref::Name(name, line, col) => {
                let mut hits = names.iter().enumerate().filter(|(_, n)| **n == name);
                match (hits.next(), hits.next()) {
                    (Some((i, _)), None) => Ok(Handle::from_index(i as u32)),
                    (None, _) => Err(Self::error_at(
                        line,
                        col,
                        format!("unknown {what} '{name}'"),
                    )),
                    (Some(_), Some(_)) => Err(Self::error_at(
                        line,
                        col,
                        format!(
                            "{what} name '{name}' is declared more than once; refer to it as '#N'"
                        ),
                    )),
                }
            }
        }
    }

    fn value(&mut self, what: &str) -> Result<Value> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Value(n) => {
                self.bump();
                self.first_use.entry(n).or_insert((t.line, t.col));
                Ok(Handle::from_index(n))
            }
            _ => Err(self.expected(&format!("{what} (a value '%N')"))),
        }
    }

    fn number(&mut self, what: &str) -> Result<u64> {
        match self.peek().tok {
            Tok::Num { value, .. } => {
                self.bump();
                Ok(value)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn u32_number(&mut self, what: &str) -> Result<u32> {
        let t = self.peek().clone();
        let n = self.number(what)?;
        u32::try_from(n)
            .map_err(|_| Self::error_at(t.line, t.col, format!("{what}: {n} does not fit in u32")))
    }

    fn scalar_type(&mut self, what: &str) -> Result<ScalarType> {
        let (w, line, col) = self.word(&format!("{what} (f32, u32, i32 or bool)"))?;
        ScalarType::from_name(&w).ok_or_else(|| {
            Self::error_at(
                line,
                col,
                format!("expected {what} (f32, u32, i32 or bool), found '{w}'"),
            )
        })
    }

    fn rounding(&mut self) -> Result<Rounding> {
        let (w, line, col) = self.word("a rounding (rne, rtz, rdn or rup)")?;
        Rounding::from_name(&w).ok_or_else(|| {
            Self::error_at(
                line,
                col,
                format!("expected a rounding (rne, rtz, rdn or rup), found '{w}'"),
            )
        })
    }

    // ----- declarations -----

    fn kernel(&mut self) -> Result<Kernel> {
        self.keyword("kernel", "at the start of a kernel")?;
        let name = self.name("the kernel name")?;
        self.punct("(", "to open the parameter list")?;
        let mut raw_params = Vec::new();
        if !self.is_punct(")") {
            loop {
                raw_params.push(self.param()?);
                if self.is_punct(",") {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        self.punct(")", "or ',' in the parameter list")?;
        self.param_names = raw_params.iter().map(|(n, _)| n.clone()).collect();
        let mut params = Arena::new();
        for (name, kind) in raw_params {
            let kind = match kind {
                RawKind::Scalar(t) => ParamKind::Scalar(t),
                RawKind::Buffer(dtype, dims, access) => {
                    let mut shape = Vec::with_capacity(dims.len());
                    for d in dims {
                        shape.push(self.dim(d)?);
                    }
                    ParamKind::Buffer {
                        dtype,
                        shape,
                        access,
                    }
                }
            };
            params.append(Param { name, kind });
        }
        self.keyword("grid", "after the parameter list")?;
        let grid = self.raw_dim()?;
        let grid = self.dim(grid)?;
        let declared_len = if self.is_keyword("values") {
            self.bump();
            Some(self.number("the number of values")?)
        } else {
            None
        };
        let mut tables = Arena::new();
        while self.is_keyword("table") {
            let t = self.table()?;
            self.table_names.push(t.name.clone());
            tables.append(t);
        }
        let mut vars = Arena::new();
        while self.is_keyword("var") {
            self.bump();
            let name = self.name("a variable name")?;
            self.punct(":", "after the variable name")?;
            let ty = self.scalar_type("the variable type")?;
            self.var_names.push(name.clone());
            vars.append(Var { name, ty });
        }
        if !self.is_punct("{") {
            return Err(self.expected("'table', 'var' or '{' to open the kernel body"));
        }
        let body = self.block("body")?;
        if self.is_keyword("unused") {
            self.bump();
            self.punct("{", "after 'unused'")?;
            while !self.is_punct("}") {
                if !matches!(self.peek().tok, Tok::Value(_)) {
                    return Err(self.expected("a value definition '%N: type = op' or '}'"));
                }
                let _ = self.def()?;
            }
            self.bump();
        }
        if self.peek().tok != Tok::Eof {
            return Err(self.expected("end of input after the kernel body"));
        }
        let values = self.values(declared_len)?;
        Ok(Kernel {
            name,
            params,
            tables,
            vars,
            values,
            grid,
            body,
        })
    }

    fn param(&mut self) -> Result<(String, RawKind)> {
        let name = self.name("a parameter name")?;
        self.punct(":", "after the parameter name")?;
        let (w, line, col) = self.word("a parameter type")?;
        if !self.is_punct("[") {
            let ty = ScalarType::from_name(&w).ok_or_else(|| {
                Self::error_at(line, col, format!("expected a scalar type (f32, u32, i32 or bool) or a buffer type like 'f32[n]', found '{w}'"))
            })?;
            return Ok((name, RawKind::Scalar(ty)));
        }
        let dtype = DType::from_name(&w).ok_or_else(|| {
            Self::error_at(
                line,
                col,
                format!(
                    "expected a buffer dtype (f32, f16, bf16, u8, i8, i32 or u32), found '{w}'"
                ),
            )
        })?;
        self.bump();
        let mut dims = Vec::new();
        if !self.is_punct("]") {
            loop {
                dims.push(self.raw_dim()?);
                if self.is_punct(",") {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        self.punct("]", "or ',' in the buffer shape")?;
        let (w, line, col) = self.word("a buffer access (read, write or readwrite)")?;
        let access = match w.as_str() {
            "read" => Access::Read,
            "write" => Access::Write,
            "readwrite" => Access::ReadWrite,
            _ => {
                return Err(Self::error_at(
                    line,
                    col,
                    format!("expected a buffer access (read, write or readwrite), found '{w}'"),
                ))
            }
        };
        Ok((name, RawKind::Buffer(dtype, dims, access)))
    }

    fn raw_dim(&mut self) -> Result<RawDim> {
        if matches!(self.peek().tok, Tok::Num { .. }) {
            return Ok(RawDim::Const(self.u32_number("a dim")?));
        }
        Ok(RawDim::Ref(
            self.reference("a dim (a number or a u32 parameter)")?,
        ))
    }

    fn dim(&self, d: RawDim) -> Result<Dim> {
        match d {
            RawDim::Const(c) => Ok(Dim::Const(c)),
            RawDim::Ref(r) => Ok(Dim::Param(Self::resolve(
                &self.param_names,
                r,
                "parameter",
            )?)),
        }
    }

    fn table(&mut self) -> Result<Table> {
        self.bump();
        let name = self.name("a table name")?;
        self.punct(":", "after the table name")?;
        let ty = self.scalar_type("the table element type")?;
        self.punct("[", "before the table length")?;
        let len_tok = self.peek().clone();
        let len = self.number("the table length")?;
        self.punct("]", "after the table length")?;
        self.punct("=", "before the table elements")?;
        self.punct("[", "to open the table elements")?;
        let mut data = Vec::new();
        if !self.is_punct("]") {
            loop {
                data.push(self.table_element(ty)?);
                if self.is_punct(",") {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        self.punct("]", "or ',' in the table elements")?;
        if data.len() as u64 != len {
            return Err(Self::error_at(
                len_tok.line,
                len_tok.col,
                format!(
                    "table '{name}' declares {len} elements but lists {}",
                    data.len()
                ),
            ));
        }
        Ok(Table { name, ty, data })
    }

    /// A 32-bit pattern in hex (`f32` constants and `f32`/`bool` table elements).
    fn hex_bits(&mut self, what: &str) -> Result<u32> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Num { value, hex: true } => {
                self.bump();
                u32::try_from(value).map_err(|_| {
                    Self::error_at(
                        t.line,
                        t.col,
                        format!("{what}: 0x{value:x} has more than 32 bits"),
                    )
                })
            }
            _ => Err(self.expected(&format!(
                "{what}: an f32 bit pattern in hex like 0x3f800000"
            ))),
        }
    }

    /// A table element of type `ty`: integers as numbers, `f32` (and the invalid `bool`, which
    /// the verifier rejects but which still prints) as hex bits.
    fn table_element(&mut self, ty: ScalarType) -> Result<u32> {
        const WHAT: &str = "a table element";
        match ty {
            ScalarType::F32 | ScalarType::Bool => self.hex_bits(WHAT),
            ScalarType::U32 | ScalarType::I32 => Ok(self.literal(ty, WHAT)?.bits()),
        }
    }

    /// A constant of type `ty`: `f32` as hex bits, `u32` as a number, `i32` as an optionally
    /// negative decimal, `bool` as `true`/`false`.
    fn literal(&mut self, ty: ScalarType, what: &str) -> Result<Scalar> {
        let t = self.peek().clone();
        let err = |m: String| Self::error_at(t.line, t.col, m);
        match ty {
            ScalarType::F32 => Ok(Scalar::F32(self.hex_bits(what)?)),
            ScalarType::U32 => {
                let n = self.number(&format!("{what}: a u32 number"))?;
                let n = u32::try_from(n)
                    .map_err(|_| err(format!("{what}: {n} does not fit in u32")))?;
                Ok(Scalar::U32(n))
            }
            ScalarType::I32 => {
                let negative = self.is_punct("-");
                if negative {
                    self.bump();
                }
                let n = self.number(&format!("{what}: an i32 number"))? as i128;
                let v = if negative { -n } else { n };
                let v = i32::try_from(v)
                    .map_err(|_| err(format!("{what}: {v} does not fit in i32")))?;
                Ok(Scalar::I32(v))
            }
            ScalarType::Bool => match &t.tok {
                Tok::Ident(s) if s == "true" || s == "false" => {
                    self.bump();
                    Ok(Scalar::Bool(s == "true"))
                }
                _ => Err(self.expected(&format!("{what}: true or false"))),
            },
        }
    }

    /// Rebuilds the value arena from the explicit definitions and the `for` indices.
    fn values(&self, declared: Option<u64>) -> Result<Arena<ValueDef>> {
        let end = self.peek();
        let inferred = self
            .defs
            .keys()
            .chain(self.for_indices.iter())
            .map(|i| *i as u64 + 1)
            .max()
            .unwrap_or(0);
        let len = declared.unwrap_or(inferred);
        if let Some((i, (_, line, col))) = self
            .defs
            .iter()
            .filter(|(i, _)| **i as u64 >= len)
            .min_by_key(|(i, _)| **i)
        {
            return Err(Self::error_at(
                *line,
                *col,
                format!("value %{i} is defined but the kernel declares only {len} values"),
            ));
        }
        let mut arena = Arena::new();
        for i in 0..len {
            let Ok(i) = u32::try_from(i) else {
                return Err(Self::error_at(
                    end.line,
                    end.col,
                    format!("the kernel declares {len} values, more than fit in u32"),
                ));
            };
            let def = match self.defs.get(&i) {
                Some((def, _, _)) => def.clone(),
                None if self.for_indices.contains(&i) => ValueDef {
                    op: Op::LoopIndex,
                    ty: ScalarType::U32,
                },
                None => {
                    let (line, col) = self
                        .first_use
                        .get(&i)
                        .copied()
                        .unwrap_or((end.line, end.col));
                    return Err(Self::error_at(
                        line,
                        col,
                        format!("value %{i} is never defined (values are numbered 0..{len} without gaps)"),
                    ));
                }
            };
            arena.append(def);
        }
        Ok(arena)
    }
}

/// A parameter kind before its dims are resolved.
enum RawKind {
    Scalar(ScalarType),
    Buffer(DType, Vec<RawDim>, Access),
}

//! The tokenizer of the text form. It never fails: a malformed token becomes [`Tok::Bad`]
//! carrying the message, and the parser reports it when it reaches it (so errors come out in
//! text order).

/// One token.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_]*` (keywords are identifiers too; the parser decides).
    Ident(String),
    /// A quoted name, unescaped.
    Str(String),
    /// `%N`.
    Value(u32),
    /// `#N`.
    Index(u32),
    /// A decimal or `0x` hexadecimal number (at most `u64::MAX`).
    Num {
        /// The value.
        value: u64,
        /// Written in hex.
        hex: bool,
    },
    /// One of `( ) [ ] { } , : = - ..`.
    Punct(&'static str),
    /// End of input.
    Eof,
    /// A malformed token; the message says why.
    Bad(String),
}

/// A token and where it starts (1-based line and column, in characters).
#[derive(Clone, Debug)]
pub(super) struct Token {
    pub tok: Tok,
    pub line: usize,
    pub col: usize,
}

impl Tok {
    /// How the token is named in an error message.
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::Str(s) => format!("\"{}\"", s.escape_debug()),
            Tok::Value(n) => format!("'%{n}'"),
            Tok::Index(n) => format!("'#{n}'"),
            Tok::Num { value, hex: true } => format!("'0x{value:x}'"),
            Tok::Num { value, hex: false } => format!("'{value}'"),
            Tok::Punct(p) => format!("'{p}'"),
            Tok::Eof => "end of input".to_string(),
            Tok::Bad(m) => m.clone(),
        }
    }
}

struct Cursor<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    col: usize,
}

impl Cursor<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn digits(&mut self, radix: u32) -> Result<Option<u64>, String> {
        let mut value: Option<u64> = None;
        let mut overflow = false;
        while let Some(d) = self.peek().and_then(|c| c.to_digit(radix)) {
            self.bump();
            let next = value
                .unwrap_or(0)
                .checked_mul(radix as u64)
                .and_then(|v| v.checked_add(d as u64));
            match next {
                Some(n) => value = Some(n),
                None => overflow = true,
            }
        }
        if overflow {
            return Err("number is too large".to_string());
        }
        Ok(value)
    }
}

/// Splits `text` into tokens, ending with [`Tok::Eof`] or at the first [`Tok::Bad`].
pub(super) fn lex(text: &str) -> Vec<Token> {
    let mut c = Cursor {
        chars: text.chars().peekable(),
        line: 1,
        col: 1,
    };
    let mut out = Vec::new();
    loop {
        // Skip whitespace and comments.
        loop {
            match c.peek() {
                Some(ch) if ch.is_whitespace() => {
                    c.bump();
                }
                Some('/') => {
                    let (line, col) = (c.line, c.col);
                    c.bump();
                    if c.peek() == Some('/') {
                        while !matches!(c.peek(), None | Some('\n')) {
                            c.bump();
                        }
                    } else {
                        out.push(Token {
                            tok: Tok::Bad("unexpected '/' (comments start with '//')".into()),
                            line,
                            col,
                        });
                        return out;
                    }
                }
                _ => break,
            }
        }
        let (line, col) = (c.line, c.col);
        let Some(ch) = c.peek() else {
            out.push(Token {
                tok: Tok::Eof,
                line,
                col,
            });
            return out;
        };
        let tok = token(&mut c, ch);
        let bad = matches!(tok, Tok::Bad(_));
        out.push(Token { tok, line, col });
        if bad {
            return out;
        }
    }
}

fn token(c: &mut Cursor<'_>, ch: char) -> Tok {
    if ch.is_ascii_alphabetic() || ch == '_' {
        let mut s = String::new();
        while let Some(ch) = c
            .peek()
            .filter(|ch| ch.is_ascii_alphanumeric() || *ch == '_')
        {
            s.push(ch);
            c.bump();
        }
        return Tok::Ident(s);
    }
    if ch.is_ascii_digit() {
        if ch == '0' {
            c.bump();
            if c.peek() == Some('x') {
                c.bump();
                return match c.digits(16) {
                    Ok(Some(value)) => Tok::Num { value, hex: true },
                    Ok(None) => Tok::Bad("expected hex digits after '0x'".into()),
                    Err(m) => Tok::Bad(m),
                };
            }
            return match c.digits(10) {
                Ok(rest) => match rest {
                    // A leading zero followed by more digits is still a decimal number.
                    Some(value) => Tok::Num { value, hex: false },
                    None => Tok::Num {
                        value: 0,
                        hex: false,
                    },
                },
                Err(m) => Tok::Bad(m),
            };
        }
        return match c.digits(10) {
            Ok(Some(value)) => Tok::Num { value, hex: false },
            Ok(None) => Tok::Bad("expected a number".into()),
            Err(m) => Tok::Bad(m),
        };
    }
    match ch {
        '%' | '#' => {
            c.bump();
            let what = if ch == '%' { "value" } else { "index" };
            match c.digits(10) {
                Ok(Some(n)) => match u32::try_from(n) {
                    Ok(n) if ch == '%' => Tok::Value(n),
                    Ok(n) => Tok::Index(n),
                    Err(_) => Tok::Bad(format!("{what} number {n} does not fit in u32")),
                },
                Ok(None) => Tok::Bad(format!("expected digits after '{ch}'")),
                Err(_) => Tok::Bad(format!("{what} number does not fit in u32")),
            }
        }
        '"' => {
            c.bump();
            string(c)
        }
        '.' => {
            c.bump();
            if c.peek() == Some('.') {
                c.bump();
                Tok::Punct("..")
            } else {
                Tok::Bad("unexpected '.' (ranges are written '%a..%b')".into())
            }
        }
        '(' | ')' | '[' | ']' | '{' | '}' | ',' | ':' | '=' | '-' => {
            c.bump();
            Tok::Punct(match ch {
                '(' => "(",
                ')' => ")",
                '[' => "[",
                ']' => "]",
                '{' => "{",
                '}' => "}",
                ',' => ",",
                ':' => ":",
                '=' => "=",
                _ => "-",
            })
        }
        other => Tok::Bad(format!("unexpected character {other:?}")),
    }
}

/// The rest of a quoted name after the opening `"`.
fn string(c: &mut Cursor<'_>) -> Tok {
    let mut s = String::new();
    loop {
        match c.bump() {
            None => return Tok::Bad("unterminated quoted name".into()),
            Some('\n') => return Tok::Bad("newline inside a quoted name".into()),
            Some('"') => return Tok::Str(s),
            Some('\\') => match c.bump() {
                Some('\\') => s.push('\\'),
                Some('"') => s.push('"'),
                Some('n') => s.push('\n'),
                Some('t') => s.push('\t'),
                Some('r') => s.push('\r'),
                Some('0') => s.push('\0'),
                Some('u') => {
                    if c.bump() != Some('{') {
                        return Tok::Bad("expected '{' after '\\u'".into());
                    }
                    let code = match c.digits(16) {
                        Ok(Some(v)) => v,
                        Ok(None) => return Tok::Bad("expected hex digits in '\\u{...}'".into()),
                        Err(m) => return Tok::Bad(m),
                    };
                    if c.bump() != Some('}') {
                        return Tok::Bad("expected '}' to close '\\u{...}'".into());
                    }
                    match u32::try_from(code).ok().and_then(char::from_u32) {
                        Some(ch) => s.push(ch),
                        None => return Tok::Bad(format!("'\\u{{{code:x}}}' is not a character")),
                    }
                }
                Some(other) => {
                    return Tok::Bad(format!("unknown escape '\\{}'", other.escape_debug()))
                }
                None => return Tok::Bad("unterminated quoted name".into()),
            },
            Some(ch) => s.push(ch),
        }
    }
}

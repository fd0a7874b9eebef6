//! Python's `repr(float)` for the JSON that bitsandbytes writes (`nested_offset`), so the quant
//! state blob is byte-identical to what `QuantState.as_dict(packed=True)` produces.

/// Formats `v` as Python's `repr(float(v))`: the shortest round-trip digits, scientific notation
/// with a two-digit exponent when the exponent is below -4 or at least 16.
pub fn float_repr(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde±x".
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    if (-4..16).contains(&exp) {
        let s = format!("{v}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::float_repr;

    #[test]
    fn matches_python_repr() {
        // Expected strings are what CPython 3.11 prints for these values.
        assert_eq!(float_repr(2.6408636569976807), "2.6408636569976807");
        assert_eq!(float_repr(1.0), "1.0");
        assert_eq!(float_repr(1e-5), "1e-05");
        assert_eq!(float_repr(0.0001), "0.0001");
        assert_eq!(float_repr(1.5e16), "1.5e+16");
        assert_eq!(float_repr(123456789012345.0), "123456789012345.0");
        assert_eq!(float_repr(0.1f32 as f64), "0.10000000149011612");
        assert_eq!(float_repr(-3.25e-7), "-3.25e-07");
    }
}

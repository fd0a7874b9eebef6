//! Tests of the host-side ops on the interpreter device: round trips, the nested absmax path and
//! input validation. Bit-exact agreement with bitsandbytes is checked by `tests/golden.rs`.

use qforge_ir::DType;

use super::*;
use qforge_runtime::InterpreterDevice;

fn ramp(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1013) as f32 / 101.3 - 5.0)
        .collect()
}

fn invalid(r: Result<impl std::fmt::Debug>, needle: &str) {
    match r {
        Err(e @ Error::Invalid(_)) | Err(e @ Error::Ir(_)) => {
            let m = e.to_string();
            assert!(m.contains(needle), "message '{m}' lacks '{needle}'");
        }
        other => panic!("expected an error mentioning '{needle}', got {other:?}"),
    }
}

#[test]
fn ops_4bit_round_trip_is_close_and_nested_matches_plain_within_the_nested_error() {
    let dev = InterpreterDevice;
    let values = ramp(1001);
    for dtype in [DType::F32, DType::BF16] {
        let x = HostTensor::from_f32_as(dtype, vec![7, 143], &values).unwrap();
        let xs = x.to_f32().unwrap();
        for qt in [QuantType::Nf4, QuantType::Fp4] {
            let (packed, state) = quantize_4bit(&dev, &x, qt, 64, false).unwrap();
            assert_eq!(packed.len(), 501);
            let Absmax4::Plain(absmax) = &state.absmax else {
                panic!("plain absmax expected")
            };
            assert_eq!(absmax.len(), 16);
            let y = dequantize_4bit(&dev, &packed, &state).unwrap();
            assert_eq!((y.dtype, y.shape.clone()), (dtype, vec![7, 143]));
            let ys = y.to_f32().unwrap();
            for (i, (a, b)) in xs.iter().zip(&ys).enumerate() {
                // the coarsest gap of either table is 1/3 of the absmax
                assert!(
                    (a - b).abs() <= absmax[i / 64] / 6.0 + 1e-6,
                    "{qt} {dtype} element {i}: {a} vs {b}"
                );
            }
            let (packed2, nested_state) = quantize_4bit(&dev, &x, qt, 64, true).unwrap();
            assert_eq!(
                packed2, packed,
                "double quantization does not change the codes"
            );
            assert!(matches!(
                nested_state.absmax,
                Absmax4::Nested {
                    nested_blocksize: 256,
                    ..
                }
            ));
            let decoded = decompress_absmax(&dev, &nested_state.absmax).unwrap();
            assert_eq!(&decompress_absmax(&dev, &state.absmax).unwrap(), absmax);
            for (a, d) in absmax.iter().zip(&decoded) {
                assert!(
                    (a - d).abs() <= 0.01 * a.max(1.0),
                    "decoded absmax {d} vs {a}"
                );
            }
            let z = dequantize_4bit(&dev, &packed, &nested_state)
                .unwrap()
                .to_f32()
                .unwrap();
            let code = qt.dequant_table();
            for (i, zi) in z.iter().enumerate() {
                let c = if i % 2 == 0 {
                    packed[i / 2] >> 4
                } else {
                    packed[i / 2] & 15
                };
                let want =
                    HostTensor::from_f32_as(dtype, vec![1], &[code[c as usize] * decoded[i / 64]])
                        .unwrap();
                assert_eq!(
                    zi.to_bits(),
                    want.to_f32().unwrap()[0].to_bits(),
                    "nested element {i}"
                );
            }
        }
    }
}

#[test]
fn ops_blockwise_round_trip_and_offset() {
    let dev = InterpreterDevice;
    let values = ramp(700);
    let x = HostTensor::from_f32(vec![700], &values).unwrap();
    for map in [BlockwiseMap::Dynamic, BlockwiseMap::Linear] {
        let (q, absmax) = quantize_blockwise(&dev, &x, map, 256).unwrap();
        assert_eq!((q.len(), absmax.len()), (700, 3));
        let y = dequantize_blockwise(&dev, &q, &absmax, map, 256, DType::F32, &[700])
            .unwrap()
            .to_f32()
            .unwrap();
        for (i, (a, b)) in values.iter().zip(&y).enumerate() {
            assert!(
                (a - b).abs() <= absmax[i / 256] * 0.008,
                "{map} element {i}: {a} vs {b}"
            );
        }
    }
    let mean = absmax_mean(&dev, &[1.0, 2.0, 4.0]).unwrap();
    assert_eq!(mean, 7.0 / 3.0);
    let Absmax4::Nested {
        qabsmax,
        nested_absmax,
        offset,
        ..
    } = compress_absmax_with_offset(&dev, &[1.0, 2.0, 4.0], 2.0).unwrap()
    else {
        panic!("nested absmax expected")
    };
    assert_eq!(offset, 2.0);
    assert_eq!(nested_absmax, vec![2.0]);
    assert_eq!(qabsmax[1], 127, "absmax - offset = 0 is the exact code 0.0");
    assert_eq!(qabsmax[2], 255, "+1.0 after scaling is the top code");
}

#[test]
fn ops_validate_inputs() {
    let dev = InterpreterDevice;
    let empty = HostTensor::from_f32(vec![0, 4], &[]).unwrap();
    invalid(
        quantize_4bit(&dev, &empty, QuantType::Nf4, 64, false),
        "empty",
    );
    invalid(
        quantize_blockwise(&dev, &empty, BlockwiseMap::Dynamic, 256),
        "empty",
    );
    let ints = HostTensor::new(DType::I32, vec![2], vec![0; 8]).unwrap();
    invalid(quantize_4bit(&dev, &ints, QuantType::Nf4, 64, false), "i32");
    let x = HostTensor::from_f32(vec![10], &ramp(10)).unwrap();
    invalid(quantize_4bit(&dev, &x, QuantType::Nf4, 48, false), "48");
    invalid(
        quantize_blockwise(&dev, &x, BlockwiseMap::Dynamic, 32),
        "32",
    );
    let broken = HostTensor {
        dtype: DType::F32,
        shape: vec![10],
        data: vec![0; 12],
    };
    invalid(
        quantize_4bit(&dev, &broken, QuantType::Fp4, 64, false),
        "needs 40 bytes",
    );

    let (packed, state) = quantize_4bit(&dev, &x, QuantType::Nf4, 64, false).unwrap();
    invalid(
        dequantize_4bit(&dev, &packed[..4], &state),
        "packed has 4 elements, the quant state needs 5",
    );
    let mut bad = state.clone();
    bad.absmax = Absmax4::Plain(vec![1.0, 2.0]);
    invalid(
        dequantize_4bit(&dev, &packed, &bad),
        "absmax has 2 elements",
    );
    let mut bad = state.clone();
    bad.shape = vec![0];
    invalid(dequantize_4bit(&dev, &packed, &bad), "empty");
    let mut bad = state.clone();
    bad.dtype = DType::U8;
    invalid(dequantize_4bit(&dev, &packed, &bad), "u8");
    let (_, nested_state) = quantize_4bit(&dev, &x, QuantType::Nf4, 64, true).unwrap();
    let mut nested = nested_state.absmax.clone();
    if let Absmax4::Nested { nested_code, .. } = &mut nested {
        nested_code.pop();
    }
    let bad = QuantState4 {
        absmax: nested.clone(),
        ..nested_state.clone()
    };
    invalid(dequantize_4bit(&dev, &packed, &bad), "nested_code has 255");
    invalid(decompress_absmax(&dev, &nested), "signed dynamic map");
    let mut nested = nested_state.absmax.clone();
    if let Absmax4::Nested {
        nested_blocksize, ..
    } = &mut nested
    {
        *nested_blocksize = 128;
    }
    invalid(decompress_absmax(&dev, &nested), "blocksize 128");
    invalid(absmax_mean(&dev, &[]), "empty");

    let (q, absmax) = quantize_blockwise(&dev, &x, BlockwiseMap::Dynamic, 64).unwrap();
    invalid(
        dequantize_blockwise(
            &dev,
            &q,
            &absmax,
            BlockwiseMap::Dynamic,
            64,
            DType::F32,
            &[11],
        ),
        "q has 10 elements",
    );
    invalid(
        dequantize_blockwise(&dev, &q, &[], BlockwiseMap::Dynamic, 64, DType::F32, &[10]),
        "absmax has 0",
    );
    invalid(
        dequantize_blockwise(
            &dev,
            &q,
            &absmax,
            BlockwiseMap::Dynamic,
            64,
            DType::I8,
            &[10],
        ),
        "i8",
    );
}

#[test]
fn element_counts_stop_at_the_2_pow_31_boundary() {
    // The largest count keeps every u32 index a kernel forms below 2^32: the last block's end
    // (n + 4096) and a packed byte's second element (2 * i + 1).
    assert_eq!(
        count_u32("op", "x", MAX_ELEMENTS).unwrap(),
        (1u32 << 31) - 1
    );
    assert!(MAX_ELEMENTS as u64 + 4096 < 1u64 << 32);
    let err = count_u32("quantize_4bit", "the input", MAX_ELEMENTS + 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2147483648 elements") && err.contains("2^31 - 1"),
        "{err}"
    );
}

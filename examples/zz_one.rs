use qforge::ir::library::{OptimAlgo, OptimSpec, StateBits};
use qforge::ir::DType;
fn main() {
    let k = OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits8,
        dtype: DType::F32,
    }
    .build()
    .unwrap();
    let o = qforge::codegen::llvm::LlvmOptions {
        bounds_checks: false,
        lanes: 16,
        x86_avx512: true,
        x86_avx512_vbmi: true,
    };
    let t = qforge::codegen::llvm::lower(&k, &o).unwrap();
    std::fs::write(std::env::args().nth(1).unwrap(), t).unwrap();
}

//! insta snapshots of every library kernel: its IR text and its Cranelift IR, one file per
//! (kernel, backend) in `snapshots/`. Review changes in diffs; create new ones locally with
//! `INSTA_UPDATE=always cargo test --test snapshots` (CI never writes snapshots).

use qforge::codegen::cranelift::clif_text;
use qforge::ir::{library, text, verify};

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

#[test]
fn ir_text_and_clif_of_every_library_kernel() {
    settings().bind(|| {
        for entry in library::catalog() {
            let kernel = entry.build().expect("library kernels build");
            verify(&kernel).expect("library kernels verify");
            let ir = text::print(&kernel);
            assert_eq!(
                text::parse(&ir).expect("printed IR parses"),
                kernel,
                "{} does not round-trip",
                kernel.name
            );
            insta::assert_snapshot!(format!("{}.ir", kernel.name), ir);
            insta::assert_snapshot!(
                format!("{}.clif", kernel.name),
                clif_text(&kernel).expect("lowers to Cranelift")
            );
        }
    });
}

//! trybuild: each rejected construct and typed-argument mistake is a compile error at the
//! user's span that says what to write instead (`ui/fail/*.stderr`, reviewed); the pass case
//! builds and runs a kernel using every construct.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}

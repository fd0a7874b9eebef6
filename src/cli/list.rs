//! `qforge list-kernels`: the names of the library's kernels, in catalog order.

use qforge_kernels::FAMILIES;

/// One library kernel: its name and its family (the folder of `kernels/src/` that holds it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Kernel name (what `qforge compile --kernel` takes).
    pub name: String,
    /// Family name, e.g. `quant4`.
    pub family: &'static str,
}

/// The library's kernels in catalog order ([`qforge_kernels::catalog()`]), or those whose name
/// contains `filter`.
pub fn list(filter: Option<&str>) -> Vec<Listed> {
    FAMILIES
        .iter()
        .flat_map(|f| {
            (f.variants)().into_iter().map(move |s| Listed {
                name: s.name(),
                family: f.name,
            })
        })
        .filter(|l| filter.is_none_or(|f| l.name.contains(f)))
        .collect()
}

/// `qforge list-kernels --json`: a JSON array of `{"name": .., "family": ..}` objects.
pub fn to_json(listed: &[Listed]) -> String {
    let items: Vec<serde_json::Value> = listed
        .iter()
        .map(|l| serde_json::json!({ "name": l.name, "family": l.family }))
        .collect();
    serde_json::to_string_pretty(&items).unwrap_or_default()
}

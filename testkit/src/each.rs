//! Running one check on several devices side by side.

/// Runs `f` on every item of `items` at once, one scoped thread each, and returns the results
/// in `items`' order. A conformance check that compares devices one case at a time then keeps
/// every core busy: the StableHLO reference interpreter (a separate process, the slowest
/// device) runs beside the others instead of after them. A panic in `f` is re-raised here.
pub fn on_each<I: Sync, T: Send>(items: &[I], f: impl Fn(&I) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let running: Vec<_> = items.iter().map(|item| s.spawn(move || f(item))).collect();
        running
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::on_each;

    #[test]
    fn results_come_back_in_order_and_panics_are_raised() {
        let items: Vec<u64> = (0..6).collect();
        let out = on_each(&items, |i| {
            std::thread::sleep(std::time::Duration::from_millis(30 - 5 * i));
            i * i
        });
        assert_eq!(out, vec![0, 1, 4, 9, 16, 25]);
        let panicked = std::panic::catch_unwind(|| on_each(&items, |i| assert!(*i != 3, "item 3")));
        assert!(panicked.is_err());
    }
}

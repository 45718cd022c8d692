//! Model check (loom) of how the parts of a split request join: the very source of
//! `runtime/src/engine/part_results.rs`, compiled here against loom's mutex. Three parts
//! finish on three threads in every order (within 3 preemptions): exactly one of them
//! gets the results, all three and in part order, so the request is published once and
//! never before its last part; a part recorded twice changes nothing.

/// The primitives `part_results.rs` is written against.
mod sync {
    pub(crate) use loom::sync::Mutex;
}

#[path = "../../src/engine/part_results.rs"]
mod part_results;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use part_results::PartResults;

#[test]
fn exactly_one_part_gets_every_result_in_order() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let results = Arc::new(PartResults::new(3));
        let winners = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|index| {
                let (results, winners) = (Arc::clone(&results), Arc::clone(&winners));
                loom::thread::spawn(move || {
                    if let Some(all) = results.record(index, index * 10) {
                        assert_eq!(all, vec![0, 10, 20], "every result, in part order");
                        winners.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(winners.load(Ordering::SeqCst), 1, "published exactly once");
        assert_eq!(results.record(1, 99), None, "a part recorded again changes nothing");
    });
}

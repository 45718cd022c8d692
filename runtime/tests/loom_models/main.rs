//! Model checks (loom) of the lock-free hand-offs, each on the very source file of the
//! runtime (`#[path]`), compiled against loom's primitives: the submitter/arm-poller
//! hand-off, how an op ends, the prefetch gate, and the join of a split request's parts.

mod arm_handoff_model;
mod op_end_model;
mod op_gate_model;
mod part_results_model;

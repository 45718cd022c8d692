//! The `cpu` device (being written).

//! `flock-tests`: end-to-end tests of Flock, in `tests/e2e.rs` and its modules. They drive the
//! real `flock-supervisor`, `flockctl` and `flock-agent` binaries through `flock-testkit`; build
//! those first with `cargo build --workspace --bins`. This library is empty on purpose.

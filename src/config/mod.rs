//! proxy.yaml: loading, validation, environment expansion.

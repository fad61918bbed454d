//! The evaluator against LightGBM 4.7's own outputs (fixtures written by its Python package:
//! tests/fixtures/lgbm/gen_fixtures.py), and against malformed and mutated model files.
mod bad_input;
mod common;
mod fixtures;

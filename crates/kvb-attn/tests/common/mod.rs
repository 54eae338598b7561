//! Helpers shared by the test files.

pub mod paged_case;

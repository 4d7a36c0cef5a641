//! The group-commit writer (being written).

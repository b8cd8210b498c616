//! The hako command.

//! runed: hako's execution daemon and the container runner.
